//! The machine's roofline on the CPU backend, and the floor it puts under a step: the
//! bound a run is measured against is the machine's (memory bandwidth, FLOP/s, the
//! links), not the run's own compute time.
//!
//! Three figures, measured on this machine and cached (`roofline-local.json` in the
//! cache directory, remeasured after a week, on another host, CPU model, set of vector
//! extensions or core count; `stagehand calibrate --roofline` measures them again):
//! - **memory bandwidth**: every core streaming a 256 MiB buffer it did not write
//!   last (f32 sums) — what any kernel reading weights from the device tier can reach
//!   at most;
//! - **peak product rate**, per `compute_dtype`: the compute adapter's GEMM at
//!   256 × 1024 × 1024 on every core (the widest product a step runs on this backend).
//!   Under `f32`, bf16, f16 and FP8 weights are widened to f32, so the f32 figure is
//!   their peak too; under `bf16` the products run on bf16 operands (AMX tiles where
//!   present), which has its own figure;
//! - **copy rate**: the CPU device copying 8 MiB blocks from pinned memory into its
//!   "VRAM" (its copy thread, streamed stores) — the link of this backend, the rate a
//!   run's streamed bytes are bounded by. A run takes it from here rather than timing
//!   ~200 MiB of copies after its last step (~45 ms a run on a 2-vCPU VM); `validate`
//!   and `bench` still time their own runs' copies (`RunPlan::measure_links`).
//!
//! Each figure is the best of several timed rounds (`measure.rs`), so two measurements
//! on an idle machine agree (`scripts/roofline-repeat.sh` checks it). A kernel's floor
//! is the larger of its bytes over the bandwidth and its FLOPs over the peak; a step's
//! compute floor is the sum over its kernels (the family's own steady step, recorded
//! over the recording compute: `families::record`). A bound is a floor no step can
//! beat: a step that computed faster than it shows a figure was measured too low, and
//! the figure is raised to what the step reached ([`Roofline::raised_to_step`]) and
//! cached so, never reported as "179 % of the roofline".

mod machine;
mod measure;
mod raise;

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::compute::work::{ElementOp, Kernel, Work};
use crate::compute::ComputeDtype;
use crate::families::record::record_model;

pub use machine::{age_words, unix_now, utc_text, Machine};
pub use measure::Rounds;
pub use raise::Raise;

/// The cached measurement's file name inside the cache directory.
pub const CACHED_ROOFLINE_FILE: &str = "roofline-local.json";
/// A cached measurement older than this is taken again.
const MAX_AGE_SECONDS: u64 = 7 * 24 * 3600;
/// An unoptimised build's own measurement, kept beside the cache for the processes of
/// the same build that follow (a test table runs the debug binary hundreds of times):
/// never read by an optimised build, whose [`Roofline::cached`] asks for its rounds.
pub const UNOPTIMISED_ROOFLINE_FILE: &str = "roofline-unoptimised.json";
/// An unoptimised build's kept measurement older than this (a rebuilt binary's loops
/// may run at another speed) is taken again.
const MAX_UNOPTIMISED_AGE_SECONDS: u64 = 3600;

/// This machine's roofline on the CPU backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    /// of this backend (8 MiB blocks; see the module notes).
    #[serde(default)]
    pub copy_bytes_per_second: f64,
    /// When it was measured (seconds since the epoch), on which machine, how.
    pub measured_at_unix: u64,
    #[serde(default)]
    pub machine: Machine,
    #[serde(default)]
    pub rounds: Rounds,
    /// The last time a run beat it and raised a figure to what the run reached.
    #[serde(default)]
    pub raised: Option<Raised>,
}

/// A figure raised because a run beat it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Raised {
    pub at_unix: u64,
    /// What was raised and by how much: "FLOP/s ×1.79".
    pub what: String,
}

/// A roofline for a run, and where it came from.
#[derive(Debug, Clone)]
pub struct Obtained {
    pub roofline: Roofline,
    /// Read from the cache file (else measured in this process).
    pub from_cache: bool,
    /// Measured by this call (an unoptimised build measures once a process).
    pub measured_now: bool,
}

impl Roofline {
    /// The cached roofline in `cache_dir` if it was taken on this machine, thoroughly
    /// and recently, else one measured now (and written back in an optimised build; a
    /// cache that cannot be written is only noted).
    pub fn of_this_machine(cache_dir: &Path) -> Obtained {
        if let Some(cached) = Roofline::cached(cache_dir) {
            return Obtained {
                roofline: cached,
                from_cache: true,
                measured_now: false,
            };
        }
        // An unoptimised build (the tests') measures its own slow loops, not the
        // machine: its figures serve that build only, kept in a file of their own.
        if cfg!(debug_assertions) {
            return Roofline::unoptimised(cache_dir);
        }
        let measured = Roofline::measure();
        measured.store_noting_failure(cache_dir);
        Obtained {
            roofline: measured,
            from_cache: false,
            measured_now: true,
        }
    }

    /// An unoptimised build's roofline: this process's, else one an earlier process of
    /// such a build kept in `cache_dir` within the hour, else one measured now and kept.
    fn unoptimised(cache_dir: &Path) -> Obtained {
        static MEASURED: std::sync::OnceLock<Roofline> = std::sync::OnceLock::new();
        if let Some(roofline) = MEASURED
            .get()
            .cloned()
            .or_else(|| Roofline::kept_unoptimised(cache_dir))
        {
            return Obtained {
                roofline,
                from_cache: false,
                measured_now: false,
            };
        }
        let measured = MEASURED.get_or_init(Roofline::measure).clone();
        if let Err(error) = measured.store_as(cache_dir, UNOPTIMISED_ROOFLINE_FILE) {
            tracing::debug!("the unoptimised roofline was not kept: {error}");
        }
        Obtained {
            roofline: measured,
            from_cache: false,
            measured_now: true,
        }
    }

    /// The unoptimised build's roofline kept in `cache_dir`, if it was taken on this
    /// machine within [`MAX_UNOPTIMISED_AGE_SECONDS`].
    pub fn kept_unoptimised(cache_dir: &Path) -> Option<Roofline> {
        let text = std::fs::read_to_string(cache_dir.join(UNOPTIMISED_ROOFLINE_FILE)).ok()?;
        let kept = serde_json::from_str::<Roofline>(&text).ok()?;
        let recent = unix_now().saturating_sub(kept.measured_at_unix) < MAX_UNOPTIMISED_AGE_SECONDS;
        let positive = kept.memory_bytes_per_second > 0.0 && kept.flops_per_second > 0.0;
        (recent && positive && kept.machine == Machine::this_one()).then_some(kept)
    }

    /// The roofline cached in `cache_dir`, if it was taken on this machine (host, CPU
    /// model, vector extensions, cores), with at least an optimised build's rounds,
    /// within the last week.
    pub fn cached(cache_dir: &Path) -> Option<Roofline> {
        let text = std::fs::read_to_string(cache_dir.join(CACHED_ROOFLINE_FILE)).ok()?;
        let cached = serde_json::from_str::<Roofline>(&text).ok()?;
        let thorough = cached.rounds.count >= Rounds::OPTIMISED.count
            && cached.rounds.seconds >= Rounds::OPTIMISED.seconds;
        let recent = unix_now().saturating_sub(cached.measured_at_unix) < MAX_AGE_SECONDS;
        let positive = cached.memory_bytes_per_second > 0.0
            && cached.flops_per_second > 0.0
            && cached.bf16_flops_per_second > 0.0
            && cached.copy_bytes_per_second > 0.0;
        (thorough && recent && positive && cached.machine == Machine::this_one()).then_some(cached)
    }

    /// Writes this roofline as the cached one in `cache_dir`.
    pub fn store(&self, cache_dir: &Path) -> std::io::Result<()> {
        self.store_as(cache_dir, CACHED_ROOFLINE_FILE)
    }

    /// Writes this roofline to `cache_dir/name`, whole: through a file of this
    /// process's own that is renamed over it, so a run of the same build reading it
    /// side by side never sees half a file.
    fn store_as(&self, cache_dir: &Path, name: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(cache_dir)?;
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        let partial = cache_dir.join(format!("{name}.{}.partial", std::process::id()));
        std::fs::write(&partial, text)?;
        std::fs::rename(&partial, cache_dir.join(name))
    }

    /// [`Roofline::store`], where a cache that cannot be written is only noted: the
    /// next run measures again.
    pub fn store_noting_failure(&self, cache_dir: &Path) {
        if let Err(error) = self.store(cache_dir) {
            tracing::debug!(
                "the roofline was not cached in {}: {error}",
                cache_dir.display()
            );
        }
    }

    /// Measures every figure now, with this build's rounds (~6 s optimised).
    pub fn measure() -> Roofline {
        Roofline::measure_with(Rounds::for_this_build())
    }

    /// Measures every figure now, each the best of `rounds`.
    pub fn measure_with(rounds: Rounds) -> Roofline {
        Roofline {
            memory_bytes_per_second: measure::memory_bandwidth(rounds),
            flops_per_second: measure::product_peak(ComputeDtype::F32, rounds),
            bf16_flops_per_second: measure::product_peak(ComputeDtype::Bf16, rounds),
            copy_bytes_per_second: measure::copy_rate(rounds),
            measured_at_unix: unix_now(),
            machine: Machine::this_one(),
            rounds,
            raised: None,
        }
    }

    /// The roofline of a run whose many-rows products are in `compute_dtype`.
    pub fn for_compute_dtype(&self, compute_dtype: ComputeDtype) -> Roofline {
        match compute_dtype {
            ComputeDtype::F32 => self.clone(),
            ComputeDtype::Bf16 => Roofline {
                flops_per_second: self.bf16_flops_per_second,
                ..self.clone()
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

    /// Where the figures came from, in a user's words: "measured 2025-06-01 12:03 UTC
    /// (4 min ago; best of 5 rounds of 0.25 s on AMD EPYC, 2 cores, avx avx2 fma, avx2 kernels)",
    /// and the last raise.
    pub fn provenance(&self, now_unix: u64) -> String {
        let mut text = format!(
            "measured {} ({} ago; {} on {})",
            utc_text(self.measured_at_unix),
            age_words(now_unix.saturating_sub(self.measured_at_unix)),
            self.rounds.describe(),
            self.machine.describe()
        );
        if let Some(raised) = &self.raised {
            text.push_str(&format!(
                "; raised {} at {} by a run that beat it",
                raised.what,
                utc_text(raised.at_unix)
            ));
        }
        text
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

/// A roofline of round figures for the module's tests (20 GB/s, 100 GFLOP/s f32,
/// 400 bf16, copies at 10 GB/s).
#[cfg(test)]
fn test_roofline() -> Roofline {
    Roofline {
        memory_bytes_per_second: 20e9,
        flops_per_second: 100e9,
        bf16_flops_per_second: 400e9,
        copy_bytes_per_second: 10e9,
        measured_at_unix: 0,
        machine: Machine::default(),
        rounds: Rounds::OPTIMISED,
        raised: None,
    }
}

#[cfg(test)]
mod tests;
