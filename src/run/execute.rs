//! The one run path for every device: open the storage, compute the fully-resident
//! reference of the first step (before the session competes with it), start the
//! session on the device, drive the workload, measure the links, bound the step.

use std::path::Path;
use std::sync::Arc;

use stagehand_actors::{
    arena_bytes, Device, ExpertConfig, ModelLayout, Observer, Session, SessionConfig,
};

use crate::compute::Compute;
use crate::device::{CpuCompute, CpuDevice};
use crate::families::{ExpertNeeds, FamilyError};
use crate::model::BlockReader;
use crate::run::driver::{drive_traced, DriverOptions, RunReport};
use crate::settings::{Settings, Streaming};
use crate::telemetry::TraceObserver;

use super::{
    failed_run, open_model_storage, session_config, Budgets, Outcome, Prepared, RunError, RunPlan,
};

/// A run on the CPU backend: "VRAM" is host memory with a hard capacity.
pub fn execute(prepared: &Prepared, plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    let layout = prepared.workload.layout();
    // In a shared budget the arena is the whole of it; the lease bounds what is used.
    let arena = plan.shared.as_ref().map(|member| member.capacity_bytes());
    let capacity = arena
        .unwrap_or(plan.budgets.vram_budget_bytes)
        .max(layout.largest_block_bytes());
    let device: Arc<dyn Device> =
        Arc::new(CpuDevice::new(capacity).map_err(|error| RunError::Device {
            message: error.to_string(),
            source: Some(Box::new(error)),
        })?);
    let compute = cpu_compute(prepared, plan.settings, plan.budgets);
    execute_on(prepared, plan, device, &compute)
}

/// The CPU compute a run of `prepared` under `budgets` computes with: its threads
/// leave a core to the copies when it streams. A check made after the run
/// (`first_step`) builds the same one, so it compares the same kernels.
pub(super) fn cpu_compute(
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
) -> CpuCompute {
    let streaming = streaming(prepared, budgets.vram_budget_bytes);
    CpuCompute::with_threads(settings.compute_threads_for(streaming))
        .with_compute_dtype(settings.compute_dtype)
}

/// The run's session: in a shared budget, on the whole shared arena, attached to the
/// broker and ranked first; else on its own budgets.
fn start_session(
    shared: Option<&super::loaded::SharedMember>,
    (config, experts): (SessionConfig, Option<ExpertConfig>),
    (layout, order): (ModelLayout, Vec<stagehand_actors::BlockId>),
    device: Arc<dyn Device>,
    storage: Arc<dyn stagehand_actors::Storage>,
    observer: Arc<dyn Observer>,
) -> Result<Session, RunError> {
    let vram_budget_bytes = config.vram_budget_bytes;
    let started = match shared {
        Some(member) => Session::start_shared(
            config,
            experts,
            member.capacity_bytes(),
            layout,
            order,
            device,
            storage,
            observer,
        ),
        None => {
            Session::start_with_experts(config, experts, layout, order, device, storage, observer)
        }
    };
    let session = started.map_err(|error| RunError::from_session(error, vram_budget_bytes))?;
    if let Some(member) = shared {
        let attached = member.pool.attach(&member.name, session.budget_handle());
        attached.map_err(super::loaded::pool_error)?;
        member.begin_use();
    }
    Ok(session)
}

/// What a run of `prepared` under a VRAM budget of `vram_budget_bytes` streams.
pub(super) fn streaming(prepared: &Prepared, vram_budget_bytes: u64) -> Streaming {
    if vram_budget_bytes < prepared.workload.layout().total_bytes() {
        Streaming::Blocks {
            rows: prepared.facts().tokens_per_step(),
        }
    } else {
        Streaming::Nothing
    }
}

/// A run on the CUDA backend (`super::cuda`).
#[cfg(feature = "cuda")]
pub use super::cuda::execute_cuda;

/// Without the `cuda` feature there is no CUDA backend to run on.
#[cfg(not(feature = "cuda"))]
pub fn execute_cuda(_prepared: &Prepared, _plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    Err(RunError::capability(
        "cuda",
        "this stagehand was built without CUDA (--no-default-features); use --device cpu or rebuild with the default features",
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
    refuse_steps(prepared, plan.steps)?;
    let settings = plan.settings;
    let workload = &prepared.workload;
    let layout = workload.layout().clone();
    let storage = open_model_storage(&prepared.index, settings, plan.fail_after_reads)?;
    let (config, experts) = session_configs(prepared, &plan)?;
    // `--trace FILE`: transfers from the actors' observer calls, compute from the driver.
    let trace = settings.trace.as_ref().map(|_| trace_observer(&layout));
    let observer: Arc<dyn Observer> = match &trace {
        Some(trace) => Arc::new(stagehand_actors::Tee(plan.observer, Arc::clone(trace))),
        None => plan.observer,
    };
    // The roofline is taken before the session starts, and the peak resident set
    // counted from after it: a measurement's buffers are not the run's (`peak_rss`).
    let roofline = (compute.memory_space() == stagehand_actors::MemorySpace::Host)
        .then(|| super::peak_rss::roofline_before_run(&super::default_cache_dir()));
    let files = BlockReader::open(&prepared.index)
        .map_err(|error| RunError::from(FamilyError::from(error)))?;
    // Declared before the session, so dropped after it: the lease goes back only once
    // the session has released every byte.
    let _leave = super::loaded::LeaveOnDrop(plan.shared.clone());
    let session = start_session(
        plan.shared.as_ref(),
        (config, experts),
        (layout.clone(), workload.order()),
        device.clone(),
        storage.clone(),
        Arc::clone(&observer),
    )?;
    let report = drive_traced(
        session,
        compute,
        workload,
        &files,
        DriverOptions {
            // Unset, a run checks every step (`embed`/`generate` set their own default).
            verify: settings.verify.unwrap_or(crate::settings::Verify::Full),
            steps: plan.steps,
            stop: plan.stop,
            on_step: plan.on_step,
            keep_outputs: plan.keep_outputs,
            on_token: plan.on_token,
            observer,
        },
        trace.as_deref(),
    )
    .map_err(|failure| {
        let (error, stats) = *failure;
        failed_run(error, &stats)
    })?;
    if let (Some(path), Some(trace)) = (&settings.trace, &trace) {
        write_trace(path, trace)?;
    }
    let links = super::physical::Links {
        device: &device,
        storage: &storage,
        layout: &layout,
        measure: plan.measure_links,
    };
    let peak_rss_bytes_left = roofline
        .as_ref()
        .map_or(0, |taken| taken.peak_rss_bytes_left);
    let obtained = roofline.map(|taken| taken.obtained);
    let bounded = super::physical::physical_bound(
        prepared,
        &report,
        obtained.as_ref(),
        settings.compute_dtype,
        links,
    )?;
    Ok(Outcome {
        streamed_bytes_per_step_after_kv: streamed_after_kv(&report, &layout),
        staging_ring_bytes: super::memory::staging_ring_bytes(settings).unwrap_or(0),
        report,
        rates: bounded.rates,
        bound: bounded.bound,
        budgets: plan.budgets,
        model_bytes: layout.total_bytes(),
        device: device.name(),
        storage: storage.name(),
        workload: prepared.describe(),
        host_bytes: prepared.facts().host_table_bytes(),
        peak_rss_bytes: super::peak_rss::peak_rss_bytes(),
        roofline_measurement_rss_bytes: peak_rss_bytes_left,
        roofline: bounded.roofline,
        compute_dtype: settings.compute_dtype,
    })
}

/// The session's configuration, and the expert cache's for an MoE model.
pub(super) fn session_configs(
    prepared: &Prepared,
    plan: &RunPlan<'_>,
) -> Result<(SessionConfig, Option<ExpertConfig>), RunError> {
    let config = SessionConfig {
        // A decoder's first KV pages (the prompt and the first token) and the LoRA
        // offloader's regions are reserved as it starts; the plan leaves room for them
        // (a region placed beside a plan that had counted on its room would leave a
        // resident block nowhere to go).
        activation_reserve_bytes: prepared.activation_bytes(1)
            + super::lora_region_bytes(prepared, plan.prefetch_depth),
        ..session_config(
            plan.settings,
            plan.budgets,
            plan.prefetch_depth,
            plan.policy,
        )
    };
    let experts = prepared
        .facts()
        .experts()
        .map(|needs| expert_config(&needs, &config, prepared.activation_bytes(plan.steps)))
        .transpose()?;
    Ok((config, experts))
}

/// A trace of the run, naming each block as the layout does.
fn trace_observer(layout: &ModelLayout) -> Arc<TraceObserver> {
    Arc::new(TraceObserver::new(
        Arc::new(crate::telemetry::TraceRecorder::new()),
        layout
            .blocks
            .iter()
            .map(|block| block.name.clone())
            .collect(),
    ))
}

fn write_trace(path: &Path, trace: &TraceObserver) -> Result<(), RunError> {
    trace
        .recorder()
        .write_chrome_trace(path)
        .map_err(|error| RunError::Io {
            path: path.to_path_buf(),
            message: error.to_string(),
            source: Some(Box::new(error)),
        })?;
    tracing::info!(
        "wrote the Chrome trace to {} (open it in https://ui.perfetto.dev)",
        path.display()
    );
    Ok(())
}

/// Bytes streamed per step once the KV cache's growth made resident blocks give way.
fn streamed_after_kv(report: &RunReport, layout: &ModelLayout) -> u64 {
    let gave_way: u64 = report
        .kv_growth
        .iter()
        .flat_map(|(_, _, blocks)| blocks)
        .filter_map(|block| layout.block(*block))
        .map(|block| block.bytes)
        .sum();
    report.plan.vram.streamed_bytes_per_step + gave_way
}

/// A run the family cannot compute correctly for this many steps is refused before it
/// starts (a decoder's sequence past its positions or its sliding window).
fn refuse_steps(prepared: &Prepared, steps: u64) -> Result<(), RunError> {
    match prepared.facts().refuse_steps(steps) {
        Some(refusal) => Err(RunError::setting("steps", refusal)),
        None => Ok(()),
    }
}

/// The expert cache of an MoE run: the dense blocks (used by every token) stay
/// resident if they fit beside at least `2 × top_k` expert slots; the rest of the
/// budget is expert slots. The KV cache the run grows to (`kv_bytes`, of which the
/// session reserves the first pages at start) comes off the budget first: expert
/// slots are fixed, so a cache that later needs room they took could find no weights
/// to give way (the dense blocks resident, no ring to stream them through).
fn expert_config(
    needs: &ExpertNeeds,
    config: &SessionConfig,
    kv_bytes: u64,
) -> Result<ExpertConfig, RunError> {
    let expert_bytes = arena_bytes(needs.expert_bytes);
    let dense_bytes = arena_bytes(needs.dense_block_bytes);
    let kv_bytes = kv_bytes.max(config.activation_reserve_bytes);
    let budget = config.vram_budget_bytes.saturating_sub(kv_bytes);
    let all_dense = needs.dense_total_bytes;
    let ring = dense_bytes * u64::from(config.prefetch_depth + 1);
    let minimum = 2 * needs.top_k;
    let room = |reserved: u64| budget.saturating_sub(reserved) / expert_bytes;
    let slots = match needs.slots {
        Some(slots) => u64::from(slots),
        None if room(all_dense) >= minimum => room(all_dense).min(needs.experts),
        None => room(ring).min(needs.experts),
    };
    // The dense blocks need the ring, or all of them resident when that is less.
    let dense_needed = ring.min(all_dense);
    if slots < minimum || slots * expert_bytes + dense_needed > budget {
        let least_bytes = minimum * expert_bytes + dense_needed + kv_bytes;
        return Err(RunError::budget(
            super::Budget::Vram,
            config.vram_budget_bytes,
            least_bytes,
            format!(
            "vram_budget {} is too small for this MoE model: it needs {} expert slots (2 × top-k) of {} plus a ring of {} dense blocks of {} (and {} of KV cache); raise --vram-budget to at least {}",
            stagehand_actors::Bytes(config.vram_budget_bytes),
            minimum,
            stagehand_actors::Bytes(expert_bytes),
            config.prefetch_depth + 1,
            stagehand_actors::Bytes(dense_bytes),
            stagehand_actors::Bytes(kv_bytes),
            stagehand_actors::Bytes(least_bytes)
            ),
        ));
    }
    Ok(ExpertConfig {
        slots: slots as u32,
        slot_bytes: expert_bytes,
        policy: needs.policy,
    })
}
