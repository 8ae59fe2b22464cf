//! `stagehand calibrate`: a hardware profile of this machine, measured on the backend
//! a run would use, so `simulate --hardware local` predicts from figures instead of
//! datasheets.
//!
//! Each part measures through the same adapters a run uses: copies through the
//! `Device` port (on the CPU backend a `memcpy` on the copy thread), reads through the
//! storage adapters (buffered `pread` after dropping the file's pages, the page cache
//! warm, and O_DIRECT), the kernels through the compute port (`CpuCompute`), and how
//! copies and compute slow each other when they share the cores and the memory bus.
//! A part that cannot run (a read-only or full filesystem, no O_DIRECT) is skipped
//! with its reason; the rest still runs. The profile (`profile.rs`) is the format of
//! `config/hardware/*.toml` with every figure's measurement in a comment.

mod contention;
mod copy;
mod disk;
mod kernels;
mod local;
mod profile;
mod speed;
pub mod validate;

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

pub use contention::{measure_contention, ContentionFigures, OverlapRun};
pub use copy::{measure_copies, CopyFigures};
pub use disk::{measure_disk, DiskFigures, DiskOptions};
pub use kernels::{dtype_name, measure_kernels, KernelFigures, KernelOptions};
pub use local::{
    local_profile, local_profile_with, LocalProfile, CACHED_PROFILE_FILE, LOCAL, MAX_AGE_SECONDS,
};
pub use profile::{profile_toml, shared_spec};
pub use speed::{speed_against, SpeedProbe};

/// One measured rate: what it moved or computed per second, over how many samples,
/// and how it was measured (written into the profile as a comment).
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Units per second (bytes or FLOPs), from the median sample.
    pub per_second: f64,
    /// The slowest and fastest sample, in the same unit.
    pub slowest_per_second: f64,
    pub fastest_per_second: f64,
    pub samples: usize,
    pub how: String,
}

impl Measured {
    /// A rate of `units` per sample from each sample's seconds.
    pub fn rate(units: f64, seconds: &[f64], how: String) -> Self {
        let rate = |seconds: f64| units / seconds.max(1e-12);
        let slowest = seconds.iter().copied().fold(0.0, f64::max);
        let fastest = seconds.iter().copied().fold(f64::INFINITY, f64::min);
        Self {
            per_second: rate(median(seconds)),
            slowest_per_second: rate(slowest),
            fastest_per_second: if fastest.is_finite() {
                rate(fastest)
            } else {
                0.0
            },
            samples: seconds.len(),
            how,
        }
    }
}

/// The median of some samples (the upper one of an even count); 0 when empty.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// What a calibration measures (`--measure`), all by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Part {
    /// Copies into the device tier (pinned, pageable, latency).
    Copy,
    /// Reads: buffered cold, page cache, O_DIRECT, request latency.
    Disk,
    /// The kernels of the model families (GEMM/GEMV by rows and dtype, the rest).
    Compute,
    /// Copies and compute at once: the memory bus and cores they share.
    Shared,
}

impl Part {
    pub const ALL: [Part; 4] = [Part::Copy, Part::Disk, Part::Compute, Part::Shared];

    pub fn name(self) -> &'static str {
        match self {
            Part::Copy => "copy",
            Part::Disk => "disk",
            Part::Compute => "compute",
            Part::Shared => "shared",
        }
    }
}

/// A measurement that did not run, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub measurement: String,
    pub reason: String,
}

/// What to measure and where.
#[derive(Debug, Clone)]
pub struct CalibrateOptions {
    pub parts: Vec<Part>,
    pub disk: DiskOptions,
    /// Bytes of each timed copy (a typical block).
    pub copy_block_bytes: u64,
    /// Timed repetitions of each copy.
    pub copy_repeats: usize,
    pub kernels: KernelOptions,
    /// Measure the CUDA backend (GPU 0) instead of the CPU one.
    pub cuda: bool,
}

impl CalibrateOptions {
    /// The full calibration (14 s on the 2-core VM, loaded), reading in `dir`.
    pub fn full(dir: PathBuf) -> Self {
        Self {
            parts: Part::ALL.to_vec(),
            disk: DiskOptions::new(dir, 256 << 20),
            copy_block_bytes: 16 << 20,
            copy_repeats: 16,
            kernels: KernelOptions::full(),
            cuda: false,
        }
    }

    /// A shorter one (13 s on a 2-vCPU VM, the full one 50 s): fewer shapes, passes
    /// and bytes read; what `--hardware local` runs when it has to calibrate on the fly.
    pub fn quick(dir: PathBuf) -> Self {
        Self {
            parts: Part::ALL.to_vec(),
            disk: DiskOptions::new(dir, 64 << 20),
            copy_block_bytes: 16 << 20,
            copy_repeats: 8,
            kernels: KernelOptions::quick(),
            cuda: false,
        }
    }

    pub fn measures(&self, part: Part) -> bool {
        self.parts.contains(&part)
    }
}

/// The machine the figures belong to, so a cached profile can tell it is stale.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostIdentity {
    pub hostname: String,
    pub cpu_model: String,
    pub cpus: usize,
    pub ram_bytes: u64,
}

impl HostIdentity {
    pub fn current() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".to_string());
        let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_string())
            .unwrap_or_else(|_| "unknown".to_string());
        Self {
            hostname,
            cpu_model,
            cpus: std::thread::available_parallelism().map_or(1, |count| count.get()),
            ram_bytes: crate::device::host_memory::total_ram_bytes().unwrap_or(0),
        }
    }

    /// One line that names the machine (kept in the profile's header).
    pub fn fingerprint(&self) -> String {
        format!(
            "{} | {} | {} cpus | {} bytes RAM",
            self.hostname, self.cpu_model, self.cpus, self.ram_bytes
        )
    }
}

/// Everything a calibration measured.
#[derive(Debug, Clone, Serialize)]
pub struct Calibration {
    pub host: HostIdentity,
    /// `cpu` or `cuda`: the backend measured.
    pub backend: String,
    /// The device's name and memory (the GPU's; the host's RAM on the CPU backend).
    pub device_name: String,
    pub device_bytes: u64,
    /// Seconds since the Unix epoch when it finished.
    pub calibrated_at_unix: u64,
    /// One-minute load average before and after (other processes skew every figure).
    pub load_average_before: Option<f64>,
    pub load_average_after: Option<f64>,
    pub copies: Option<CopyFigures>,
    pub disk: Option<DiskFigures>,
    pub kernels: Option<KernelFigures>,
    pub contention: Option<ContentionFigures>,
    pub skipped: Vec<Skipped>,
}

impl Calibration {
    /// Whether anything at all was measured.
    pub fn measured_anything(&self) -> bool {
        self.copies.is_some()
            || self.kernels.is_some()
            || self.contention.is_some()
            || self
                .disk
                .as_ref()
                .is_some_and(DiskFigures::measured_anything)
    }
}

/// Why a calibration produced nothing.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("nothing could be measured: {}", reasons(.0))]
    NothingMeasured(Vec<Skipped>),
    /// The measured figures do not make a loadable profile.
    #[error("the calibrated profile: {0}")]
    Profile(String),
}

fn reasons(skipped: &[Skipped]) -> String {
    skipped
        .iter()
        .map(|skipped| format!("{} skipped ({})", skipped.measurement, skipped.reason))
        .collect::<Vec<_>>()
        .join("; ")
}

/// Runs the asked-for measurements on the CPU backend. `progress` is told what runs.
pub fn calibrate(
    options: &CalibrateOptions,
    progress: &mut dyn FnMut(&str),
) -> Result<Calibration, CalibrateError> {
    let load_average_before = load_average();
    let mut skipped = Vec::new();
    let mut copies = None;
    let opened = if options.cuda {
        open_cuda()
    } else {
        // Room for the first-touch probe's fresh arena (a limit, not an allocation).
        crate::device::CpuDevice::new(
            options.copy_block_bytes.max(1 << 20) * (copy::FIRST_TOUCH_CHUNKS as u64 + 1),
        )
        .map(|device| Backend::Cpu(Arc::new(device)))
        .map_err(|error| format!("no CPU device: {error}"))
    };
    let backend = match opened {
        Ok(backend) => Some(backend),
        Err(reason) => {
            skipped.push(Skipped {
                measurement: "copy".to_string(),
                reason,
            });
            None
        }
    };
    let device = backend.as_ref().map(Backend::device);
    if options.measures(Part::Copy) {
        if let Some(device) = &device {
            progress("copies into the device tier");
            match measure_copies(device, options.copy_block_bytes, options.copy_repeats) {
                Ok(figures) => copies = Some(figures),
                Err(reason) => skipped.push(Skipped {
                    measurement: "copy".to_string(),
                    reason,
                }),
            }
        }
    }
    let mut disk = None;
    if options.measures(Part::Disk) {
        progress("disk reads");
        let figures = measure_disk(&options.disk);
        skipped.extend(figures.skipped.iter().cloned());
        disk = Some(figures);
    }
    let mut kernels = None;
    if options.measures(Part::Compute) {
        progress("kernels (GEMM/GEMV by rows and dtype, norms, attention)");
        match measure_backend_kernels(backend.as_ref(), &options.kernels) {
            Ok(figures) => kernels = Some(figures),
            Err(reason) => skipped.push(Skipped {
                measurement: "compute".to_string(),
                reason,
            }),
        }
    }
    let mut contention = None;
    // A GPU's copy engine and SMs do not share the host's cores and bus.
    if options.measures(Part::Shared) && !options.cuda {
        if let Some(device) = &device {
            progress("copies and compute at once");
            match measure_contention(device, options.copy_block_bytes) {
                Ok(figures) => contention = Some(figures),
                Err(reason) => skipped.push(Skipped {
                    measurement: "shared".to_string(),
                    reason,
                }),
            }
        }
    }
    let host = HostIdentity::current();
    let calibration = Calibration {
        backend: if options.cuda { "cuda" } else { "cpu" }.to_string(),
        device_name: device
            .as_ref()
            .map_or_else(|| "unknown".to_string(), |device| device.name()),
        device_bytes: device
            .as_ref()
            .and_then(|device| device.memory_info().ok())
            .filter(|_| options.cuda)
            .map_or(host.ram_bytes, |memory| memory.total_bytes),
        host,
        calibrated_at_unix: unix_now(),
        load_average_before,
        load_average_after: load_average(),
        copies,
        disk,
        kernels,
        contention,
        skipped: skipped.clone(),
    };
    if !calibration.measured_anything() {
        return Err(CalibrateError::NothingMeasured(skipped));
    }
    Ok(calibration)
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// The one-minute load average, where /proc says.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The device and compute a calibration measures through.
enum Backend {
    Cpu(Arc<crate::device::CpuDevice>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::device::cuda::CudaDevice>),
}

impl Backend {
    fn device(&self) -> Arc<dyn stagehand_actors::Device> {
        match self {
            Backend::Cpu(device) => Arc::clone(device) as Arc<dyn stagehand_actors::Device>,
            #[cfg(feature = "cuda")]
            Backend::Cuda(device) => Arc::clone(device) as Arc<dyn stagehand_actors::Device>,
        }
    }
}

#[cfg(feature = "cuda")]
fn open_cuda() -> Result<Backend, String> {
    crate::device::cuda::CudaDevice::open(0)
        .map(|device| Backend::Cuda(Arc::new(device)))
        .map_err(|error| format!("no CUDA device: {error}"))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<Backend, String> {
    Err("this stagehand was built without CUDA (--no-default-features)".to_string())
}

/// The kernels timed on the backend's compute port (the CPU's without a device).
fn measure_backend_kernels(
    backend: Option<&Backend>,
    options: &KernelOptions,
) -> Result<KernelFigures, String> {
    match backend {
        #[cfg(feature = "cuda")]
        Some(Backend::Cuda(device)) => {
            let compute = crate::device::cuda::CudaCompute::new(device)
                .map_err(|error| format!("no CUDA compute: {error}"))?;
            measure_kernels(&compute, options)
        }
        _ => {
            let threads = options.compute_threads.max(1);
            let compute = crate::device::CpuCompute::with_threads(threads);
            let mut figures = measure_kernels(&compute, options)?;
            figures.how.push_str(&format!(
                "; on {threads} compute thread{}, a streamed run's default here (every core but one)",
                if threads == 1 { "" } else { "s" }
            ));
            // A resident step, or one of many rows, computes on every core.
            let cores = crate::settings::machine_cores();
            if cores > threads {
                let every_core = crate::device::CpuCompute::with_threads(cores);
                let scaling = kernels::thread_scaling(
                    (&compute, threads as u64),
                    (&every_core, cores as u64),
                    options,
                )?;
                figures.how.push_str(&format!(
                    "; threads: on all {cores} cores the products ran {:.2}× as fast (f32 1024², the least over 1/8/64 rows), which a step that keeps every core gains",
                    scaling.all_cores_speedup
                ));
                figures.costs.threads = Some(scaling);
            }
            Ok(figures)
        }
    }
}
