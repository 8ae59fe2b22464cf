//! The simulator's disk adapter on virtual time: reads queue and pay latency only when
//! they jump, bad reads are refused, and seeded faults (jitter, slow reads, an injected
//! failure) are deterministic.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::sim::{device, extent, nvme, GB, READ_LATENCY};
use stagehand::actors::{BlockLayout, Device, Extent, FileId, HostBuffer, ModelLayout, Storage};
use stagehand::sim::{virtual_time_runtime, FaultPlan, SimClock};
use stagehand::telemetry::TraceRecorder;

#[test]
fn reads_queue_on_the_disk_and_pay_latency_only_when_they_jump() {
    // Proves reads queue on one disk and a sequential read pays no request latency, a jump
    // back does.
    let runtime = virtual_time_runtime().unwrap();
    let ends = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let storage = Arc::new(nvme(&clock, &FaultPlan::default()));
        let mut tasks = Vec::new();
        // 7 GB front to back in two reads, then a jump back to the start.
        for (offset, length) in [
            (0, 3_500_000_000),
            (3_500_000_000, 3_500_000_000),
            (0, 7 * GB),
        ] {
            let storage = Arc::clone(&storage);
            let clock = Arc::clone(&clock);
            let buffer = HostBuffer::virtual_buffer(length as usize);
            tasks.push(tokio::spawn(async move {
                storage
                    .read(vec![extent(offset, length)], buffer, 0)
                    .await
                    .unwrap();
                clock.now()
            }));
        }
        let mut ends = Vec::new();
        for task in tasks {
            ends.push(task.await.unwrap());
        }
        ends
    });
    let half = Duration::from_millis(500);
    assert_eq!(
        ends,
        [
            READ_LATENCY + half,
            READ_LATENCY + 2 * half,
            2 * READ_LATENCY + 4 * half
        ]
    );
}

#[test]
fn a_read_larger_than_its_buffer_is_refused() {
    // Proves a read that does not fit its buffer is refused and the buffer handed back.
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let storage = nvme(&clock, &FaultPlan::default());
        let buffer = HostBuffer::virtual_buffer(100);
        let (error, buffer) = storage
            .read(vec![extent(0, 80)], buffer, 40)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("does not fit"), "{error}");
        assert_eq!(buffer.len(), 100);
    });
}

#[test]
fn a_read_outside_the_models_files_is_an_error() {
    // Proves reads past a file's end or of an unknown file are errors once the layout is
    // known.
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let layout = ModelLayout {
            blocks: vec![BlockLayout::new("layer.0", vec![extent(0, 1000)])],
        };
        let storage = nvme(&clock, &FaultPlan::default()).with_layout(&layout);
        let buffer = HostBuffer::virtual_buffer(2000);
        let (error, buffer) = storage
            .read(vec![extent(500, 1000)], buffer, 0)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("past the end"), "{error}");
        let other_file = Extent {
            file: FileId(7),
            offset: 0,
            length: 10,
        };
        let (error, _) = storage.read(vec![other_file], buffer, 0).await.unwrap_err();
        assert!(error.to_string().contains("unknown file"), "{error}");
    });
}

/// End times of 50 reads of 100 MB and 50 copies, one after another, under `faults`,
/// and the Chrome trace of the run.
fn perturbed_timeline(faults: &FaultPlan) -> (Vec<Duration>, String) {
    let runtime = virtual_time_runtime().unwrap();
    let trace = Arc::new(TraceRecorder::new());
    let ends = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let storage = nvme(&clock, faults).with_trace(Arc::clone(&trace));
        let device = device(&clock, faults).with_trace(Arc::clone(&trace));
        let arena = device.allocate_arena(100_000_000).unwrap();
        let mut buffer = device.allocate_pinned(100_000_000).unwrap();
        let mut ends = Vec::new();
        for index in 0..50 {
            buffer = match storage
                .read(vec![extent(index * 100_000_000, 100_000_000)], buffer, 0)
                .await
            {
                Ok(buffer) => buffer,
                Err((_, buffer)) => buffer,
            };
            ends.push(clock.now());
            buffer = device
                .copy_to_device(buffer, 0, 100_000_000, arena.base)
                .await
                .unwrap();
            ends.push(clock.now());
        }
        ends
    });
    (ends, trace.chrome_trace_json())
}

#[test]
fn jitter_and_slow_reads_are_deterministic_per_seed() {
    // Proves jitter and slow reads give the same timeline and trace for a seed, and another
    // for another seed.
    let faults = |seed| FaultPlan {
        seed,
        jitter: 0.2,
        slow_read_probability: 0.1,
        slow_read_factor: 5.0,
        fail_read_after: None,
    };
    let (first, first_trace) = perturbed_timeline(&faults(42));
    let (again, again_trace) = perturbed_timeline(&faults(42));
    assert_eq!(first, again);
    // The same seed writes the same trace, byte for byte.
    assert_eq!(first_trace, again_trace);
    let (other, other_trace) = perturbed_timeline(&faults(43));
    assert_ne!(first, other);
    assert_ne!(first_trace, other_trace);
    // Jitter really perturbs: the exact, unperturbed timeline differs.
    assert_ne!(first, perturbed_timeline(&FaultPlan::default()).0);
}

#[test]
fn an_injected_read_failure_names_its_seed_and_happens_on_schedule() {
    // Proves fail_read_after lets that many reads through, then fails one naming the seed.
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let faults = FaultPlan {
            seed: 7,
            fail_read_after: Some(3),
            ..FaultPlan::default()
        };
        let storage = nvme(&clock, &faults);
        let mut buffer = HostBuffer::virtual_buffer(1000);
        for _ in 0..3 {
            buffer = storage
                .read(vec![extent(0, 1000)], buffer, 0)
                .await
                .unwrap();
        }
        let (error, _) = storage
            .read(vec![extent(0, 1000)], buffer, 0)
            .await
            .unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("injected") && message.contains("seed 7"),
            "{message}"
        );
        assert_eq!(storage.read_stats().reads, 3);
        assert_eq!(storage.read_stats().failed, 1);
    });
}

/// The durations of reads of `(offset, length)` one after another on an NVMe-rate
/// page cache (7 GB/s) whose dropped pages read at 1 GB/s, after `forgotten` ranges
/// were forgotten.
fn page_cache_reads(forgotten: &[(u64, u64)], reads: &[(u64, u64)]) -> Vec<Duration> {
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let storage =
            nvme(&clock, &FaultPlan::default()).with_uncached(stagehand::sim::DiskRates {
                bytes_per_second: GB,
                request_latency: READ_LATENCY,
            });
        for &(offset, length) in forgotten {
            storage.forget_cached(&[extent(offset, length)]);
        }
        let mut durations = Vec::new();
        for &(offset, length) in reads {
            let started = clock.now();
            let buffer = HostBuffer::virtual_buffer(length as usize);
            storage
                .read(vec![extent(offset, length)], buffer, 0)
                .await
                .unwrap();
            durations.push(clock.now() - started);
        }
        durations
    })
}

#[test]
fn bytes_whose_pages_were_dropped_are_read_at_the_uncached_rate_once() {
    // Proves the page-cache disk model: a range forgotten after pinning
    // (`forget_cached`) costs the uncached rate on its next read, which caches it
    // again; bytes never forgotten cost the page cache's rate.
    // Half of the first 7 GB forgotten: [0, 1.75 GB) and [5.25 GB, 7 GB).
    let durations = page_cache_reads(
        &[(0, 1_750_000_000), (5_250_000_000, 1_750_000_000)],
        &[(0, 7 * GB), (0, 7 * GB)],
    );
    // 3.5 GB at 1 GB/s + 3.5 GB at 7 GB/s, then all 7 GB at 7 GB/s (a jump back).
    assert_eq!(
        durations,
        [
            READ_LATENCY + Duration::from_millis(3_500 + 500),
            READ_LATENCY + Duration::from_secs(1)
        ]
    );
}

#[test]
fn a_read_over_part_of_a_dropped_range_leaves_the_rest_dropped() {
    // Proves the dropped ranges split: forget [0, 2 GB), read [1 GB, 2 GB) (1 GB
    // uncached), then [0, 1 GB) is still uncached and [1 GB, 2 GB) cached.
    let durations = page_cache_reads(&[(0, 2 * GB)], &[(GB, GB), (0, GB), (GB, GB)]);
    // Sequential after the second read: no latency; the transfer rounds up.
    let cached = Duration::from_nanos((GB * 1_000_000_000).div_ceil(7 * GB));
    assert_eq!(
        durations,
        [
            READ_LATENCY + Duration::from_secs(1),
            READ_LATENCY + Duration::from_secs(1),
            cached
        ]
    );
}
