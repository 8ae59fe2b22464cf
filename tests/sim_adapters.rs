//! The simulator's device, disk and compute adapters on virtual time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use stagehand::actors::{BlockLayout, Device, Extent, FileId, HostBuffer, ModelLayout, Storage};
use stagehand::sim::{
    virtual_time_runtime, virtual_time_system, ComputeRates, DiskRates, FaultPlan, Lane, LinkRates,
    SimClock, SimCompute, SimDevice, SimDeviceSpec, SimStorage, TraceRecorder,
};

const GB: u64 = 1_000_000_000;
const COPY_LATENCY: Duration = Duration::from_micros(10);
const READ_LATENCY: Duration = Duration::from_micros(50);

fn pcie4() -> LinkRates {
    LinkRates {
        pinned_bytes_per_second: 25 * GB,
        pageable_bytes_per_second: 12 * GB,
        latency: COPY_LATENCY,
    }
}

fn device(clock: &Arc<SimClock>, faults: &FaultPlan) -> SimDevice {
    let spec = SimDeviceSpec {
        vram_bytes: 24 * GB,
        pinnable_bytes: 64 * GB,
        link: pcie4(),
    };
    SimDevice::new(spec, Arc::clone(clock), faults)
}

fn nvme(clock: &Arc<SimClock>, faults: &FaultPlan) -> SimStorage {
    let disk = DiskRates {
        bytes_per_second: 7 * GB,
        request_latency: READ_LATENCY,
    };
    SimStorage::new(disk, Arc::clone(clock), faults)
}

fn extent(offset: u64, length: u64) -> Extent {
    Extent {
        file: FileId(0),
        offset,
        length,
    }
}

#[test]
fn a_copy_takes_bytes_over_link_rate_in_virtual_time_not_wall_time() {
    let wall = Instant::now();
    let runtime = virtual_time_runtime().unwrap();
    let (done_at, tokio_elapsed, long_copy_done_at) = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let device = device(&clock, &FaultPlan::default());
        let arena = device.allocate_arena(10 * GB).unwrap();
        let source = device.allocate_pinned(10 * GB).unwrap();
        let tokio_start = tokio::time::Instant::now();
        let source = device
            .copy_to_device(source, 0, 10 * GB, arena.base)
            .await
            .unwrap();
        let done_at = clock.now();
        let tokio_elapsed = tokio_start.elapsed();
        // 1 TB more: 40 s of virtual copying, to show it is not slept through.
        let mut source = source;
        for _ in 0..100 {
            source = device
                .copy_to_device(source, 0, 10 * GB, arena.base)
                .await
                .unwrap();
        }
        (done_at, tokio_elapsed, clock.now())
    });
    let copy = Duration::from_millis(400) + COPY_LATENCY;
    assert_eq!(done_at, copy);
    // tokio's own clock is within its 1 ms tick of the exact time.
    assert!(tokio_elapsed >= done_at && tokio_elapsed - done_at < Duration::from_millis(1));
    assert_eq!(long_copy_done_at, 101 * copy);
    // 40 s of virtual copying in far less wall time (generous: a loaded CI box).
    let wall_elapsed = wall.elapsed();
    assert!(wall_elapsed < Duration::from_secs(10), "{wall_elapsed:?}");
    println!("40.4 s of virtual copies took {wall_elapsed:?} of wall time");
}

#[test]
fn concurrent_copies_queue_on_one_copy_engine() {
    let runtime = virtual_time_runtime().unwrap();
    let ends = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let device = Arc::new(device(&clock, &FaultPlan::default()));
        let arena = device.allocate_arena(20 * GB).unwrap();
        let mut tasks = Vec::new();
        for index in 0..2 {
            let device = Arc::clone(&device);
            let clock = Arc::clone(&clock);
            let destination = arena.base.offset(index * 10 * GB);
            let source = device.allocate_pinned(10 * GB).unwrap();
            tasks.push(tokio::spawn(async move {
                device
                    .copy_to_device(source, 0, 10 * GB, destination)
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
    let copy = Duration::from_millis(400) + COPY_LATENCY;
    assert_eq!(ends, [copy, 2 * copy]);
}

#[test]
fn sub_millisecond_operations_do_not_accumulate_tick_rounding() {
    // 1000 copies of 1 MB, each issued when the previous one completes: 40 µs + latency
    // each. With tokio's 1 ms ticks alone this would read about 1 s.
    let runtime = virtual_time_runtime().unwrap();
    let done_at = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let device = device(&clock, &FaultPlan::default());
        let arena = device.allocate_arena(1_000_000).unwrap();
        let mut source = device.allocate_pinned(1_000_000).unwrap();
        for _ in 0..1000 {
            source = device
                .copy_to_device(source, 0, 1_000_000, arena.base)
                .await
                .unwrap();
        }
        clock.now()
    });
    assert_eq!(done_at, 1000 * (Duration::from_micros(40) + COPY_LATENCY));
}

#[test]
fn pageable_buffers_copy_at_the_pageable_rate() {
    let runtime = virtual_time_runtime().unwrap();
    let (done_at, stats) = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let device = device(&clock, &FaultPlan::default());
        let arena = device.allocate_arena(12 * GB).unwrap();
        let plain = HostBuffer::virtual_buffer(12 * GB as usize);
        device
            .copy_to_device(plain, 0, 12 * GB, arena.base)
            .await
            .unwrap();
        (clock.now(), device.copy_stats())
    });
    assert_eq!(done_at, Duration::from_secs(1) + COPY_LATENCY);
    assert_eq!((stats.pageable_bytes, stats.pinned_bytes), (12 * GB, 0));
}

#[test]
fn vram_and_pinned_ram_are_hard_capacities() {
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let device = device(&clock, &FaultPlan::default());
        let arena = device.allocate_arena(20 * GB).unwrap();
        assert!(
            device.allocate_arena(5 * GB).is_err(),
            "24 GB card holds 20 + 5 GB"
        );
        assert_eq!(device.memory_info().unwrap().free_bytes, 4 * GB);
        device.free_arena(arena);
        assert!(device.allocate_arena(24 * GB).is_ok());

        let first = device.allocate_pinned(40 * GB).unwrap();
        assert!(device.allocate_pinned(30 * GB).is_err(), "64 GB pinnable");
        assert_eq!(device.pinned_bytes(), 40 * GB);
        drop(first);
        assert_eq!(device.pinned_bytes(), 0);
    });
}

#[test]
fn copies_outside_an_arena_or_past_the_source_fail_cleanly() {
    let runtime = virtual_time_runtime().unwrap();
    runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let device = device(&clock, &FaultPlan::default());
        let arena = device.allocate_arena(1000).unwrap();
        let source = device.allocate_pinned(2000).unwrap();
        let (error, source) = device
            .copy_to_device(source, 0, 2000, arena.base)
            .await
            .unwrap_err();
        assert!(error.to_string().contains("overrun"), "{error}");
        let (error, _) = device
            .copy_to_device(source, 1500, 1000, arena.base)
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("overruns a 2000-byte buffer"),
            "{error}"
        );
    });
}

#[test]
fn reads_queue_on_the_disk_and_pay_latency_only_when_they_jump() {
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

#[test]
fn compute_is_serialised_and_every_lane_is_traced_without_overlap() {
    let system = virtual_time_system().unwrap();
    let trace = Arc::new(TraceRecorder::new());
    let recorded = Arc::clone(&trace);
    system.block_on(async move {
        let clock = SimClock::new().unwrap();
        let faults = FaultPlan::default();
        let layout = ModelLayout {
            blocks: (0..4)
                .map(|index| {
                    BlockLayout::new(
                        format!("layer.{index}"),
                        vec![extent(index * 1_000_000_000, 1_000_000_000)],
                    )
                })
                .collect(),
        };
        let storage = Arc::new(
            nvme(&clock, &faults)
                .with_layout(&layout)
                .with_trace(Arc::clone(&recorded)),
        );
        let device = Arc::new(device(&clock, &faults).with_trace(Arc::clone(&recorded)));
        let compute = SimCompute::new(
            ComputeRates {
                sustained_flops_per_second: 100e12,
                memory_bytes_per_second: 1_000 * GB,
            },
            Arc::clone(&clock),
        )
        .with_trace(Arc::clone(&recorded));
        let arena = device.allocate_arena(4 * GB).unwrap();
        // Load every block (disk → pinned → VRAM) concurrently, then compute in order.
        let mut loads = Vec::new();
        for (index, block) in layout.blocks.iter().enumerate() {
            let storage = Arc::clone(&storage);
            let device = Arc::clone(&device);
            let extents = block.extents.clone();
            let destination = arena.base.offset(index as u64 * GB);
            let buffer = device.allocate_pinned(GB).unwrap();
            loads.push(tokio::spawn(async move {
                let buffer = storage.read(extents, buffer, 0).await.unwrap();
                device
                    .copy_to_device(buffer, 0, GB, destination)
                    .await
                    .unwrap();
            }));
        }
        for (index, load) in loads.into_iter().enumerate() {
            load.await.unwrap();
            let duration = compute.duration(20e12);
            compute.compute(format!("layer.{index}"), duration).await;
        }
        assert_eq!(clock.now(), compute.busy_until());
    });
    check_chrome_trace_file(&trace);
    let slices = trace.slices();
    assert_eq!(slices.len(), 12);
    for lane in Lane::ALL {
        let on_lane: Vec<_> = slices.iter().filter(|slice| slice.lane == lane).collect();
        assert_eq!(on_lane.len(), 4, "{lane:?}");
        for pair in on_lane.windows(2) {
            assert!(pair[0].end <= pair[1].start, "{lane:?} overlaps: {pair:?}");
        }
    }
    let disk_labels: Vec<_> = slices
        .iter()
        .filter(|slice| slice.lane == Lane::Disk)
        .map(|slice| slice.label.as_str())
        .collect();
    assert_eq!(disk_labels, ["layer.0", "layer.1", "layer.2", "layer.3"]);
    // The last compute starts after the last block arrived: disk-bound at 7 GB/s.
    let last_copy_end = slices
        .iter()
        .filter(|slice| slice.lane == Lane::Copy)
        .map(|slice| slice.end)
        .max()
        .unwrap();
    let last_compute = slices
        .iter()
        .rfind(|slice| slice.lane == Lane::Compute)
        .unwrap();
    assert!(last_compute.start >= last_copy_end);
    assert_eq!(
        last_compute.end - last_compute.start,
        Duration::from_millis(200)
    );
}

#[test]
fn fifty_naive_steps_of_a_70b_model_take_exactly_their_summed_durations() {
    // Load each block when needed, no prefetch: every step reads, copies and computes
    // all 82 blocks one after another, so virtual time is the plain sum. Also a
    // measure of the adapters' own cost: 12,300 timed operations.
    use stagehand::sim::{transfer_duration, HardwareProfile, ModelDescription, SimMachine};
    let model = ModelDescription::load("llama3-70b").unwrap();
    let hardware = HardwareProfile::load("rtx3060-12gb").unwrap();
    let layout = model.layout();
    let steps = 50;

    let disk = hardware.disk_rates();
    let link = hardware.link_rates();
    let compute_rates = hardware.compute_rates();
    let mut step = disk.request_latency; // each step jumps back to the file's start
    for (block, desc) in layout.blocks.iter().zip(&model.blocks) {
        for extent in &block.extents {
            step += transfer_duration(extent.length, disk.bytes_per_second);
        }
        step += link.latency + transfer_duration(block.bytes, link.pinned_bytes_per_second);
        step += compute_rates.block_duration(model.block_step_flops(desc), block.bytes);
    }

    let wall = Instant::now();
    let runtime = virtual_time_runtime().unwrap();
    let done_at = runtime.block_on(async {
        let machine =
            SimMachine::new(&hardware, &FaultPlan::default(), Some(&layout), None).unwrap();
        let largest = layout.largest_block_bytes();
        let arena = machine.device.allocate_arena(largest).unwrap();
        let mut buffer = machine.device.allocate_pinned(largest).unwrap();
        for _ in 0..steps {
            for (block, desc) in layout.blocks.iter().zip(&model.blocks) {
                buffer = machine
                    .storage
                    .read(block.extents.clone(), buffer, 0)
                    .await
                    .unwrap();
                buffer = machine
                    .device
                    .copy_to_device(buffer, 0, block.bytes, arena.base)
                    .await
                    .unwrap();
                let duration = machine
                    .compute
                    .block_duration(model.block_step_flops(desc), block.bytes);
                machine.compute.compute(&desc.name, duration).await;
            }
        }
        machine.clock.now()
    });
    let wall_elapsed = wall.elapsed();
    assert_eq!(done_at, steps * step);
    println!(
        "50 naive steps of llama3-70b: {:.1} s of virtual time in {wall_elapsed:?} of wall time",
        done_at.as_secs_f64()
    );
}

/// Writes the trace to a file, parses it back, and checks what Perfetto will show: the
/// three named lanes, and slices on one lane that never overlap.
fn check_chrome_trace_file(trace: &TraceRecorder) {
    let directory = tempfile::tempdir().unwrap();
    let path = directory.path().join("trace.json");
    trace.write_chrome_trace(&path).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().unwrap();
    let mut lanes = std::collections::BTreeMap::new();
    for event in events.iter().filter(|event| event["name"] == "thread_name") {
        lanes.insert(
            event["tid"].as_u64().unwrap(),
            event["args"]["name"].as_str().unwrap().to_string(),
        );
    }
    assert_eq!(
        lanes.values().map(String::as_str).collect::<Vec<_>>(),
        ["disk", "copy", "compute"]
    );
    for (tid, lane) in &lanes {
        let mut slices: Vec<(f64, f64)> = events
            .iter()
            .filter(|event| event["ph"] == "X" && event["tid"].as_u64() == Some(*tid))
            .map(|event| {
                (
                    event["ts"].as_f64().unwrap(),
                    event["dur"].as_f64().unwrap(),
                )
            })
            .collect();
        assert!(!slices.is_empty(), "no slices on {lane}");
        slices.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in slices.windows(2) {
            let first_end = pair[0].0 + pair[0].1;
            assert!(first_end <= pair[1].0 + 1e-6, "{lane}: {pair:?} overlap");
        }
    }
}
