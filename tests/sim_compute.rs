//! The simulator's compute adapter with the disk and device: compute serialised, every
//! lane traced without overlap (in the Chrome trace file too), and naive steps of a 70B
//! model taking exactly their summed durations.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sim::{device, extent, nvme, GB};
use stagehand::actors::{BlockLayout, Device, ModelLayout, Storage};
use stagehand::sim::{
    virtual_time_runtime, virtual_time_system, ComputeRates, FaultPlan, SimClock, SimCompute,
};
use stagehand::telemetry::{Lane, TraceRecorder};

#[test]
fn compute_is_serialised_and_every_lane_is_traced_without_overlap() {
    // Proves compute runs one block at a time and the disk, copy and compute lanes are
    // traced without overlap.
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
    use stagehand::sim::{transfer_duration, HardwareProfile, SimMachine};
    use stagehand::simulate::ModelDescription;
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
