//! Taking the roofline's figures: each the best of several timed rounds.
//!
//! A figure taken from one short pass moved on its own: 59.5, then 124.3, then
//! 115.7 GFLOP/s within two minutes on one machine (a 5 ms product timed once, with
//! the cores still at idle clocks or shared with a compiler). So each figure is the
//! best of [`Rounds::count`] rounds, each repeating its kernel for at least
//! [`Rounds::seconds`] after a warm-up round that is thrown away: long enough that the
//! clock ramp and a short turbo burst are a small part of a round, and the best of
//! five lets a round that another process interrupted fall out.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::compute::{Compute, ComputeDtype, DType, TensorSlot};

/// How often and how long each figure is measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Rounds {
    /// Rounds whose best rate is kept (after one warm-up round, when rounds are timed).
    pub count: u32,
    /// Each round repeats its kernel for at least this long (0: one pass a round).
    pub seconds: f64,
}

impl Rounds {
    /// An optimised build: five rounds of a quarter second after a warm-up, ~6 s for
    /// the four figures, taken once a week.
    pub const OPTIMISED: Rounds = Rounds {
        count: 5,
        seconds: 0.25,
    };
    /// An unoptimised build (the tests'): three single passes; its figures measure its
    /// own slow loops and are only indicative.
    pub const UNOPTIMISED: Rounds = Rounds {
        count: 3,
        seconds: 0.0,
    };

    /// The rounds this build measures with.
    pub fn for_this_build() -> Rounds {
        if cfg!(debug_assertions) {
            Rounds::UNOPTIMISED
        } else {
            Rounds::OPTIMISED
        }
    }

    /// "best of 5 rounds of 0.25 s".
    pub fn describe(&self) -> String {
        if self.seconds > 0.0 {
            format!("best of {} rounds of {} s", self.count, self.seconds)
        } else {
            format!("best of {} passes", self.count)
        }
    }
}

/// Passes one round makes at most, whatever its seconds: a bound on every loop here.
const MAX_PASSES_PER_ROUND: u32 = 100_000;

/// The best rate of `rounds`; `round(seconds)` runs one round of at least that long
/// and returns its rate (`None`: it could not run, which counts as 0).
fn best_of(rounds: Rounds, mut round: impl FnMut(f64) -> Option<f64>) -> f64 {
    if rounds.seconds > 0.0 {
        // The warm-up: cores at idle clocks, pages not yet mapped, caches cold.
        let _ = round(rounds.seconds);
    }
    (0..rounds.count.max(1))
        .filter_map(|_| round(rounds.seconds))
        .fold(0.0, f64::max)
}

/// Repeats `pass` (which returns the units it did) until `seconds` have passed (at
/// least once); the units per second of them all.
fn repeated(seconds: f64, mut pass: impl FnMut() -> Option<f64>) -> Option<f64> {
    let started = Instant::now();
    let mut units = 0.0;
    for _ in 0..MAX_PASSES_PER_ROUND {
        units += pass()?;
        if started.elapsed().as_secs_f64() >= seconds {
            break;
        }
    }
    Some(units / started.elapsed().as_secs_f64().max(1e-9))
}

/// The buffer the bandwidth is measured over: far above any last-level cache (8 MiB in
/// an unoptimised build — the tests' —, whose figures are only indicative anyway).
const BANDWIDTH_BYTES: usize = if cfg!(debug_assertions) {
    8 << 20
} else {
    256 << 20
};

/// How far ahead of its reads each stream of [`streaming_sum`] asks for a line (1 KiB:
/// 32 GB/s here against 28.5 without, 30.7 at 8 KiB).
const PREFETCH_BYTES: usize = 1024;

/// Every core summing its share of a buffer it did not write last, in bytes/s: each
/// round every core sums its share over and over until the round's seconds passed.
pub(super) fn memory_bandwidth(rounds: Rounds) -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |count| count.get());
    let values = BANDWIDTH_BYTES / 4;
    let buffer: Vec<f32> = (0..values).map(|i| (i % 7) as f32).collect();
    let share = values.div_ceil(threads);
    best_of(rounds, |seconds| {
        let started = Instant::now();
        let read_bytes: usize = std::thread::scope(|scope| {
            let readers: Vec<_> = buffer
                .chunks(share)
                .map(|part| {
                    scope.spawn(move || {
                        let mut read = 0usize;
                        for _ in 0..MAX_PASSES_PER_ROUND {
                            std::hint::black_box(streaming_sum(part));
                            read += std::mem::size_of_val(part);
                            if started.elapsed().as_secs_f64() >= seconds {
                                break;
                            }
                        }
                        read
                    })
                })
                .collect();
            readers
                .into_iter()
                .map(|reader| reader.join().unwrap_or(0))
                .sum()
        });
        Some(read_bytes as f64 / started.elapsed().as_secs_f64().max(1e-9))
    })
}

/// The sum of `values` read as four streams at once (the four quarters side by side,
/// sixteen independent lanes each), each asking for its line [`PREFETCH_BYTES`] ahead
/// as the decode kernels do: a loop that memory limits, not the adder or one stream's
/// prefetcher. A single running `f32` sum waits on each add's latency — a few GB/s a
/// core — and measured the adder: a bound three times the step it bounds; one stream
/// a core reached ~16 GB/s on a Xeon where a decode's gemv, reading four weight rows at
/// once, read ~19; without the prefetches 28.5 GB/s here where the decode read 28.7.
fn streaming_sum(values: &[f32]) -> f32 {
    const LANES: usize = 16;
    const STREAMS: usize = 4;
    let quarter = values.len() / (STREAMS * LANES) * LANES;
    let (streams, rest) = values.split_at(quarter * STREAMS);
    let mut parts = streams.chunks_exact(quarter.max(1));
    let (a, b, c, d) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), Some(c), Some(d)) => (a, b, c, d),
        _ => return values.iter().sum(),
    };
    let mut lanes = [[0f32; LANES]; STREAMS];
    let chunks = a
        .chunks_exact(LANES)
        .zip(b.chunks_exact(LANES))
        .zip(c.chunks_exact(LANES).zip(d.chunks_exact(LANES)));
    for ((a, b), (c, d)) in chunks {
        #[cfg(target_arch = "x86_64")]
        for stream in [a, b, c, d] {
            let ahead = stream.as_ptr().cast::<i8>().wrapping_add(PREFETCH_BYTES);
            // SAFETY: a prefetch only hints the cache; it never faults, even past the
            // buffer's end.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ahead);
            }
        }
        for (lane, chunk) in lanes.iter_mut().zip([a, b, c, d]) {
            for (sum, value) in lane.iter_mut().zip(chunk) {
                *sum += value;
            }
        }
    }
    lanes.iter().flatten().sum::<f32>() + rest.iter().sum::<f32>()
}

/// The product the peak rate is measured with: 256 rows by a 1024 × 1024 weight; a
/// sixteenth of it in an unoptimised build (the tests'), whose own bf16 kernels run
/// uninlined and whose figures are only indicative: the full product there took
/// seconds of every test run that printed a summary.
const PRODUCT_SHAPE: (usize, usize, usize) = if cfg!(debug_assertions) {
    (64, 512, 512)
} else {
    (256, 1024, 1024)
};

/// The CPU compute adapter's product of 256 rows by a 1024 × 1024 weight in
/// `compute_dtype` on every core (the widest product a step runs on this backend), in
/// FLOP/s; 0 where the adapter cannot run it.
pub(super) fn product_peak(compute_dtype: ComputeDtype, rounds: Rounds) -> f64 {
    let (rows, inner, outer) = PRODUCT_SHAPE;
    let cores = std::thread::available_parallelism().map_or(1, |count| count.get());
    let compute = crate::device::CpuCompute::with_threads(cores).with_compute_dtype(compute_dtype);
    let weights: Vec<f32> = (0..inner * outer)
        .map(|i| ((i % 13) as f32 - 6.0) * 1e-2)
        .collect();
    let bytes = DType::F32.encode(&weights);
    let measure = || -> Result<f64, crate::compute::ComputeError> {
        let block = compute.load_block(&bytes)?;
        let view = compute.block_view(&block);
        let weight = view.weight(&TensorSlot::new(0, DType::F32, outer, inner))?;
        let mut x = compute.tensor(rows, inner)?;
        compute.write(&mut x, &vec![0.5; rows * inner])?;
        let mut y = compute.tensor(rows, outer)?;
        let flops = 2.0 * (rows * inner * outer) as f64;
        let mut product = || -> Result<(), crate::compute::ComputeError> {
            compute.linear(&x, &weight, None, &mut y)?;
            compute.wait(compute.fence()?)
        };
        Ok(best_of(rounds, |seconds| {
            repeated(seconds, || product().ok().map(|()| flops))
        }))
    };
    measure().unwrap_or(0.0)
}

/// Blocks the copy rate is measured with: a layer of a large model, whose copies memory
/// limits, not the per-copy hand-off to the copy thread (~50 µs on a small VM, not a
/// property of the link).
const COPY_BLOCK_BYTES: u64 = 8 << 20;

/// The CPU device's copy of [`COPY_BLOCK_BYTES`] blocks from pinned memory into its
/// "VRAM", as a streamed step copies them ([`crate::run::bound::measure_copy_rate`]);
/// 0 where the device cannot be made (the cache then keeps nothing and the next run
/// measures again).
pub(super) fn copy_rate(rounds: Rounds) -> f64 {
    let capacity = crate::run::bound::CALIBRATION_SPAN.max(COPY_BLOCK_BYTES);
    let device = match crate::device::CpuDevice::new(capacity) {
        Ok(device) => std::sync::Arc::new(device) as std::sync::Arc<dyn stagehand_actors::Device>,
        Err(_) => return 0.0,
    };
    best_of(rounds, |seconds| {
        // Each measurement copies the same bytes, so the round's rate is the harmonic
        // mean of theirs: its bytes over its copying time.
        let (mut measurements, mut seconds_per_byte) = (0u32, 0.0);
        let started = Instant::now();
        for _ in 0..MAX_PASSES_PER_ROUND {
            let rate = crate::run::bound::measure_copy_rate(&device, COPY_BLOCK_BYTES).ok()?;
            measurements += 1;
            seconds_per_byte += 1.0 / rate.max(1e-9);
            if started.elapsed().as_secs_f64() >= seconds {
                break;
            }
        }
        Some(f64::from(measurements) / seconds_per_byte)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_round_is_kept_and_a_timed_round_is_warmed_up_first() {
        // Rates 1, 5, 3 after a warm-up of 100: the warm-up is thrown away.
        let mut rates = [100.0, 1.0, 5.0, 3.0].into_iter();
        let rounds = Rounds {
            count: 3,
            seconds: 0.1,
        };
        assert_eq!(best_of(rounds, |_| rates.next()), 5.0);
        // Untimed rounds have no warm-up.
        let mut rates = [100.0, 1.0, 5.0].into_iter();
        assert_eq!(best_of(Rounds::UNOPTIMISED, |_| rates.next()), 100.0);
    }

    #[test]
    fn a_round_that_cannot_run_counts_as_nothing() {
        assert_eq!(best_of(Rounds::UNOPTIMISED, |_| None), 0.0);
        assert_eq!(repeated(0.0, || None), None);
    }

    #[test]
    fn the_streaming_sum_adds_every_value() {
        let values: Vec<f32> = (0..1000).map(|i| (i % 7) as f32).collect();
        assert_eq!(streaming_sum(&values), values.iter().sum::<f32>());
    }
}
