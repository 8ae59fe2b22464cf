//! The kernels the model families run, timed through the compute port: `linear` (the
//! GEMM, a GEMV at one row) for each storage dtype at several row counts and weight
//! sizes, the element-wise kernels, both attentions, and the fixed cost of a call.
//! Generic over the port, so the same code times `CpuCompute` and the CUDA adapter
//! (every sample waits for the stream).
//!
//! Weights are cycled through more memory than the caches hold, so each call reads
//! its weight from DRAM (VRAM), as a block's first use in a step does.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use super::median;
use crate::compute::work::ElementOp;
use crate::compute::{Compute, DType, TensorSlot};
use crate::sim::{KernelCosts, LinearRates, ThreadScaling};

mod attention;
use attention::{cached_attention, fit_attention};

/// Weights per (dtype, size) are cycled through at least this many bytes.
const CACHE_DEFEAT_BYTES: u64 = 64 << 20;

/// Which shapes to time, and for how long.
#[derive(Debug, Clone)]
pub struct KernelOptions {
    pub dtypes: Vec<DType>,
    /// Square weights of these sides.
    pub sides: Vec<u64>,
    pub rows: Vec<u64>,
    /// Each point is timed for at least this long (and at least `min_samples` calls).
    pub seconds_per_point: f64,
    pub min_samples: usize,
    /// The `linear` sweep is repeated this many times, one whole pass after another;
    /// each point keeps its fastest pass. A burst of another process's work lasts
    /// longer than one point's tens of milliseconds, so it lands in one pass and is
    /// outvoted: one pass measured the one-row f32 1024² point at 4.0 GFLOP/s where
    /// five others found 12–14.
    pub linear_passes: usize,
    /// Threads the CPU compute adapter times the kernels on: a streamed run's
    /// default (every core but one, left to the copy and read threads), so the
    /// simulator's kernel costs are those of the runs it predicts. The CUDA adapter
    /// ignores it.
    pub compute_threads: usize,
    /// Also time each product with its weight flushed from the caches first
    /// (`cold_gflops`, a streamed block's rate). The thread-scaling and speed probes
    /// read only the resident rates and leave it out.
    pub cold: bool,
}

impl KernelOptions {
    pub fn full() -> Self {
        Self {
            dtypes: vec![DType::F32, DType::Bf16, DType::F16],
            sides: vec![128, 512, 1024, 2048],
            rows: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            seconds_per_point: 0.04,
            min_samples: 5,
            linear_passes: 3,
            compute_threads: streamed_run_threads(),
            cold: true,
        }
    }

    /// Fewer shapes than [`Self::full`], each point timed as long: with 20 ms points
    /// of 3 samples a quick profile held the one-row f32 1024² product 8–32 % slower
    /// than the same product timed at once afterwards (`validate`'s speed line read
    /// ×1.08–1.32), with 40 ms of 5, ×0.87–1.07, as a full profile reads.
    pub fn quick() -> Self {
        Self {
            dtypes: vec![DType::F32, DType::Bf16],
            sides: vec![512, 1024],
            rows: vec![1, 8, 64],
            seconds_per_point: 0.04,
            min_samples: 5,
            linear_passes: 2,
            compute_threads: streamed_run_threads(),
            cold: true,
        }
    }
}

/// The compute threads of a streamed decode run on this machine by default (a
/// streamed step of many rows keeps every core: `Settings::compute_threads_for`).
fn streamed_run_threads() -> usize {
    crate::settings::Settings::default()
        .compute_threads_for(crate::settings::Streaming::Blocks { rows: 1 })
}

/// What the kernel measurements found: the profile's `[compute]` table.
#[derive(Debug, Clone, Serialize)]
pub struct KernelFigures {
    pub costs: KernelCosts,
    pub how: String,
}

/// Times every kernel on `compute`.
pub fn measure_kernels<C: Compute>(
    compute: &C,
    options: &KernelOptions,
) -> Result<KernelFigures, String> {
    let error = |error: crate::compute::ComputeError| error.to_string();
    let points: Vec<(DType, u64)> = options
        .dtypes
        .iter()
        .flat_map(|&dtype| options.sides.iter().map(move |&side| (dtype, side)))
        .collect();
    let measure = |&(dtype, side): &(DType, u64)| measure_linear(compute, options, dtype, side);
    let mut linear = points
        .iter()
        .map(measure)
        .collect::<Result<Vec<LinearRates>, _>>()
        .map_err(error)?;
    for _ in 1..options.linear_passes {
        for (kept, point) in linear.iter_mut().zip(&points) {
            // The fastest pass of each point.
            let again = measure(point).map_err(error)?;
            for (kept, new) in kept.gflops.iter_mut().zip(again.gflops) {
                *kept = kept.max(new);
            }
            if let (Some(kept), Some(new)) = (kept.cold_gflops.as_mut(), again.cold_gflops) {
                for (kept, new) in kept.iter_mut().zip(new) {
                    *kept = kept.max(new);
                }
            }
        }
    }
    let elementwise_ns = measure_elementwise(compute, options).map_err(error)?;
    let (attention, per_query_head) = fit_attention(compute, options).map_err(error)?;
    let cached = cached_attention(compute, options).map_err(error)?;
    let call_overhead = measure_call_overhead(compute).map_err(error)?;
    Ok(KernelFigures {
        costs: KernelCosts {
            call_overhead_us: call_overhead * 1e6,
            attention_ns_per_score_dim: attention * 1e9,
            attention_ns_per_query_head: per_query_head * 1e9,
            cached_attention_ns_per_score_dim: cached * 1e9,
            elementwise_ns,
            linear,
            threads: None,
        },
        how: format!(
            "through the {} compute adapter, one call at a time, each call waited for; linear: weights cycled through {} (gflops: as a resident model's, in the caches as far as they hold them) and again flushed from the caches before each call (cold_gflops: as a streamed block's, from memory), the fastest of {} passes over the sweep; each point the median of ≥ {} calls over ≥ {:.0} ms",
            compute.name(),
            stagehand_actors::Bytes(CACHE_DEFEAT_BYTES),
            options.linear_passes.max(1),
            options.min_samples,
            options.seconds_per_point * 1e3
        ),
    })
}

/// Seconds of one call of `call` (median), the stream waited for after each.
fn time_calls<C: Compute>(
    compute: &C,
    options: &KernelOptions,
    call: impl FnMut(usize) -> Result<(), crate::compute::ComputeError>,
) -> Result<f64, crate::compute::ComputeError> {
    time_calls_after(compute, options, |_| {}, call)
}

/// [`time_calls`], `before(index)` run untimed ahead of call `index`.
fn time_calls_after<C: Compute>(
    compute: &C,
    options: &KernelOptions,
    mut before: impl FnMut(usize),
    mut call: impl FnMut(usize) -> Result<(), crate::compute::ComputeError>,
) -> Result<f64, crate::compute::ComputeError> {
    // One untimed call: first-touch page faults and lazy allocations.
    call(0)?;
    compute.wait(compute.fence()?)?;
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut index = 1;
    while samples.len() < options.min_samples
        || (started.elapsed().as_secs_f64() < options.seconds_per_point && samples.len() < 10_000)
    {
        before(index);
        let began = Instant::now();
        call(index)?;
        compute.wait(compute.fence()?)?;
        samples.push(began.elapsed().as_secs_f64());
        index += 1;
    }
    Ok(median(&samples))
}

/// Seeded values in [-0.5, 0.5) stored as `dtype`.
fn weight_bytes(dtype: DType, elements: usize, seed: u64) -> Vec<u8> {
    let mut random = crate::sim::SplitMix64::new(seed);
    let values: Vec<f32> = (0..elements)
        .map(|_| random.next_f64() as f32 - 0.5)
        .collect();
    let mut bytes = vec![0u8; elements * dtype.size_bytes()];
    dtype.narrow(&values, &mut bytes);
    bytes
}

/// A weight held as a run's weights are: in the device tier's memory on a GPU, and on
/// the CPU backend in plain host pages, as the device tier's arena is — not in the huge
/// pages the CPU adapter gives a block it loads for the reference pass. A product
/// cycling its weights through 64 MiB of huge pages ran a resident linear-stack step in
/// 2.7 ms on one thread where the run, its weights in the arena, took 3.4–7.8 ms: the
/// page walks of small pages are part of a run's product time.
fn weight_block<C: Compute>(
    compute: &C,
    bytes: Vec<u8>,
) -> Result<C::Block, crate::compute::ComputeError> {
    compute.share_block(crate::compute::SharedBytes::new(std::sync::Arc::new(bytes)))
}

pub(super) fn measure_linear<C: Compute>(
    compute: &C,
    options: &KernelOptions,
    dtype: DType,
    side: u64,
) -> Result<LinearRates, crate::compute::ComputeError> {
    let side_usize = side as usize;
    let elements = side_usize * side_usize;
    let bytes = (elements * dtype.size_bytes()) as u64;
    let copies = CACHE_DEFEAT_BYTES.div_ceil(bytes).clamp(1, 64) as usize;
    let blocks: Vec<C::Block> = (0..copies)
        .map(|copy| weight_block(compute, weight_bytes(dtype, elements, copy as u64)))
        .collect::<Result<_, _>>()?;
    let slot = TensorSlot::new(0, dtype, side_usize, side_usize);
    let mut gflops = Vec::with_capacity(options.rows.len());
    let mut cold_gflops = Vec::with_capacity(options.rows.len());
    let flops_of = |rows: u64| 2.0 * rows as f64 * elements as f64;
    for &rows in &options.rows {
        let rows_usize = rows as usize;
        let mut x = compute.tensor(rows_usize, side_usize)?;
        compute.write(&mut x, &vec![0.25; rows_usize * side_usize])?;
        let mut y = compute.tensor(rows_usize, side_usize)?;
        let mut product = |index: usize| {
            let view = compute.block_view(&blocks[index % copies]);
            compute.linear(&x, &view.weight(&slot)?, None, &mut y)
        };
        // Resident: the weights cycle through `CACHE_DEFEAT_BYTES`, which a large L3
        // may hold, as it holds a small resident model.
        let seconds = time_calls(compute, options, &mut product)?;
        gflops.push(flops_of(rows) / seconds.max(1e-12) / 1e9);
        if !options.cold {
            continue;
        }
        // Streamed: each weight flushed from the caches before its call, as a block
        // copied in with non-temporal stores just before its compute.
        let flush = |index: usize| {
            compute.flush_from_caches(&compute.block_view(&blocks[index % copies]));
        };
        let seconds = time_calls_after(compute, options, flush, &mut product)?;
        cold_gflops.push(flops_of(rows) / seconds.max(1e-12) / 1e9);
    }
    Ok(LinearRates {
        dtype: dtype_name(dtype).to_string(),
        inner: side,
        outer: side,
        rows: options.rows.clone(),
        gflops,
        cold_gflops: options.cold.then_some(cold_gflops),
    })
}

/// Passes [`thread_scaling`] times each side. On a shared VM a pass of the every-core
/// side loses a core to another guest now and then: with two passes the profile's
/// speedup came out 1.39× and 1.80× in two calibrations minutes apart (the resident
/// steps it predicts ran 1.75–1.83×), and the 1.39 predicted every resident row of
/// `validate` 11–35 % too slow; with four, 1.49× once in nine calibrations and
/// 1.80–2.05× in the others.
const THREAD_SCALING_PASSES: usize = 4;

/// How much faster the products run on `all` (every core) than on `timed` (the
/// table's threads): an f32 1024² weight at 1, 8 and 64 rows, each side timed
/// [`THREAD_SCALING_PASSES`] times, alternating, the fastest kept; the smallest of the
/// three ratios.
pub fn thread_scaling<C: Compute>(
    (timed, timed_on): (&C, u64),
    (all, all_cores): (&C, u64),
    options: &KernelOptions,
) -> Result<ThreadScaling, String> {
    let probe = KernelOptions {
        rows: vec![1, 8, 64],
        cold: false,
        ..options.clone()
    };
    let error = |error: crate::compute::ComputeError| error.to_string();
    let mut best = [vec![0f64; 3], vec![0f64; 3]];
    for _ in 0..THREAD_SCALING_PASSES {
        for (side, compute) in [(0, timed), (1, all)] {
            let rates = measure_linear(compute, &probe, DType::F32, 1024).map_err(error)?;
            for (kept, new) in best[side].iter_mut().zip(rates.gflops) {
                *kept = kept.max(new);
            }
        }
    }
    // The smallest of the three: a product's own speedup overstates a step's (one row
    // ran 2.6–2.8× as fast on two cores here, 64 rows 2.0×, whole resident steps of the
    // linear stack 1.75–1.83×: the step's norms, calls and syncs scale less).
    let smallest = best[1]
        .iter()
        .zip(&best[0])
        .map(|(all, one)| all / one)
        .fold(f64::INFINITY, f64::min);
    Ok(ThreadScaling {
        timed_on,
        all_cores,
        all_cores_speedup: smallest,
    })
}

pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::Bf16 => "bf16",
        DType::F8E4M3 => "f8_e4m3",
        DType::F8E5M2 => "f8_e5m2",
        DType::I8 => "i8",
        DType::U4 => "u4",
    }
}

/// Nanoseconds per element of each element-wise kernel, on 256 × 1024 values.
fn measure_elementwise<C: Compute>(
    compute: &C,
    options: &KernelOptions,
) -> Result<BTreeMap<ElementOp, f64>, crate::compute::ComputeError> {
    let (rows, cols) = (256usize, 1024usize);
    let elements = (rows * cols) as f64;
    let values: Vec<f32> = (0..rows * cols)
        .map(|index| ((index % 97) as f32 - 48.0) / 64.0)
        .collect();
    let mut x = compute.tensor(rows, cols)?;
    compute.write(&mut x, &values)?;
    let mut y = compute.tensor(rows, cols)?;
    compute.write(&mut y, &values)?;
    let vectors = compute.load_block(&weight_bytes(DType::F32, 2 * cols, 7))?;
    let table_rows = 4096usize;
    let table = compute.load_block(&weight_bytes(DType::F32, table_rows * cols, 11))?;
    let ids: Vec<u32> = (0..rows as u32)
        .map(|row| (row * 13) % table_rows as u32)
        .collect();
    let positions: Vec<u32> = (0..rows as u32).collect();
    let (heads, head_dim) = (16usize, 64usize);
    let inv_freq: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / 10_000f32.powf(2.0 * i as f32 / head_dim as f32))
        .collect();
    let gamma = TensorSlot::new(0, DType::F32, 1, cols);
    let beta = TensorSlot::new((cols * 4) as u64, DType::F32, 1, cols);
    let table_slot = TensorSlot::new(0, DType::F32, table_rows, cols);
    let mut costs = BTreeMap::new();
    for op in ElementOp::ALL {
        let seconds = match op {
            ElementOp::Move => time_calls(compute, options, |_| compute.copy(&x, &mut y))?,
            ElementOp::Add => time_calls(compute, options, |_| compute.add(&mut y, &x))?,
            ElementOp::Gather => time_calls(compute, options, |_| {
                let view = compute.block_view(&table);
                compute.gather_add(&view.weight(&table_slot)?, &ids, &mut y)
            })?,
            ElementOp::LayerNorm => time_calls(compute, options, |_| {
                let view = compute.block_view(&vectors);
                compute.layer_norm(
                    &x,
                    &view.weight(&gamma)?,
                    &view.weight(&beta)?,
                    1e-5,
                    &mut y,
                )
            })?,
            ElementOp::RmsNorm => time_calls(compute, options, |_| {
                let view = compute.block_view(&vectors);
                compute.rms_norm(&x, Some(&view.weight(&gamma)?), 1e-5, &mut y)
            })?,
            ElementOp::GeluErf => time_calls(compute, options, |_| {
                compute.copy(&x, &mut y)?;
                compute.gelu_erf(&mut y)
            })?,
            ElementOp::SiluMul => time_calls(compute, options, |_| {
                compute.copy(&x, &mut y)?;
                compute.silu_mul(&mut y, &x)
            })?,
            ElementOp::Rope => time_calls(compute, options, |_| {
                compute.rope(&mut y, heads, head_dim, &positions, &inv_freq)
            })?,
            ElementOp::Checksum => {
                let view_bytes = table_rows * cols * 4;
                let seconds = time_calls(compute, options, |_| {
                    compute.checksum(&compute.block_view(&table)).map(|_| ())
                })?;
                costs.insert(op, seconds / view_bytes as f64 * 1e9);
                continue;
            }
        };
        costs.insert(op, seconds / elements * 1e9);
    }
    // GELU and SiLU were timed with a copy in front (they work in place): take it out.
    let move_ns = costs.get(&ElementOp::Move).copied().unwrap_or(0.0);
    for op in [ElementOp::GeluErf, ElementOp::SiluMul] {
        if let Some(ns) = costs.get_mut(&op) {
            *ns = (*ns - move_ns).max(*ns * 0.1);
        }
    }
    Ok(costs)
}

/// Seconds per score·dim of an encoder's attention and of a decoder's cached one.
/// Seconds of a call that does almost nothing (an `add` of 16 values).
fn measure_call_overhead<C: Compute>(compute: &C) -> Result<f64, crate::compute::ComputeError> {
    let mut x = compute.tensor(1, 16)?;
    let y = compute.tensor(1, 16)?;
    let batch = 256;
    let mut samples = Vec::new();
    for _ in 0..16 {
        let began = Instant::now();
        for _ in 0..batch {
            compute.add(&mut x, &y)?;
        }
        compute.wait(compute.fence()?)?;
        samples.push(began.elapsed().as_secs_f64() / batch as f64);
    }
    Ok(median(&samples))
}
