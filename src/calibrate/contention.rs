//! How copies and compute slow each other on a backend where they share the cores and
//! the memory bus (the CPU backend: the copy thread's `memcpy`, the reader threads'
//! page-cache copies and the compute thread's GEMMs). Measures the memory bandwidth
//! one thread and every core get, then runs the copy thread and a GEMM (one row, and
//! many rows) at the same time and times each against its time alone: the figures the
//! simulator's shared-bus model is built from, and the check of that model.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde::Serialize;
use stagehand_actors::Device;

use super::median;
use crate::compute::{Compute, DType, TensorSlot};
use crate::device::CpuCompute;

/// Bytes each memcpy thread copies per pass.
const MEMCPY_BYTES: usize = 64 << 20;
/// Weight side of the concurrent GEMM (f32, 4 MiB), cycled through 64 MiB.
const SIDE: usize = 1024;
const WEIGHTS: usize = 16;
/// How long each concurrent run lasts.
const OVERLAP: Duration = Duration::from_millis(400);

/// One concurrent run: the copy thread and a GEMM of `rows` rows at once.
#[derive(Debug, Clone, Serialize)]
pub struct OverlapRun {
    pub rows: u64,
    /// Bytes of the weight each GEMM reads.
    pub gemm_weight_bytes: u64,
    /// Seconds of one GEMM alone and while copies run.
    pub gemm_alone_seconds: f64,
    pub gemm_shared_seconds: f64,
    /// Copy rate alone and while the GEMM runs, bytes per second.
    pub copy_alone_bytes_per_second: f64,
    pub copy_shared_bytes_per_second: f64,
}

impl OverlapRun {
    /// The memory traffic the GEMM and the copies made together while they ran at
    /// once, bytes per second: the GEMM's weight reads plus each copied byte twice (a
    /// read and a write).
    pub fn shared_traffic(&self) -> f64 {
        self.gemm_weight_bytes as f64 / self.gemm_shared_seconds.max(1e-12)
            + 2.0 * self.copy_shared_bytes_per_second
    }
}

/// Each overlap is run this many times; the run with the median shared traffic is kept.
const OVERLAP_REPEATS: usize = 3;

/// What the contention measurements found.
#[derive(Debug, Clone, Serialize)]
pub struct ContentionFigures {
    pub cores: usize,
    /// memcpy bandwidth of one thread, and of one thread per core at once (bytes/s of
    /// copied data; the bus moves twice that: a read and a write).
    pub memcpy_one_thread_bytes_per_second: f64,
    pub memcpy_all_cores_bytes_per_second: f64,
    pub overlaps: Vec<OverlapRun>,
    pub how: String,
}

pub fn measure_contention(
    device: &Arc<dyn Device>,
    copy_block_bytes: u64,
) -> Result<ContentionFigures, String> {
    let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
    let one = memcpy_rate(1)?;
    let all = memcpy_rate(cores)?;
    let mut overlaps = Vec::new();
    for rows in [1u64, 64] {
        let mut runs = (0..OVERLAP_REPEATS)
            .map(|_| overlap(device, copy_block_bytes, rows))
            .collect::<Result<Vec<_>, _>>()?;
        runs.sort_by(|a, b| a.shared_traffic().total_cmp(&b.shared_traffic()));
        overlaps.push(runs.swap_remove(OVERLAP_REPEATS / 2));
    }
    Ok(ContentionFigures {
        cores,
        memcpy_one_thread_bytes_per_second: one,
        memcpy_all_cores_bytes_per_second: all,
        overlaps,
        how: format!(
            "memcpy of {} per thread, 1 thread then {cores} at once (median of 5 passes); then {} ms of back-to-back copies of {} on the device's copy thread while the compute thread runs f32 {SIDE}×{SIDE} GEMMs of 1 and of 64 rows, each side timed against itself alone, each pair run {OVERLAP_REPEATS} times and the run of median traffic kept",
            stagehand_actors::Bytes(MEMCPY_BYTES as u64),
            OVERLAP.as_millis(),
            stagehand_actors::Bytes(copy_block_bytes)
        ),
    })
}

/// Total bytes per second `threads` threads copy at once (each its own buffers).
fn memcpy_rate(threads: usize) -> Result<f64, String> {
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let source = vec![1u8; MEMCPY_BYTES];
                let mut target = vec![0u8; MEMCPY_BYTES];
                target.copy_from_slice(&source);
                let mut seconds = Vec::new();
                for _ in 0..5 {
                    barrier.wait();
                    let started = Instant::now();
                    target.copy_from_slice(std::hint::black_box(&source));
                    seconds.push(started.elapsed().as_secs_f64());
                }
                std::hint::black_box(&target);
                median(&seconds)
            })
        })
        .collect();
    let mut total = 0.0;
    for handle in handles {
        let seconds = handle
            .join()
            .map_err(|_| "a memcpy thread panicked".to_string())?;
        total += MEMCPY_BYTES as f64 / seconds.max(1e-12);
    }
    Ok(total)
}

/// GEMMs of `rows` rows for `duration` (or `until` is set): seconds per GEMM.
fn gemm_loop(
    rows: usize,
    duration: Duration,
    until: Option<&AtomicBool>,
    start: Option<&Barrier>,
) -> Result<f64, String> {
    let compute = CpuCompute::new();
    let error = |error: crate::compute::ComputeError| error.to_string();
    let weights: Vec<_> = (0..WEIGHTS)
        .map(|index| {
            let values: Vec<f32> = (0..SIDE * SIDE)
                .map(|value| ((value + index) % 7) as f32 * 0.01)
                .collect();
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            compute.load_block(&bytes)
        })
        .collect::<Result<_, _>>()
        .map_err(error)?;
    let slot = TensorSlot::new(0, DType::F32, SIDE, SIDE);
    let mut x = compute.tensor(rows, SIDE).map_err(error)?;
    compute
        .write(&mut x, &vec![0.5; rows * SIDE])
        .map_err(error)?;
    let mut y = compute.tensor(rows, SIDE).map_err(error)?;
    if let Some(start) = start {
        start.wait();
    }
    let started = Instant::now();
    let mut calls = 0u64;
    loop {
        let view = compute.block_view(&weights[calls as usize % WEIGHTS]);
        compute
            .linear(&x, &view.weight(&slot).map_err(error)?, None, &mut y)
            .map_err(error)?;
        calls += 1;
        let done = match until {
            Some(flag) => flag.load(Ordering::Relaxed),
            None => started.elapsed() >= duration,
        };
        if done {
            break;
        }
    }
    Ok(started.elapsed().as_secs_f64() / calls as f64)
}

/// Copies of `bytes` back to back for `duration` (or until `until`): bytes per second.
fn copy_loop(
    device: &Arc<dyn Device>,
    bytes: u64,
    duration: Duration,
    until: Option<&AtomicBool>,
    start: Option<&Barrier>,
) -> Result<f64, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let arena = device
        .allocate_arena(bytes)
        .map_err(|error| error.to_string())?;
    let mut buffer = device
        .allocate_pinned(bytes)
        .map_err(|error| error.to_string())?;
    if let Some(slice) = buffer.as_mut_slice() {
        slice.iter_mut().step_by(4096).for_each(|byte| *byte = 1);
    }
    // One untimed copy: first-touch of the arena.
    buffer = runtime
        .block_on(device.copy_to_device(buffer, 0, bytes, arena.base))
        .map_err(|(error, _)| error.to_string())?;
    if let Some(start) = start {
        start.wait();
    }
    let started = Instant::now();
    let mut copies = 0u64;
    let outcome = loop {
        buffer = match runtime.block_on(device.copy_to_device(buffer, 0, bytes, arena.base)) {
            Ok(returned) => returned,
            Err((error, _)) => break Err(error.to_string()),
        };
        copies += 1;
        let done = match until {
            Some(flag) => flag.load(Ordering::Relaxed),
            None => started.elapsed() >= duration,
        };
        if done {
            break Ok((copies * bytes) as f64 / started.elapsed().as_secs_f64());
        }
    };
    device.free_arena(arena);
    outcome
}

fn overlap(device: &Arc<dyn Device>, bytes: u64, rows: u64) -> Result<OverlapRun, String> {
    let gemm_alone = gemm_loop(rows as usize, OVERLAP / 2, None, None)?;
    let copy_alone = copy_loop(device, bytes, OVERLAP / 2, None, None)?;
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(2));
    let gemm = {
        let (stop, start) = (Arc::clone(&stop), Arc::clone(&start));
        std::thread::spawn(move || gemm_loop(rows as usize, OVERLAP, Some(&stop), Some(&start)))
    };
    let copy_shared = copy_loop(device, bytes, OVERLAP, None, Some(&start));
    stop.store(true, Ordering::Relaxed);
    let gemm_shared = gemm
        .join()
        .map_err(|_| "the GEMM thread panicked".to_string())??;
    Ok(OverlapRun {
        rows,
        gemm_weight_bytes: (SIDE * SIDE * 4) as u64,
        gemm_alone_seconds: gemm_alone,
        gemm_shared_seconds: gemm_shared,
        copy_alone_bytes_per_second: copy_alone,
        copy_shared_bytes_per_second: copy_shared?,
    })
}
