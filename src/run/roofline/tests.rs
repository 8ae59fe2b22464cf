//! The roofline's cache, measurement and floors.
use super::*;
use crate::compute::DType;

fn roofline() -> Roofline {
    test_roofline()
}

fn linear(rows: u64, dtype: DType) -> Kernel {
    Kernel::Linear {
        rows,
        inner: 2048,
        outer: 8192,
        dtype,
    }
}

#[test]
fn a_decode_product_is_floored_by_its_weight_bytes_and_a_batch_by_its_flops() {
    let roofline = roofline();
    // One row: 2 FLOPs per weight; a bf16 weight is 2 bytes: memory-bound.
    let (seconds, memory) = roofline.kernel_floor(&linear(1, DType::Bf16));
    assert!(memory);
    assert!((seconds - 2048.0 * 8192.0 * 2.0 / 20e9).abs() < 1e-12);
    // FP8 weights read half the bytes of bf16: half the floor.
    let (fp8, _) = roofline.kernel_floor(&linear(1, DType::F8E4M3));
    assert!((fp8 * 2.0 - seconds).abs() < 1e-12);
    // 512 rows: 1024 FLOPs per 2-byte weight: FLOP-bound.
    let (seconds, memory) = roofline.kernel_floor(&linear(512, DType::Bf16));
    assert!(!memory);
    assert!((seconds - 2.0 * 512.0 * 2048.0 * 8192.0 / 100e9).abs() < 1e-9);
}

#[test]
fn a_step_floor_sums_its_kernels_and_says_what_sets_it() {
    let work = Work {
        kernels: vec![linear(1, DType::Bf16), linear(1, DType::Bf16)],
    };
    let floor = roofline().floor(&work);
    assert_eq!(floor.limited_by(), "memory bandwidth");
    assert!(
        (floor.seconds - 2.0 * roofline().kernel_floor(&linear(1, DType::Bf16)).0).abs() < 1e-12
    );
    let batch = Work {
        kernels: vec![linear(512, DType::F32)],
    };
    assert_eq!(roofline().floor(&batch).limited_by(), "FLOP/s");
}

#[test]
fn a_measurement_is_positive_and_cached_only_by_an_optimised_build() {
    let dir = tempfile::tempdir().expect("temp dir");
    let measured = Roofline::of_this_machine(dir.path()).roofline;
    assert!(measured.memory_bytes_per_second > 0.0 && measured.flops_per_second > 0.0);
    assert!(measured.bf16_flops_per_second > 0.0);
    let cached = dir.path().join(CACHED_ROOFLINE_FILE).exists();
    assert_eq!(cached, !cfg!(debug_assertions));
}

#[test]
fn an_unoptimised_measurement_is_kept_apart_and_never_taken_for_the_cache() {
    // Proves a debug build's figures serve the debug processes that follow (its
    // own file, this machine, within the hour) and never an optimised build.
    let dir = tempfile::tempdir().expect("temp dir");
    let unoptimised = Roofline {
        machine: Machine::this_one(),
        measured_at_unix: unix_now(),
        rounds: Rounds::UNOPTIMISED,
        ..roofline()
    };
    unoptimised
        .store_as(dir.path(), UNOPTIMISED_ROOFLINE_FILE)
        .expect("kept");
    assert_eq!(
        Roofline::kept_unoptimised(dir.path()),
        Some(unoptimised.clone())
    );
    assert_eq!(
        Roofline::cached(dir.path()),
        None,
        "not the optimised cache"
    );
    // Stored as the cache, its rounds still keep it out.
    unoptimised.store(dir.path()).expect("stored");
    assert_eq!(Roofline::cached(dir.path()), None, "too few rounds");
    let stale = Roofline {
        measured_at_unix: unix_now() - MAX_UNOPTIMISED_AGE_SECONDS - 1,
        ..unoptimised.clone()
    };
    stale
        .store_as(dir.path(), UNOPTIMISED_ROOFLINE_FILE)
        .expect("kept");
    assert_eq!(Roofline::kept_unoptimised(dir.path()), None, "an hour old");
    let elsewhere = Roofline {
        machine: Machine {
            cpu_model: "another CPU".to_string(),
            ..Machine::this_one()
        },
        ..unoptimised
    };
    elsewhere
        .store_as(dir.path(), UNOPTIMISED_ROOFLINE_FILE)
        .expect("kept");
    assert_eq!(Roofline::kept_unoptimised(dir.path()), None, "another CPU");
}

#[test]
fn a_cache_from_another_cpu_or_kernel_path_a_quick_measurement_or_last_month_is_measured_again() {
    let dir = tempfile::tempdir().expect("temp dir");
    let this_machine = Roofline {
        machine: Machine::this_one(),
        measured_at_unix: unix_now(),
        ..roofline()
    };
    this_machine.store(dir.path()).expect("stored");
    assert_eq!(Roofline::cached(dir.path()), Some(this_machine.clone()));
    let others = [
        Roofline {
            machine: Machine {
                cpu_model: "another CPU".to_string(),
                ..Machine::this_one()
            },
            ..this_machine.clone()
        },
        Roofline {
            machine: Machine {
                cpu_flags: "avx512f".to_string(),
                ..Machine::this_one()
            },
            ..this_machine.clone()
        },
        Roofline {
            machine: Machine {
                // Another path than this process's (a forced one included).
                kernel_path: match crate::device::cpu_compute::kernel_path() {
                    "portable" => "avx2".to_string(),
                    _ => "portable".to_string(),
                },
                ..Machine::this_one()
            },
            ..this_machine.clone()
        },
        Roofline {
            rounds: Rounds::UNOPTIMISED,
            ..this_machine.clone()
        },
        Roofline {
            measured_at_unix: this_machine.measured_at_unix - MAX_AGE_SECONDS - 1,
            ..this_machine.clone()
        },
    ];
    for other in others {
        other.store(dir.path()).expect("stored");
        assert_eq!(Roofline::cached(dir.path()), None, "{other:?}");
    }
}

#[test]
fn the_provenance_says_when_how_and_where_it_was_measured() {
    let measured = Roofline {
        measured_at_unix: 951_831_900,
        machine: Machine {
            host: 1,
            cpu_model: "AMD EPYC".to_string(),
            cpu_flags: "avx2 fma".to_string(),
            cores: 2,
            kernel_path: "avx2".to_string(),
        },
        ..roofline()
    };
    assert_eq!(
        measured.provenance(951_831_900 + 240),
        "measured 2000-02-29 13:45 UTC (4 min ago; best of 5 rounds of 0.25 s on AMD EPYC, 2 cores, avx2 fma, avx2 kernels)"
    );
}
