//! `stagehand calibrate` and `--hardware local`: the profile it writes loads back with
//! the figures it measured, a cached profile is reused only while it is fresh and
//! well-formed, and a measurement the filesystem refuses is skipped by name.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use stagehand::calibrate::{
    calibrate, local_profile_with, profile_toml, CalibrateError, CalibrateOptions, Calibration,
    ContentionFigures, CopyFigures, DiskFigures, HostIdentity, KernelFigures, Measured, OverlapRun,
    Part, MAX_AGE_SECONDS,
};
use stagehand::compute::work::ElementOp;
use stagehand::sim::{Demand, HardwareProfile, KernelCosts, LinearRates, ReadPath, ThreadScaling};

fn measured(per_second: f64) -> Measured {
    Measured::rate(per_second, &[1.0, 1.0, 1.0], "three samples".to_string())
}

/// A calibration with known figures, stamped now on this machine.
fn known_calibration(at_unix: u64) -> Calibration {
    Calibration {
        host: HostIdentity::current(),
        backend: "cpu".to_string(),
        device_name: "cpu".to_string(),
        device_bytes: HostIdentity::current().ram_bytes,
        calibrated_at_unix: at_unix,
        load_average_before: Some(0.5),
        load_average_after: None,
        copies: Some(CopyFigures {
            pinned: measured(11.0e9),
            pageable: measured(9.5e9),
            latency_seconds: 5e-6,
            latency_how: "probes".to_string(),
            first_touch: Some(measured(2.5e9)),
        }),
        disk: Some(DiskFigures {
            path: "/tmp/x".to_string(),
            buffered_cold: Some(measured(1.5e9)),
            page_cache: Some(measured(5.5e9)),
            direct: Some(measured(1.1e9)),
            request_latency_seconds: Some(70e-6),
            request_latency_how: "probes".to_string(),
            skipped: Vec::new(),
            notes: Vec::new(),
        }),
        kernels: Some(KernelFigures {
            costs: KernelCosts {
                call_overhead_us: 0.5,
                attention_ns_per_score_dim: 0.25,
                attention_ns_per_query_head: 90.0,
                cached_attention_ns_per_score_dim: 1.25,
                elementwise_ns: BTreeMap::from([(ElementOp::RmsNorm, 0.75)]),
                linear: vec![LinearRates {
                    dtype: "f32".to_string(),
                    inner: 1024,
                    outer: 1024,
                    rows: vec![1, 8, 64],
                    gflops: vec![4.0, 16.0, 64.0],
                    cold_gflops: Some(vec![3.0, 12.0, 60.0]),
                }],
                threads: Some(ThreadScaling {
                    timed_on: 1,
                    all_cores: 2,
                    all_cores_speedup: 1.75,
                }),
            },
            how: "synthetic".to_string(),
        }),
        contention: Some(ContentionFigures {
            cores: 2,
            memcpy_one_thread_bytes_per_second: 9e9,
            memcpy_all_cores_bytes_per_second: 10e9,
            overlaps: Vec::new(),
            how: "synthetic".to_string(),
        }),
        skipped: Vec::new(),
    }
}

fn now() -> u64 {
    stagehand::calibrate::unix_now()
}

#[test]
fn a_calibrated_profile_loads_back_with_the_figures_it_measured() {
    // The writer and the loader agree: every measured figure survives the TOML.
    let calibration = known_calibration(now());
    let text = profile_toml(&calibration, "local").unwrap();
    let profile = HardwareProfile::parse("local", "test", &text).unwrap();
    assert_eq!(profile.link.pinned_gb_per_s, 11.0);
    assert_eq!(profile.link.pageable_gb_per_s, 9.5);
    assert_eq!(profile.link.latency_us, 5.0);
    assert_eq!(profile.first_touch_gb_per_s, Some(2.5));
    assert_eq!(profile.disk.read_gb_per_s, 1.5);
    assert_eq!(profile.disk.request_latency_us, 70.0);
    assert_eq!(
        profile.clone().reading(ReadPath::Direct).disk.read_gb_per_s,
        1.1
    );
    assert_eq!(
        profile
            .clone()
            .reading(ReadPath::PageCache)
            .disk
            .read_gb_per_s,
        5.5
    );
    let shared = profile.shared.as_ref().expect("a [shared] table");
    assert_eq!((shared.cores, shared.memory_gb_per_s), (2.0, 20.0));
    assert_eq!(
        profile.compute.as_ref(),
        calibration.kernels.as_ref().map(|kernels| &kernels.costs)
    );
    let stamp = profile.calibration.as_ref().expect("a [calibration] stamp");
    assert_eq!(stamp.host, HostIdentity::current().fingerprint());
    assert_eq!(profile.ram_bytes, HostIdentity::current().ram_bytes.max(1));
}

#[test]
fn the_shared_bus_is_fitted_to_the_measured_gemv_and_copy_pair() {
    // A one-row GEMM (4 MiB weight) 0.2 ms alone, 0.3 ms beside copies; copies 12 GB/s
    // alone, 8 GB/s beside it: both slowed × 1.5. The bus is the traffic they made
    // together, and the model run on the pair's solo demands gives back × 1.5 for both.
    let weight = 4u64 << 20;
    let pair = OverlapRun {
        rows: 1,
        gemm_weight_bytes: weight,
        gemm_alone_seconds: 0.2e-3,
        gemm_shared_seconds: 0.3e-3,
        copy_alone_bytes_per_second: 12e9,
        copy_shared_bytes_per_second: 8e9,
    };
    let mut calibration = known_calibration(now());
    let contention = calibration.contention.as_mut().expect("contention figures");
    contention.overlaps = vec![pair.clone()];
    let text = profile_toml(&calibration, "local").unwrap();
    let profile = HardwareProfile::parse("local", "test", &text).unwrap();
    let shared = profile.shared.expect("a [shared] table");
    let together = weight as f64 / 0.3e-3 + 2.0 * 8e9;
    assert!((shared.memory_gb_per_s - together / 1e9).abs() < 1e-9 * together);
    let demands = [
        Demand {
            threads: 1.0,
            memory_bytes_per_second: weight as f64 / 0.2e-3,
        },
        Demand {
            threads: 1.0,
            memory_bytes_per_second: 2.0 * 12e9,
        },
    ];
    for share in shared.shares(&demands) {
        assert!((1.0 / share - 1.5).abs() < 1e-6, "slowdown {}", 1.0 / share);
    }
    // Without a one-row pair (an older calibration) the bus is memcpy's on every core.
    let older = known_calibration(now());
    let text = profile_toml(&older, "local").unwrap();
    let shared = HardwareProfile::parse("local", "test", &text)
        .unwrap()
        .shared
        .expect("a [shared] table");
    assert_eq!(shared.memory_gb_per_s, 20.0);
}

#[test]
fn a_profile_without_a_first_touch_rate_loads_and_a_bad_one_is_named() {
    // The key is optional (older calibrations and GPU profiles have none); a
    // non-positive rate is refused with the key named.
    let mut calibration = known_calibration(now());
    if let Some(copies) = calibration.copies.as_mut() {
        copies.first_touch = None;
    }
    let text = profile_toml(&calibration, "local").unwrap();
    let profile = HardwareProfile::parse("local", "test", &text).unwrap();
    assert_eq!(profile.first_touch_gb_per_s, None);
    let bad = text.replace("\nram = ", "\nfirst_touch_gb_per_s = 0.0\nram = ");
    let message = HardwareProfile::parse("local", "test", &bad)
        .unwrap_err()
        .to_string();
    assert!(message.contains("host.first_touch_gb_per_s"), "{message}");
}

fn canned(at_unix: u64) -> impl FnMut() -> Result<String, CalibrateError> {
    move || profile_toml(&known_calibration(at_unix), "local").map_err(CalibrateError::Profile)
}

#[test]
fn a_malformed_cached_profile_is_measured_again_and_a_fresh_one_reused() {
    // Garbage in the cache: recalibrated (said so), written back, then reused.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hardware-local.toml");
    std::fs::write(&path, "[gpu]\nthis is not a profile").unwrap();
    let mut calls = 0;
    let mut measure = canned(now());
    let mut counted = || {
        calls += 1;
        measure()
    };
    let local = local_profile_with(&path, now(), &mut counted).unwrap();
    assert!(!local.reused);
    assert!(local.note.contains("malformed"), "{}", local.note);
    assert_eq!(local.note.lines().count(), 1, "{}", local.note);
    let again = local_profile_with(&path, now(), &mut counted).unwrap();
    assert!(again.reused, "{}", again.note);
    assert!(
        again.note.contains("using the profile cached"),
        "{}",
        again.note
    );
    assert_eq!(calls, 1);
    assert_eq!(again.profile, local.profile);
}

#[test]
fn a_stale_or_foreign_cached_profile_is_measured_again() {
    // Older than the limit, measured by an older method, or stamped by another host:
    // recalibrated, saying why.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hardware-local.toml");
    let old = now() - MAX_AGE_SECONDS - 60;
    std::fs::write(
        &path,
        profile_toml(&known_calibration(old), "local").unwrap(),
    )
    .unwrap();
    let local = local_profile_with(&path, now(), &mut canned(now())).unwrap();
    assert!(
        !local.reused && local.note.contains("stale"),
        "{}",
        local.note
    );

    // Written by an older calibration (no method number): measured again.
    let current = profile_toml(&known_calibration(now()), "local").unwrap();
    let older: String = current
        .lines()
        .filter(|line| !line.starts_with("method = "))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_ne!(older, current);
    std::fs::write(&path, older).unwrap();
    let local = local_profile_with(&path, now(), &mut canned(now())).unwrap();
    assert!(
        !local.reused && local.note.contains("older calibration (method 0"),
        "{}",
        local.note
    );

    let mut foreign = known_calibration(now());
    foreign.host.hostname = "another-box".to_string();
    std::fs::write(&path, profile_toml(&foreign, "local").unwrap()).unwrap();
    let local = local_profile_with(&path, now(), &mut canned(now())).unwrap();
    assert!(
        !local.reused && local.note.contains("another machine"),
        "{}",
        local.note
    );
}

fn copy_and_disk(dir: &Path) -> CalibrateOptions {
    let mut options = CalibrateOptions::quick(dir.to_path_buf());
    options.parts = vec![Part::Copy, Part::Disk];
    options.disk.bytes = 8 << 20;
    options.disk.read_bytes = 4 << 20;
    options.copy_block_bytes = 4 << 20;
    options.copy_repeats = 3;
    options
}

#[test]
fn a_directory_it_cannot_write_skips_the_disk_by_name_and_measures_the_rest() {
    // The scratch file cannot be made: every disk measurement is skipped with the
    // reason, the copies are still measured (exit 0 with the rest).
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir");
    let calibration = calibrate(&copy_and_disk(&missing), &mut |_| {}).unwrap();
    assert!(calibration.copies.is_some());
    let skipped: Vec<&str> = calibration
        .skipped
        .iter()
        .map(|skipped| skipped.measurement.as_str())
        .collect();
    assert!(skipped.contains(&"disk.buffered_cold"), "{skipped:?}");
    assert!(
        calibration.skipped[0].reason.contains("no-such-dir"),
        "{:?}",
        calibration.skipped
    );
    // Only the disk asked for, and it cannot be measured: nothing measured at all.
    let mut disk_only = copy_and_disk(&missing);
    disk_only.parts = vec![Part::Disk];
    let error = calibrate(&disk_only, &mut |_| {}).unwrap_err();
    assert!(matches!(error, CalibrateError::NothingMeasured(_)));
    assert!(error.to_string().contains("disk.buffered_cold"), "{error}");
}

#[test]
fn copies_and_reads_on_a_writable_directory_are_measured() {
    // A real (small) calibration: copies and buffered reads come back as rates.
    let dir = tempfile::tempdir().unwrap();
    let calibration = calibrate(&copy_and_disk(dir.path()), &mut |_| {}).unwrap();
    let copies = calibration.copies.expect("copies measured");
    assert!(copies.pinned.per_second > 0.0 && copies.pageable.per_second > 0.0);
    let disk = calibration.disk.expect("disk measured");
    assert!(disk.buffered_cold.is_some(), "{:?}", disk.skipped);
    // The scratch file is removed afterwards.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn a_missing_scratch_folder_exits_2_naming_the_flag() {
    // Only the disk asked for, on a directory that does not exist: exit 2 before
    // anything is measured, the one line naming the flag and what to give. (The
    // library's "nothing could be measured" naming each skipped measurement is the
    // test above.)
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let output = common::stagehand()
        .args(["calibrate", "--measure", "disk", "--dir"])
        .arg(&missing)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    let last = stderr.trim_end().lines().last().unwrap_or_default();
    assert!(
        last.contains("--dir") && last.contains("not a folder"),
        "{stderr}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
