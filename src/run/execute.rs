//! The one run path for every device: open the storage, compute the fully-resident
//! reference of the first step (before the session competes with it), start the
//! session on the device, drive the workload, measure the links, bound the step.

use std::sync::Arc;

use stagehand_actors::{BlockId, Device, ExpertConfig, Observer, Session, SessionConfig};

use crate::compute::Compute;
use crate::device::{CpuCompute, CpuDevice};
use crate::model::BlockReader;
use crate::workload::bound::{measure_rates, StepBound};
use crate::workload::driver::{drive_traced, DriverOptions, Model, References};
use crate::workload::moe::MoeRun;

use super::{failed_run, open_model_storage, session_config, Outcome, Prepared, RunError, RunPlan};

/// A run on the CPU backend: "VRAM" is host memory with a hard capacity.
pub fn execute(prepared: &Prepared, plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    let layout = prepared.workload.layout();
    let capacity = plan
        .budgets
        .vram_budget_bytes
        .max(layout.largest_block_bytes());
    let device: Arc<dyn Device> =
        Arc::new(CpuDevice::new(capacity).map_err(|error| RunError::Failed(error.to_string()))?);
    execute_on(prepared, plan, device, &CpuCompute::new())
}

/// A run on the CUDA backend.
#[cfg(feature = "cuda")]
pub fn execute_cuda(_prepared: &Prepared, _plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    Err(RunError::BadInput(
        "--device cuda is being moved onto the compute port; use --device cpu".to_string(),
    ))
}

/// Without the `cuda` feature there is no CUDA backend to run on.
#[cfg(not(feature = "cuda"))]
pub fn execute_cuda(_prepared: &Prepared, _plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    Err(RunError::BadInput(
        "this stagehand was built without CUDA (--no-default-features); use --device cpu or rebuild with the default features".to_string(),
    ))
}

/// A run with `device` as the `Device` port and `compute` as the compute port; they
/// must share one memory space (the session checks).
pub fn execute_on<C: Compute>(
    prepared: &Prepared,
    plan: RunPlan<'_>,
    device: Arc<dyn Device>,
    compute: &C,
) -> Result<Outcome, RunError> {
    let settings = plan.settings;
    let workload = &prepared.workload;
    let layout = workload.layout().clone();
    let storage = open_model_storage(&prepared.index, settings, plan.fail_after_reads)?;
    let config = session_config(settings, plan.budgets, plan.prefetch_depth, plan.policy);
    let experts = match &workload.model {
        Model::Moe(run) => Some(expert_config(run, &config)?),
        _ => None,
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
    let files =
        BlockReader::open(&prepared.index).map_err(|error| RunError::Failed(error.to_string()))?;
    let mut references = References::new(&files);
    references
        .prime(compute, workload, 0)
        .map_err(|error| RunError::Failed(format!("the fully-resident reference: {error}")))?;
    let session = Session::start_with_experts(
        config,
        experts,
        layout.clone(),
        workload.order(),
        device.clone(),
        storage.clone(),
        observer,
    )
    .map_err(|error| RunError::BadInput(error.to_string()))?;
    let report = drive_traced(
        session,
        compute,
        workload,
        &mut references,
        DriverOptions {
            steps: plan.steps,
            stop: plan.stop,
            on_step: plan.on_step,
            keep_outputs: plan.keep_outputs,
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
        !report.plan.pins.is_cached(BlockId(index as u32))
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
        model_bytes: layout.total_bytes(),
        device: device.name(),
        storage: storage.name(),
        workload: prepared.describe(),
        host_bytes: host_bytes(prepared),
        peak_rss_bytes: peak_rss_bytes(),
    })
}

/// Model bytes a workload keeps in host memory outside the tiers (an encoder's word
/// table when only gathered rows go to the device).
fn host_bytes(prepared: &Prepared) -> u64 {
    match &prepared.workload.model {
        Model::Encoder(encoder) => encoder.host_table_bytes(),
        _ => 0,
    }
}

/// The process's peak resident set (`VmHWM`), if the kernel reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
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
            "vram_budget {} is too small for this MoE model: it needs {} expert slots (2 × top-k) of {} plus a ring of {} dense blocks of {}; raise --vram-budget to at least {}",
            stagehand_actors::Bytes(budget),
            minimum,
            stagehand_actors::Bytes(expert_bytes),
            config.prefetch_depth + 1,
            stagehand_actors::Bytes(dense_bytes),
            stagehand_actors::Bytes(minimum * expert_bytes + ring)
        )));
    }
    Ok(ExpertConfig {
        slots: slots as u32,
        slot_bytes: expert_bytes,
        policy: run.policy,
    })
}
