//! The simulator's device adapter on virtual time: copy durations from the link's
//! rates, one copy engine, no tick rounding, hard VRAM and pinned capacities, and the
//! first-touch cost of fresh arena and pinned bytes.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sim::{device, extent, nvme, COPY_LATENCY, GB, READ_LATENCY};
use stagehand::actors::{Device, HostBuffer, Storage};
use stagehand::sim::{tokio_duration, virtual_time_runtime, FaultPlan, FirstTouch, SimClock};

#[test]
fn a_copy_takes_bytes_over_link_rate_in_virtual_time_not_wall_time() {
    // Proves a copy ends at latency + bytes / pinned rate on the virtual clock, and 40 s of
    // them pass in little wall time.
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
    // tokio's own clock runs TOKIO_SLOWDOWN times slower, within its 1 ms tick.
    let tokio_done_at = tokio_duration(done_at);
    assert!(
        tokio_elapsed >= tokio_done_at && tokio_elapsed - tokio_done_at < Duration::from_millis(1),
        "{tokio_elapsed:?} for {done_at:?} of virtual time"
    );
    assert_eq!(long_copy_done_at, 101 * copy);
    // 40 s of virtual copying in far less wall time (generous: a loaded CI box).
    let wall_elapsed = wall.elapsed();
    assert!(wall_elapsed < Duration::from_secs(10), "{wall_elapsed:?}");
    println!("40.4 s of virtual copies took {wall_elapsed:?} of wall time");
}

#[test]
fn concurrent_copies_queue_on_one_copy_engine() {
    // Proves two copies issued together run one after the other on the single copy engine,
    // the second's latency overlapping the first's transfer.
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
    let transfer = Duration::from_millis(400);
    assert_eq!(ends, [COPY_LATENCY + transfer, COPY_LATENCY + 2 * transfer]);
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
    // Proves a copy from unpinned memory runs at the pageable rate and is counted as
    // pageable.
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
    // Proves VRAM and pinnable RAM refuse allocations past their capacity and free what is
    // returned.
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
    // Proves a copy that overruns the arena or its source buffer is an error naming the
    // overrun.
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
fn fresh_arena_and_pinned_bytes_pay_their_first_touch_once() {
    // At 2 GB/s of first touch: the first copy into 1 GB of fresh arena takes 0.5 s
    // more than the same copy into those (now warm) bytes; a copy half over fresh
    // bytes pays for that half; the first read into a fresh pinned buffer pays for
    // it, the second read into it does not.
    let runtime = virtual_time_runtime().unwrap();
    let (copies, reads) = runtime.block_on(async {
        let clock = SimClock::new().unwrap();
        let faults = FaultPlan::default();
        let first_touch = Arc::new(FirstTouch::new(2.0));
        let device = device(&clock, &faults).with_first_touch(Arc::clone(&first_touch));
        let storage = nvme(&clock, &faults).with_first_touch(first_touch);
        let arena = device.allocate_arena(2 * GB).unwrap();
        let mut source = device.allocate_pinned(GB).unwrap();
        let mut copies = Vec::new();
        for offset in [0, 0, GB / 2] {
            let started = clock.now();
            source = device
                .copy_to_device(source, 0, GB, arena.base.offset(offset))
                .await
                .unwrap();
            copies.push(clock.now() - started);
        }
        let mut reads = Vec::new();
        for _ in 0..2 {
            let started = clock.now();
            source = storage.read(vec![extent(0, GB)], source, 0).await.unwrap();
            reads.push(clock.now() - started);
        }
        (copies, reads)
    });
    let copy = Duration::from_millis(40) + COPY_LATENCY;
    let fault = |bytes: u64| Duration::from_nanos(bytes / 2);
    assert_eq!(copies, [copy + fault(GB), copy, copy + fault(GB / 2)]);
    let read = Duration::from_nanos(GB / 7) + READ_LATENCY;
    let tolerance = Duration::from_nanos(2);
    assert!(
        reads[0].abs_diff(read + fault(GB)) <= tolerance,
        "{reads:?}"
    );
    assert!(reads[1].abs_diff(read) <= tolerance, "{reads:?}");
}
