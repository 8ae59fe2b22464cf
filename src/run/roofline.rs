//! The machine's roofline on the CPU backend, and the floor it puts under a step: the
//! bound a run is measured against is the machine's (memory bandwidth, FLOP/s, the
//! links), not the run's own compute time.
//!
//! Three figures, measured on this machine and cached (`roofline-local.json` in the
//! cache directory, remeasured after a week or on another host):
//! - **memory bandwidth**: every core streaming a 256 MiB buffer it did not write
//!   last (f32 sums; the best of three passes) — what any kernel reading weights from
//!   the device tier can reach at most;
//! - **peak product rate**, per `compute_dtype`: the compute adapter's GEMM at
//!   256 × 1024 × 1024 on every core, the best of three (the widest product a step
//!   runs on this backend). Under `f32`, bf16, f16 and FP8 weights are widened to f32,
//!   so the f32 figure is their peak too; under `bf16` the products run on bf16
//!   operands (AMX tiles where present), which has its own figure;
//! - **copy rate**: the CPU device copying 8 MiB blocks from pinned memory into its
//!   "VRAM" (its copy thread, streamed stores) — the link of this backend, the rate a
//!   run's streamed bytes are bounded by. A run takes it from here rather than timing
//!   ~200 MiB of copies after its last step (~45 ms a run on a 2-vCPU VM); `validate`
//!   and `bench` still time their own runs' copies (`RunPlan::measure_links`).
//!
//! A kernel's floor is the larger of its bytes over the bandwidth and its FLOPs over
//! the peak; a step's compute floor is the sum over its kernels (the family's own
//! steady step, recorded over the recording compute: `families::record`). A run never
//! calibrates for long on its own: the measurement takes about a second, once a week
//! (an unoptimised build measures each run, in a fraction of that, and caches nothing).

use std::path::Path;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::compute::work::{ElementOp, Kernel, Work};
use crate::compute::{Compute, ComputeDtype, DType, TensorSlot};
use crate::families::record::record_model;

/// The cached measurement's file name inside the cache directory.
pub const CACHED_ROOFLINE_FILE: &str = "roofline-local.json";
/// A cached measurement older than this is taken again.
const MAX_AGE_SECONDS: u64 = 7 * 24 * 3600;
/// The buffer the bandwidth is measured over: far above any last-level cache (8 MiB in
/// an unoptimised build — the tests' —, whose figures are only indicative anyway).
const BANDWIDTH_BYTES: usize = if cfg!(debug_assertions) {
    8 << 20
} else {
    256 << 20
};

/// This machine's roofline on the CPU backend.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Roofline {
    /// Bytes per second every core together reads from memory.
    pub memory_bytes_per_second: f64,
    /// The compute adapter's best product rate under the run's `compute_dtype`
    /// ([`Roofline::for_compute_dtype`]; measured and cached: the f32 one).
    pub flops_per_second: f64,
    /// The best product rate under `compute_dtype = bf16`.
    #[serde(default)]
    pub bf16_flops_per_second: f64,
    /// Bytes per second the CPU device copies large blocks into its "VRAM": the link
    /// of this backend (8 MiB blocks, the best of three; see the module notes).
    #[serde(default)]
    pub copy_bytes_per_second: f64,
    /// When it was measured (seconds since the epoch), and on which host.
    pub measured_at_unix: u64,
    pub host: u64,
}

impl Roofline {
    /// The cached roofline in `cache_dir` if it is this host's and recent, else one
    /// measured now (and written back; a cache that cannot be written is only noted).
    pub fn of_this_machine(cache_dir: &Path) -> Roofline {
        let path = cache_dir.join(CACHED_ROOFLINE_FILE);
        let now = unix_now();
        let cached = std::fs::read_to_string(&path)
            .ok()
            .and_then(|text| serde_json::from_str::<Roofline>(&text).ok())
            .filter(|cached| {
                cached.host == host_identity()
                    && now.saturating_sub(cached.measured_at_unix) < MAX_AGE_SECONDS
                    && cached.memory_bytes_per_second > 0.0
                    && cached.flops_per_second > 0.0
                    && cached.bf16_flops_per_second > 0.0
                    && cached.copy_bytes_per_second > 0.0
            });
        if let Some(cached) = cached {
            return cached;
        }
        // An unoptimised build (the tests') measures its own slow loops, not the
        // machine: its figures serve that process only, never cached on disk.
        if cfg!(debug_assertions) {
            static MEASURED: std::sync::OnceLock<Roofline> = std::sync::OnceLock::new();
            return *MEASURED.get_or_init(Roofline::measure);
        }
        let measured = Roofline::measure();
        let written = std::fs::create_dir_all(cache_dir).and_then(|()| {
            let text = serde_json::to_string_pretty(&measured).unwrap_or_default();
            std::fs::write(&path, text)
        });
        if let Err(error) = written {
            tracing::debug!("the roofline was not cached at {}: {error}", path.display());
        }
        measured
    }

    /// Forgets the cached roofline in `cache_dir`: a run whose kernels beat it shows
    /// it was measured on a busier machine, so the next run measures it again.
    pub fn forget_cached(cache_dir: &Path) {
        let _ = std::fs::remove_file(cache_dir.join(CACHED_ROOFLINE_FILE));
    }

    /// Measures every figure now (about a second).
    pub fn measure() -> Roofline {
        Roofline {
            memory_bytes_per_second: memory_bandwidth(),
            flops_per_second: product_peak(ComputeDtype::F32),
            bf16_flops_per_second: product_peak(ComputeDtype::Bf16),
            copy_bytes_per_second: copy_rate(),
            measured_at_unix: unix_now(),
            host: host_identity(),
        }
    }

    /// The roofline of a run whose many-rows products are in `compute_dtype`.
    pub fn for_compute_dtype(self, compute_dtype: ComputeDtype) -> Roofline {
        match compute_dtype {
            ComputeDtype::F32 => self,
            ComputeDtype::Bf16 => Roofline {
                flops_per_second: self.bf16_flops_per_second,
                ..self
            },
        }
    }

    /// The floor one kernel's work puts under a step, and whether memory (not FLOPs)
    /// sets it.
    pub fn kernel_floor(&self, kernel: &Kernel) -> (f64, bool) {
        let memory = memory_bytes(kernel) as f64 / self.memory_bytes_per_second;
        let flops = kernel.gemm_flops() / self.flops_per_second;
        (memory.max(flops), memory >= flops)
    }

    /// A step's compute floor: the sum of its kernels' floors, and the share of it
    /// memory sets.
    pub fn floor(&self, work: &Work) -> ComputeFloor {
        let mut floor = ComputeFloor::default();
        for kernel in &work.kernels {
            let (seconds, memory) = self.kernel_floor(kernel);
            floor.seconds += seconds;
            if memory {
                floor.memory_seconds += seconds;
            }
        }
        floor
    }
}

/// The least time a step's kernels take on this machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ComputeFloor {
    pub seconds: f64,
    /// Of `seconds`, the kernels whose bytes (not FLOPs) set their floor.
    pub memory_seconds: f64,
}

impl ComputeFloor {
    /// "memory bandwidth" or "FLOP/s": what sets most of the floor.
    pub fn limited_by(&self) -> &'static str {
        if self.memory_seconds * 2.0 >= self.seconds {
            "memory bandwidth"
        } else {
            "FLOP/s"
        }
    }
}

/// The kernels of the prepared model's steady step (its second; a decoder's first
/// decode step), from its own code over the recording compute.
pub fn steady_work(prepared: &super::Prepared) -> Work {
    let steps = record_model(&prepared.workload.model, 2).unwrap_or_default();
    let kernels = steps
        .last()
        .into_iter()
        .flatten()
        .flat_map(|work| work.kernels.iter().copied())
        .collect();
    Work { kernels }
}

/// Bytes a kernel must read from memory: its weights (and a checksum's block).
fn memory_bytes(kernel: &Kernel) -> u64 {
    match *kernel {
        Kernel::Elementwise {
            op: ElementOp::Checksum,
            elements,
        } => elements,
        _ => kernel.weight_bytes(),
    }
}

/// Blocks the copy rate is measured with: a layer of a large model, whose copies memory
/// limits, not the per-copy hand-off to the copy thread (~50 µs on a small VM, not a
/// property of the link).
const COPY_BLOCK_BYTES: u64 = 8 << 20;

/// The CPU device's copy of [`COPY_BLOCK_BYTES`] blocks from pinned memory into its
/// "VRAM", as a streamed step copies them ([`super::bound::measure_copy_rate`]), the
/// best of three; 0 where the device cannot be made (the cache then keeps nothing and
/// the next run measures again).
fn copy_rate() -> f64 {
    let capacity = super::bound::CALIBRATION_SPAN.max(COPY_BLOCK_BYTES);
    let device = match crate::device::CpuDevice::new(capacity) {
        Ok(device) => std::sync::Arc::new(device) as std::sync::Arc<dyn stagehand_actors::Device>,
        Err(_) => return 0.0,
    };
    (0..3)
        .map(|_| super::bound::measure_copy_rate(&device, COPY_BLOCK_BYTES).unwrap_or(0.0))
        .fold(0.0, f64::max)
}

/// How far ahead of its reads each stream of [`streaming_sum`] asks for a line (1 KiB:
/// 32 GB/s here against 28.5 without, 30.7 at 8 KiB).
const PREFETCH_BYTES: usize = 1024;

/// Every core summing its share of a buffer; the best of three passes, in bytes/s.
fn memory_bandwidth() -> f64 {
    let threads = std::thread::available_parallelism().map_or(1, |count| count.get());
    let values = BANDWIDTH_BYTES / 4;
    let buffer: Vec<f32> = (0..values).map(|i| (i % 7) as f32).collect();
    let share = values.div_ceil(threads);
    let mut best = 0f64;
    for _ in 0..3 {
        let started = Instant::now();
        let total: f32 = std::thread::scope(|scope| {
            let sums: Vec<_> = buffer
                .chunks(share)
                .map(|part| scope.spawn(move || streaming_sum(part)))
                .collect();
            sums.into_iter().map(|sum| sum.join().unwrap_or(0.0)).sum()
        });
        std::hint::black_box(total);
        best = best.max(BANDWIDTH_BYTES as f64 / started.elapsed().as_secs_f64().max(1e-9));
    }
    best
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

/// The CPU compute adapter's product of 256 rows by a 1024 × 1024 weight in
/// `compute_dtype` on every core; the best of three, in FLOP/s.
fn product_peak(compute_dtype: ComputeDtype) -> f64 {
    let (rows, inner, outer) = (256, 1024, 1024);
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
        let mut best = 0f64;
        for _ in 0..3 {
            let started = Instant::now();
            compute.linear(&x, &weight, None, &mut y)?;
            compute.wait(compute.fence()?)?;
            let flops = 2.0 * (rows * inner * outer) as f64;
            best = best.max(flops / started.elapsed().as_secs_f64().max(1e-9));
        }
        Ok(best)
    };
    measure().unwrap_or(0.0)
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

/// Which host this is: a hash of its name and its memory (a measurement is only
/// reused on the machine that took it).
fn host_identity() -> u64 {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let memory = crate::os::total_ram_bytes().unwrap_or(0);
    crate::compute::checksum::checksum(format!("{}:{memory}", name.trim()).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roofline() -> Roofline {
        Roofline {
            memory_bytes_per_second: 20e9,
            flops_per_second: 100e9,
            bf16_flops_per_second: 400e9,
            copy_bytes_per_second: 10e9,
            measured_at_unix: 0,
            host: 0,
        }
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
            (floor.seconds - 2.0 * roofline().kernel_floor(&linear(1, DType::Bf16)).0).abs()
                < 1e-12
        );
        let batch = Work {
            kernels: vec![linear(512, DType::F32)],
        };
        assert_eq!(roofline().floor(&batch).limited_by(), "FLOP/s");
    }

    #[test]
    fn a_measurement_is_positive_and_cached_only_by_an_optimised_build() {
        let dir = tempfile::tempdir().expect("temp dir");
        let measured = Roofline::of_this_machine(dir.path());
        assert!(measured.memory_bytes_per_second > 0.0 && measured.flops_per_second > 0.0);
        assert!(measured.bf16_flops_per_second > 0.0);
        let cached = dir.path().join(CACHED_ROOFLINE_FILE).exists();
        assert_eq!(cached, !cfg!(debug_assertions));
    }
}
