//! The shared-bus machine (the CPU backend): copies and compute that run at once share
//! the memory bus, so a step lands between the larger and the sum of its copy and
//! compute time, where independent engines give the larger.

use std::sync::Arc;
use std::time::Duration;

use stagehand::sim::{
    virtual_time_runtime, Demand, FaultPlan, HardwareProfile, SharedBus, SharedSpec, SimClock,
};
use stagehand::simulate::{run_policy, FitSettings, ModelDescription, Policy, RunOptions};
use stagehand::telemetry::Lane;

const MB: u64 = 1_000_000;

#[test]
fn operations_at_once_share_the_bus_and_one_alone_runs_at_its_solo_rate() {
    // Two 10 ms operations asking 20 GB/s each of a 30 GB/s bus progress at 3/4 speed:
    // both end at 13.333 ms. A third, alone afterwards, takes exactly its 10 ms.
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let spec = SharedSpec {
            cores: 2.0,
            memory_gb_per_s: 30.0,
        };
        let bus = SharedBus::new(spec, Arc::clone(&clock), None);
        let demand = Demand {
            threads: 1.0,
            memory_bytes_per_second: 20e9,
        };
        let solo = Duration::from_millis(10);
        let copy = bus.submit(Lane::Copy, solo, demand, "copy".into(), Some(1));
        let compute = bus.submit(Lane::Compute, solo, demand, "compute".into(), None);
        let (copy_end, compute_end) = tokio::join!(
            async {
                copy.await;
                clock.now()
            },
            async {
                compute.await;
                clock.now()
            }
        );
        let expected = 0.010 / 0.75;
        for end in [copy_end, compute_end] {
            assert!((end.as_secs_f64() - expected).abs() < 2e-9, "{end:?}");
        }
        let started = clock.now();
        bus.submit(Lane::Copy, solo, demand, "alone".into(), Some(1))
            .await;
        let alone = clock.now() - started;
        assert!((alone.as_secs_f64() - 0.010).abs() < 2e-9, "{alone:?}");
    });
}

/// 8 blocks of 10 MB on a 1 GB/s link (10 ms a copy) and 10 ms of compute each.
#[test]
fn an_operation_alone_is_never_slowed_by_its_own_threads_and_a_split_one_waits_for_its_slowest() {
    // Proves a split operation is never slowed by its own threads: a read timed on
    // four reader threads over two cores runs at its solo rate alone. Beside a
    // one-thread compute, five threads share two cores: the read (threads that all
    // must finish) goes at the pace of its slowest, three to a core where alone it had
    // two: 2/3; the compute shares the cores with two of the read's threads (the
    // others wait behind their siblings): 2/3 of a core. Two four-thread reads share
    // the cores evenly. A two-thread product beside a copy thread gets half its speed
    // (one of its threads shares a core).
    let spec = SharedSpec {
        cores: 2.0,
        memory_gb_per_s: 100.0,
    };
    let read = Demand {
        threads: 4.0,
        memory_bytes_per_second: 1e9,
    };
    let compute = Demand {
        threads: 1.0,
        memory_bytes_per_second: 1e9,
    };
    assert_eq!(spec.shares(&[read]), [1.0]);
    let shared = spec.shares(&[read, compute]);
    assert!((shared[0] - 2.0 / 3.0).abs() < 1e-12, "{shared:?}");
    assert!((shared[1] - 2.0 / 3.0).abs() < 1e-12, "{shared:?}");
    let shared = spec.shares(&[read, read]);
    assert!((shared[0] - 0.5).abs() < 1e-12, "{shared:?}");
    assert!((shared[1] - 0.5).abs() < 1e-12, "{shared:?}");
    let product = Demand {
        threads: 2.0,
        ..compute
    };
    let shared = spec.shares(&[product, compute]);
    assert!((shared[0] - 0.5).abs() < 1e-12, "{shared:?}");
}

fn toy(shared: bool) -> (ModelDescription, HardwareProfile) {
    let model = ModelDescription::parse(
        "toy",
        "test",
        "dtype = \"f32\"\ntokens_per_step = 1\nblock_count = 8\nbytes_per_block = 10000000\nflops_per_token_per_block = 1e9\n",
    )
    .unwrap();
    let mut text = String::from(
        "[gpu]\nname = \"toy\"\nvram = \"1 GB\"\npcie_generation = 0\nbf16_dense_tflops = 0.1\nsustained_efficiency = 1.0\nmemory_gb_per_s = 100\n[host]\nram = \"8 GB\"\n[link]\npinned_gb_per_s = 1.0\npageable_gb_per_s = 1.0\nlatency_us = 0\n[disk]\nread_gb_per_s = 100\nrequest_latency_us = 0\n",
    );
    if shared {
        // The copy asks 2 GB/s (a read and a write), the compute 1 GB/s of weights.
        text.push_str("[shared]\ncores = 2\nmemory_gb_per_s = 2.0\n");
    }
    let hardware = HardwareProfile::parse("toy", "test", &text).unwrap();
    (model, hardware)
}

fn steady_step_seconds(shared: bool) -> f64 {
    let (model, hardware) = toy(shared);
    let options = RunOptions {
        steps: 6,
        vram_budget_bytes: 40 * MB,
        pin_ceiling_bytes: 200 * MB,
        settings: FitSettings::default(),
        faults: FaultPlan::default(),
        trace: None,
        max_reads_in_flight: 2,
        virtual_time_limit: None,
    };
    run_policy(&model, &hardware, Policy::Stagehand, &options)
        .unwrap()
        .steady_step_seconds
}

#[test]
fn a_shared_bus_step_lies_between_the_larger_and_the_sum_of_copy_and_compute() {
    // Independent engines overlap the streamed blocks' copies with compute; on the
    // shared bus the overlapped parts slow each other, so the step grows, yet stays
    // below doing them one after another.
    let independent = steady_step_seconds(false);
    let shared = steady_step_seconds(true);
    let compute = 8.0 * 0.010;
    let streamed_copies = 0.010 * 8.0;
    assert!(independent >= compute - 1e-9, "{independent}");
    assert!(shared > independent * 1.05, "{shared} vs {independent}");
    assert!(shared < compute + streamed_copies, "{shared}");
}
