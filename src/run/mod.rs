//! Wires settings, a model, the adapters and a workload into a run: what `stagehand
//! run` and `stagehand bench` share.

pub mod memory;
pub mod summary;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use stagehand_actors::{
    BlockId, Device, ExpertConfig, ExpertPolicy, NoObserver, Observer, ResidencyPolicy, Session,
    SessionConfig, Storage,
};

use crate::device::CpuDevice;
use crate::lora::LoraSpec;
use crate::model::demo::DemoSpec;
use crate::model::ModelIndex;
use crate::settings::Settings;
use crate::storage::{open_storage, StorageFile, StorageOptions};
use crate::workload::bound::{measure_rates, LinkRates, StepBound};
use crate::workload::driver::LoraPhase;
use crate::workload::driver::{drive_traced, DriverOptions, RunReport, Workload};
use crate::workload::linear_stack::LinearStack;
use crate::workload::lora_set::LoraSet;
use crate::workload::moe::{HintMode, MoeRun};
use crate::workload::moe_model::{MoeLayout, MoeSpec};
use crate::workload::stream_verify::expected_checksums;
use crate::workload::WorkloadError;

/// Fraction of the model the CPU backend's VRAM budget defaults to, so the demo streams.
pub const DEFAULT_VRAM_FRACTION: f64 = 0.4;
/// Fraction of the model the demo's pin ceiling defaults to, so the disk tier works too.
pub const DEFAULT_DEMO_PIN_FRACTION: f64 = 0.5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// linear-stack for a generated demo model, else stream-verify.
    Auto,
    LinearStack,
    StreamVerify,
    /// The generated mixture-of-experts model: experts acquired as routed, through an
    /// expert cache with speculative prefetch.
    Moe,
}

/// What a run adds to its workload: LoRA adapters (linear-stack) or the MoE knobs.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    pub loras: Vec<LoraSpec>,
    pub moe: MoeOptions,
}

#[derive(Debug, Clone, Copy)]
pub struct MoeOptions {
    pub policy: ExpertPolicy,
    pub hint: HintMode,
    /// Expert cache slots; `None`: as many as the budget leaves after the dense blocks.
    pub slots: Option<u32>,
}

impl Default for MoeOptions {
    fn default() -> Self {
        Self {
            policy: ExpertPolicy::default(),
            hint: HintMode::NextLayer,
            slots: None,
        }
    }
}

/// Why a run could not be set up (exit 2) or failed (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}")]
    BadInput(String),
    #[error("{0}")]
    Failed(String),
}

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

fn cache_error(error: crate::model::cache::CacheError) -> RunError {
    match error {
        crate::model::cache::CacheError::Folder { .. } => RunError::BadInput(error.to_string()),
        _ => RunError::Failed(error.to_string()),
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

/// Free host memory the kernel could give us now (`MemAvailable`), if known.
pub fn available_ram_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text
        .lines()
        .find(|line| line.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A model opened for a run, with its workload.
pub struct Prepared {
    pub index: ModelIndex,
    pub workload: Workload,
    pub is_demo: bool,
}

pub fn prepare(
    model: &Path,
    kind: WorkloadKind,
    batch: usize,
    settings: &Settings,
    is_demo: bool,
) -> Result<Prepared, RunError> {
    prepare_with(model, kind, batch, settings, is_demo, &Extras::default())
}

/// As [`prepare`], with LoRA adapters or MoE options.
pub fn prepare_with(
    model: &Path,
    kind: WorkloadKind,
    batch: usize,
    settings: &Settings,
    is_demo: bool,
    extras: &Extras,
) -> Result<Prepared, RunError> {
    let index = ModelIndex::open(model, settings.block_pattern.as_deref())
        .map_err(|error| RunError::BadInput(error.to_string()))?;
    if index.blocks.is_empty() {
        return Err(RunError::BadInput(format!(
            "{}: the model has no tensors to stream",
            model.display()
        )));
    }
    let demo = DemoSpec::from_metadata(&index.metadata).is_some();
    let moe = MoeSpec::from_metadata(&index.metadata);
    let kind = match kind {
        WorkloadKind::Auto if moe.is_some() => WorkloadKind::Moe,
        WorkloadKind::Auto if demo => WorkloadKind::LinearStack,
        WorkloadKind::Auto => WorkloadKind::StreamVerify,
        other => other,
    };
    memory::check_largest_block(&index, settings)?;
    // The activations a batch needs, checked before they are allocated.
    let width = match kind {
        WorkloadKind::LinearStack => DemoSpec::from_metadata(&index.metadata).map(|spec| spec.dim),
        WorkloadKind::Moe => moe.as_ref().map(|spec| spec.dim),
        _ => None,
    };
    if let Some(dim) = width {
        memory::check_batch(batch, u64::from(dim), settings)?;
    }
    if !extras.loras.is_empty() && kind != WorkloadKind::LinearStack {
        return Err(RunError::BadInput(
            "--lora applies to the linear-stack workload (the demo model); drop --lora or use --workload linear-stack".to_string(),
        ));
    }
    let workload = match kind {
        WorkloadKind::LinearStack => {
            let model = LinearStack::from_index(&index, batch)
                .map_err(|error| RunError::BadInput(error.to_string()))?;
            let reference = model
                .reference(&index)
                .map_err(|error| RunError::Failed(error.to_string()))?;
            let mut lora = Vec::new();
            if !extras.loras.is_empty() {
                let set = LoraSet::load(&model, &index, &extras.loras)
                    .map_err(|error| RunError::BadInput(error.to_string()))?;
                let reference = model
                    .reference_merged(&index, Some(&set))
                    .map_err(|error| RunError::Failed(error.to_string()))?;
                lora.push(LoraPhase {
                    from_step: 0,
                    set,
                    reference,
                });
            }
            Workload::LinearStack {
                model,
                reference,
                lora,
            }
        }
        WorkloadKind::Moe => {
            let spec = moe.ok_or_else(|| {
                RunError::BadInput(format!(
                    "{} is not a generated MoE model (no stagehand.kind = moe metadata); run `stagehand run --workload moe` without --model to use the demo one",
                    model.display()
                ))
            })?;
            let layout = MoeLayout::new(&index, spec)
                .map_err(|error| RunError::BadInput(error.to_string()))?;
            let mut run = MoeRun::new(&index, layout, batch, extras.moe.hint)
                .map_err(|error| RunError::BadInput(error.to_string()))?;
            run.policy = extras.moe.policy;
            run.slots = extras.moe.slots;
            Workload::Moe(run)
        }
        _ => Workload::StreamVerify {
            names: index
                .blocks
                .iter()
                .map(|block| block.name.clone())
                .collect(),
            checksums: expected_checksums(&index)
                .map_err(|error| RunError::Failed(error.to_string()))?,
        },
    };
    Ok(Prepared {
        index,
        workload,
        is_demo,
    })
}

/// The budgets a run uses, resolved from the settings and the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Budgets {
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
}

pub fn resolve_budgets(settings: &Settings, model_bytes: u64, is_demo: bool) -> Budgets {
    let vram_budget_bytes = settings
        .vram_budget
        .map(|size| size.as_u64())
        .unwrap_or((model_bytes as f64 * DEFAULT_VRAM_FRACTION) as u64);
    // What may be pinned: MemAvailable less the floor and less the fast-disk staging
    // ring, which is pinned beside the ceiling (every pinned byte counts against the floor).
    let spare = available_ram_bytes().map(|available| memory::pinnable_bytes(available, settings));
    let wanted = match settings.pin_ceiling {
        Some(size) => size.as_u64(),
        None if is_demo => (model_bytes as f64 * DEFAULT_DEMO_PIN_FRACTION) as u64,
        None => spare.unwrap_or(model_bytes),
    };
    let pin_ceiling_bytes = match spare {
        Some(spare) if wanted > spare => {
            tracing::warn!(
                "pin_ceiling lowered from {wanted} to {spare} bytes so free RAM stays above ram_floor"
            );
            spare
        }
        _ => wanted,
    };
    Budgets {
        vram_budget_bytes,
        pin_ceiling_bytes,
    }
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
    index
        .check_unchanged()
        .map_err(|error| RunError::Failed(error.to_string()))?;
    let mut options = StorageOptions::from_settings(settings);
    options.fail_after_reads = fail_after_reads;
    open_storage(&files, &options, settings.fast_disk)
        .map_err(|error| RunError::BadInput(error.to_string()))
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
}

pub fn execute(prepared: &Prepared, plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    let settings = plan.settings;
    let index = &prepared.index;
    let layout = index.layout();
    let model_bytes = layout.total_bytes();
    let device: Arc<dyn Device> = Arc::new(
        CpuDevice::new(
            plan.budgets
                .vram_budget_bytes
                .max(layout.largest_block_bytes()),
        )
        .map_err(|error| RunError::Failed(error.to_string()))?,
    );
    let storage = open_model_storage(index, settings, plan.fail_after_reads)?;
    let config = session_config(settings, plan.budgets, plan.prefetch_depth, plan.policy);
    let (layout, order, experts) = match &prepared.workload {
        Workload::Moe(run) => {
            let experts = expert_config(run, &config)?;
            (run.model.layout.clone(), run.model.order(), Some(experts))
        }
        _ => {
            let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
            (layout, order, None)
        }
    };
    // `--trace FILE`: transfers from the actors' observer calls, compute from the driver.
    let trace = settings.trace.as_ref().map(|_| {
        Arc::new(crate::sim::TraceObserver::new(
            Arc::new(crate::sim::TraceRecorder::new()),
            layout
                .blocks
                .iter()
                .map(|block| block.name.clone())
                .collect(),
        ))
    });
    let observer: Arc<dyn Observer> = match &trace {
        Some(trace) => Arc::new(stagehand_actors::Tee(plan.observer, Arc::clone(trace))),
        None => plan.observer,
    };
    let session = Session::start_with_experts(
        config,
        experts,
        layout.clone(),
        order,
        device.clone(),
        storage.clone(),
        observer,
    )
    .map_err(|error| RunError::BadInput(error.to_string()))?;
    let report = drive_traced(
        session,
        &prepared.workload,
        DriverOptions {
            steps: plan.steps,
            stop: plan.stop,
            on_step: plan.on_step,
        },
        trace.as_deref(),
    )
    .map_err(|failure| {
        let (error, stats) = *failure;
        failed_run(error, &stats)
    })?;
    if let (Some(path), Some(trace)) = (&settings.trace, &trace) {
        trace
            .recorder()
            .write_chrome_trace(path)
            .map_err(|error| RunError::Failed(error.to_string()))?;
    }
    let rates = measure_rates(&device, &storage, &layout, |index| {
        !report
            .plan
            .pins
            .is_cached(stagehand_actors::BlockId(index as u32))
    })
    .map_err(RunError::Failed)?;
    let bound = StepBound::new(
        report.steady_compute_seconds(),
        report.plan.vram.streamed_bytes_per_step as f64,
        report.plan.pins.disk_bytes_per_step as f64,
        rates,
    );
    Ok(Outcome {
        report,
        rates,
        bound,
        budgets: plan.budgets,
        model_bytes,
        device: device.name(),
        storage: storage.name(),
    })
}

/// The expert cache of an MoE run: the dense blocks (used by every token) stay
/// resident if they fit beside at least `2 × top_k` expert slots; the rest of the
/// budget is expert slots.
fn expert_config(run: &MoeRun, config: &SessionConfig) -> Result<ExpertConfig, RunError> {
    let align = |bytes: u64| bytes.div_ceil(256) * 256;
    let spec = run.model.spec;
    let expert_bytes = align(spec.expert_bytes());
    let dense_bytes = align(run.model.dense_bytes());
    let budget = config.vram_budget_bytes;
    let all_dense = dense_bytes * u64::from(spec.layers);
    let ring = dense_bytes * u64::from(config.prefetch_depth + 1);
    let minimum = u64::from(2 * spec.top_k);
    let total_experts = u64::from(spec.layers * spec.experts);
    let room = |reserved: u64| budget.saturating_sub(reserved) / expert_bytes;
    let slots = match run.slots {
        Some(slots) => u64::from(slots),
        None if room(all_dense) >= minimum => room(all_dense).min(total_experts),
        None => room(ring).min(total_experts),
    };
    if slots < minimum || slots * expert_bytes + ring > budget {
        return Err(RunError::BadInput(format!(
            "vram_budget {} is too small for this MoE model: it needs {} expert slots (2 × top-k) of {} plus a ring of {} dense blocks of {}",
            stagehand_actors::Bytes(budget),
            minimum,
            stagehand_actors::Bytes(expert_bytes),
            config.prefetch_depth + 1,
            stagehand_actors::Bytes(dense_bytes)
        )));
    }
    Ok(ExpertConfig {
        slots: slots as u32,
        slot_bytes: expert_bytes,
        policy: run.policy,
    })
}

/// An observer that records nothing, for runs without metrics.
/// A run that failed, saying whether every budget came back (it must).
pub fn failed_run(
    error: impl std::fmt::Display,
    stats: &stagehand_actors::StatsSnapshot,
) -> RunError {
    let released = stats.vram.used_bytes == 0 && stats.pinned.used_bytes == 0;
    RunError::Failed(format!(
        "{error}{}",
        if released {
            " (every budget was released)"
        } else {
            " (budgets NOT fully released)"
        }
    ))
}

pub fn no_observer() -> Arc<dyn Observer> {
    Arc::new(NoObserver)
}

impl From<WorkloadError> for RunError {
    fn from(error: WorkloadError) -> Self {
        RunError::Failed(error.to_string())
    }
}
