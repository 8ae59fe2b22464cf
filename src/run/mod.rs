//! Wires settings, a model, the adapters and a workload into a run: what `stagehand
//! run` and `stagehand bench` share.

pub mod bound;
mod budget;
#[cfg(feature = "cuda")]
mod cuda;
pub mod driver;
mod effective;
mod error;
mod execute;
mod first_step;
mod from_family;
mod from_index;
mod from_session;
pub mod loaded;
pub mod memory;
mod peak_rss;
mod physical;
mod prepare;
mod recorded;
mod reference;
mod refusal;
pub mod report;
pub mod roofline;
pub mod summary;
pub mod text;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use stagehand_actors::{NoObserver, Observer, ResidencyPolicy, SessionConfig, Storage};

use crate::families::FamilyError;
use crate::model::demo::DemoSpec;
use crate::model::demo_moe::MoeSpec;
use crate::model::ModelIndex;
use crate::run::bound::{LinkRates, StepBound};
use crate::run::driver::RunReport;
use crate::settings::Settings;
use crate::storage::{open_storage, StorageFile, StorageOptions};

pub use crate::families::{
    DecoderInput, EncoderInput, Extras, MoeOptions, PromptInput, WorkloadKind, BUILT_IN_PROMPT,
    BUILT_IN_SENTENCES,
};
pub use crate::os::available_ram_bytes;
pub use budget::{
    automatic_budget, budgets_for, demo_pin_room, fitting_depth, lora_pack_bytes,
    lora_region_bytes, plan_minimum_bytes, resident_need_bytes, resolve_budgets, BudgetAsk,
    Budgets, DEFAULT_DEMO_PIN_FRACTION, DEFAULT_VRAM_FRACTION,
};
#[cfg(feature = "cuda")]
pub use cuda::{execute_cuda_with, CudaOutcome, CudaRunOptions, VramFigures};
pub use effective::{effective_run, EffectiveValue};
pub use execute::{execute, execute_cuda, execute_on};
pub use first_step::verify_first_step;
pub use peak_rss::{peak_rss_bytes, reset_peak_rss, resident_bytes};
pub use physical::RooflineUsed;
pub use prepare::{
    open_index, parse_token_ids, prepare, prepare_with, texts_from_file, NamedLora, Prepared,
};

pub use error::{Budget, Cause, RunError};

/// The MoE demo model in the cache directory, written if missing, different or
/// corrupt (see [`crate::model::cache`]).
pub fn ensure_moe_model(cache_dir: &Path, spec: &MoeSpec) -> Result<PathBuf, RunError> {
    crate::model::cache::ensure_moe_model(cache_dir, spec).map_err(cache_error)
}

/// The demo model in the cache directory, written if missing, different or corrupt
/// (see [`crate::model::cache`]).
pub fn ensure_demo_model(cache_dir: &Path, spec: &DemoSpec) -> Result<PathBuf, RunError> {
    crate::model::cache::ensure_demo_model(cache_dir, spec).map_err(cache_error)
}

/// A cache error as the run reports it: a cache folder the user named is bad input,
/// a stop request cancels, a failed write is an I/O failure.
pub fn cache_error(error: crate::model::cache::CacheError) -> RunError {
    use crate::model::cache::CacheError;
    let message = error.to_string();
    match error {
        CacheError::Folder { .. } => RunError::setting("cache_dir", message),
        CacheError::Write { ref path, .. } => RunError::Io {
            path: path.clone(),
            message,
            source: Some(Box::new(error)),
        },
        CacheError::Interrupted(_) => RunError::Cancelled { message },
    }
}

/// `$XDG_CACHE_HOME/stagehand`, else `$HOME/.cache/stagehand`, else `./target/stagehand-cache`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|dir| !dir.is_empty()) {
        return PathBuf::from(dir).join("stagehand");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|home| !home.is_empty()) {
        return PathBuf::from(home).join(".cache").join("stagehand");
    }
    PathBuf::from("target").join("stagehand-cache")
}

/// The storage adapter for a model's files, as the settings ask (O_DIRECT with
/// `fast_disk`, else buffered `pread`).
pub fn open_model_storage(
    index: &ModelIndex,
    settings: &Settings,
    fail_after_reads: Option<u64>,
) -> Result<Arc<dyn Storage>, RunError> {
    let files: Vec<StorageFile> = index
        .files
        .iter()
        .map(|file| StorageFile {
            path: file.path.clone(),
            expected_bytes: file.bytes,
        })
        .collect();
    // A file rewritten or replaced since it was indexed (while its reference was
    // computed, say) is caught here, before any step runs.
    index.check_unchanged().map_err(RunError::from_index)?;
    let mut options = StorageOptions::from_settings(settings);
    options.fail_after_reads = fail_after_reads;
    open_storage(&files, &options, settings.fast_disk).map_err(storage_error)
}

/// A model file the storage adapter could not open, by kind.
fn storage_error(error: stagehand_actors::StorageError) -> RunError {
    use stagehand_actors::StorageError;
    let message = error.to_string();
    match error {
        StorageError::Io { ref path, .. } => RunError::Unreadable {
            path: PathBuf::from(path),
            message,
            source: Some(Box::new(error)),
        },
        StorageError::FileChanged { ref path, .. } => RunError::CheckpointChanged {
            path: PathBuf::from(path),
            message,
            source: Some(Box::new(error)),
        },
        // An extent past the adapter's file table, a read past its buffer: the
        // index and the adapter disagree, which stagehand's own code decides.
        StorageError::UnknownFile(_) | StorageError::BufferTooSmall { .. } => RunError::Internal {
            message,
            source: Some(Box::new(error)),
        },
        StorageError::Injected(_) => RunError::Io {
            path: PathBuf::new(),
            message,
            source: Some(Box::new(error)),
        },
    }
}

/// The session's budgets and ring from the settings, for any device.
pub fn session_config(
    settings: &Settings,
    budgets: Budgets,
    prefetch_depth: u32,
    policy: ResidencyPolicy,
) -> SessionConfig {
    SessionConfig {
        vram_budget_bytes: budgets.vram_budget_bytes,
        pin_ceiling_bytes: budgets.pin_ceiling_bytes,
        prefetch_depth,
        // Whole-block staging needs depth + 1 buffers to keep the ring busy; fast-disk
        // chunks use the configured ring (default 3 × 64 MiB).
        staging_buffers: if settings.fast_disk {
            settings.staging_buffers
        } else {
            settings.staging_buffers.clamp(2, prefetch_depth + 2)
        },
        fast_disk_chunk_bytes: settings
            .fast_disk
            .then(|| settings.staging_buffer_size.as_u64()),
        policy,
        max_reads_in_flight: (settings.reader_threads as usize).max(2),
        activation_reserve_bytes: 0,
    }
}

/// One run's knobs beyond the settings.
pub struct RunPlan<'a> {
    pub settings: &'a Settings,
    pub budgets: Budgets,
    pub prefetch_depth: u32,
    pub policy: ResidencyPolicy,
    pub steps: u64,
    pub stop: Arc<AtomicBool>,
    pub observer: Arc<dyn Observer>,
    pub on_step: Box<dyn FnMut(u64, f64) + Send>,
    /// Fault injection for tests: fail reads after this many.
    pub fail_after_reads: Option<u64>,
    /// Keep each step's output in the report (`embed` prints them).
    pub keep_outputs: bool,
    /// Called with each token a decoder picks, as it is picked (`generate`).
    pub on_token: Option<Box<dyn FnMut(u32) + Send>>,
    /// Time the copies (and the disk reads) after the run, in this process, instead of
    /// taking the machine's cached copy rate (the roofline's, on the CPU backend; a run
    /// on a device without one always times them): for `validate` and `bench`, which
    /// compare a run with its own links.
    pub measure_links: bool,
    /// Run inside a shared budget (serve's `[budget]`): the session's arena is the
    /// whole shared VRAM budget, its lease the plan's budgets (from
    /// [`loaded::shared_budgets`]); it is ranked first while it runs and leaves the
    /// budget when it ends.
    pub shared: Option<loaded::SharedMember>,
}

impl<'a> RunPlan<'a> {
    /// A run of `steps` steps (0: until `stop` is set) at the settings' prefetch depth
    /// under the planned residency, with no metrics, callbacks or faults.
    pub fn new(settings: &'a Settings, budgets: Budgets, steps: u64) -> Self {
        Self {
            settings,
            budgets,
            prefetch_depth: settings.prefetch_depth,
            policy: ResidencyPolicy::Planned,
            steps,
            stop: Arc::new(AtomicBool::new(false)),
            observer: no_observer(),
            on_step: Box::new(|_, _| {}),
            fail_after_reads: None,
            keep_outputs: false,
            on_token: None,
            measure_links: false,
            shared: None,
        }
    }
}

/// A session over a checkpoint's blocks on the CPU backend, for an engine that drives
/// its own forward pass (the block-prefetch API): `order` is the blocks a step
/// acquires, in order; the storage is the one the settings ask for.
pub fn block_session(
    index: &ModelIndex,
    settings: &Settings,
    budgets: Budgets,
    order: Vec<stagehand_actors::BlockId>,
) -> Result<stagehand_actors::Session, RunError> {
    let layout = index.layout();
    let storage = open_model_storage(index, settings, None)?;
    let capacity = budgets.vram_budget_bytes.max(layout.largest_block_bytes());
    let device = crate::device::CpuDevice::new(capacity).map_err(|error| RunError::Device {
        message: error.to_string(),
        source: Some(Box::new(error)),
    })?;
    let config = session_config(
        settings,
        budgets,
        settings.prefetch_depth,
        ResidencyPolicy::Planned,
    );
    stagehand_actors::Session::start(
        config,
        layout,
        order,
        Arc::new(device),
        storage,
        no_observer(),
    )
    .map_err(|error| RunError::from_session(error, budgets.vram_budget_bytes))
}

/// What a run produced: its report, the rates and the bound.
pub struct Outcome {
    pub report: RunReport,
    pub rates: LinkRates,
    pub bound: StepBound,
    pub budgets: Budgets,
    pub model_bytes: u64,
    pub device: String,
    pub storage: String,
    /// What ran: "linear-stack", "moe", "bert encoder", or "stream-verify" (bytes
    /// checked, nothing computed).
    pub workload: &'static str,
    /// Model bytes kept in host memory outside the tiers (an encoder's word table).
    pub host_bytes: u64,
    /// The process's peak resident set at the end of the run.
    pub peak_rss_bytes: Option<u64>,
    /// Decoders: the planned streamed bytes per step once KV-cache growth made resident
    /// blocks give way (the re-plan); equal to the plan's when nothing gave way.
    pub streamed_bytes_per_step_after_kv: u64,
    /// The `--fast-disk` staging ring, pinned whole beside the pin ceiling (0 without
    /// fast disk, where staging sits inside the ceiling).
    pub staging_ring_bytes: u64,
    /// Bytes a roofline measured at the run's start added to the peak resident set
    /// that could not be reset away (counted beside the budgets; usually 0).
    pub roofline_measurement_rss_bytes: u64,
    /// The machine's roofline the bound's compute share came from (the CPU backend),
    /// and what the run raised in it.
    pub roofline: Option<RooflineUsed>,
    /// The precision of the many-rows products (`compute_dtype`).
    pub compute_dtype: crate::compute::ComputeDtype,
}

/// An observer that records nothing, for runs without metrics.
/// A run that failed, saying whether every budget came back (it must).
pub fn failed_run(error: FamilyError, stats: &stagehand_actors::StatsSnapshot) -> RunError {
    let released = stats.vram.used_bytes == 0 && stats.pinned.used_bytes == 0;
    RunError::from_family(error, stats.vram.budget_bytes).with_suffix(if released {
        " (every budget was released)"
    } else {
        " (budgets NOT fully released)"
    })
}

pub fn no_observer() -> Arc<dyn Observer> {
    Arc::new(NoObserver)
}

impl From<FamilyError> for RunError {
    /// A family's error during a run, by kind.
    fn from(error: FamilyError) -> Self {
        RunError::from_family(error, 0)
    }
}
