//! The one run path for every device: open the storage, compute the fully-resident
//! reference of the first step (before the session competes with it), start the
//! session on the device, drive the workload, measure the links, bound the step.

use std::sync::Arc;

use stagehand_actors::{BlockId, Device, ExpertConfig, Observer, Session, SessionConfig};

use crate::compute::Compute;
use crate::device::{CpuCompute, CpuDevice};
use crate::model::BlockReader;
use crate::workload::bound::{measure_rates, StepBound};
use crate::workload::driver::{drive_traced, DriverOptions, Model};

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
    let streams = plan.budgets.vram_budget_bytes < layout.total_bytes();
    let compute = CpuCompute::with_threads(plan.settings.compute_threads_for(streams));
    execute_on(prepared, plan, device, &compute)
}

/// A run on the CUDA backend (`super::cuda`).
#[cfg(feature = "cuda")]
pub use super::cuda::execute_cuda;

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
    let config = SessionConfig {
        // A decoder's first KV pages (the prompt and the first token) are reserved as it
        // starts; the plan leaves room for them.
        activation_reserve_bytes: prepared.activation_bytes(1),
        ..session_config(settings, plan.budgets, plan.prefetch_depth, plan.policy)
    };
    let experts = ExpertNeeds::of(&workload.model)
        .map(|needs| expert_config(&needs, &config))
        .transpose()?;
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
    let session = Session::start_with_experts(
        config,
        experts,
        layout.clone(),
        workload.order(),
        device.clone(),
        storage.clone(),
        Arc::clone(&observer),
    )
    .map_err(|error| RunError::BadInput(error.to_string()))?;
    let report = drive_traced(
        session,
        compute,
        workload,
        &files,
        DriverOptions {
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
        trace
            .recorder()
            .write_chrome_trace(path)
            .map_err(|error| RunError::Failed(error.to_string()))?;
        tracing::info!(
            "wrote the Chrome trace to {} (open it in https://ui.perfetto.dev)",
            path.display()
        );
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
    let gave_way: u64 = report
        .kv_growth
        .iter()
        .flat_map(|(_, _, blocks)| blocks)
        .filter_map(|block| layout.block(*block))
        .map(|block| block.bytes)
        .sum();
    let streamed_bytes_per_step_after_kv = report.plan.vram.streamed_bytes_per_step + gave_way;
    Ok(Outcome {
        streamed_bytes_per_step_after_kv,
        staging_ring_bytes: super::memory::staging_ring_bytes(settings).unwrap_or(0),
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
        Model::Decoder(decoder) => decoder.host_table_bytes(),
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

/// A block's footprint in the arena.
fn align(bytes: u64) -> u64 {
    bytes.div_ceil(256) * 256
}

/// What an expert cache is sized from.
struct ExpertNeeds {
    /// The dense blocks of the step order (every token uses them): their total and
    /// their largest size.
    dense_total_bytes: u64,
    dense_block_bytes: u64,
    expert_bytes: u64,
    experts: u64,
    top_k: u64,
    slots: Option<u32>,
    policy: stagehand_actors::ExpertPolicy,
}

impl ExpertNeeds {
    fn of(model: &Model) -> Option<Self> {
        match model {
            Model::Moe(run) => {
                let spec = run.model.spec;
                Some(Self {
                    dense_total_bytes: u64::from(spec.layers) * align(run.model.dense_bytes()),
                    dense_block_bytes: run.model.dense_bytes(),
                    expert_bytes: spec.expert_bytes(),
                    experts: u64::from(spec.layers * spec.experts),
                    top_k: u64::from(spec.top_k),
                    slots: run.slots,
                    policy: run.policy,
                })
            }
            Model::Decoder(decoder) => {
                let experts = decoder.config.experts?;
                let layout = crate::workload::family::Family::layout(&**decoder);
                let dense: Vec<u64> = (0..=decoder.config.layers as u32)
                    .filter_map(|block| layout.block(BlockId(block)))
                    .map(|block| block.bytes)
                    .collect();
                Some(Self {
                    dense_total_bytes: dense.iter().map(|&bytes| align(bytes)).sum(),
                    dense_block_bytes: dense.iter().copied().max().unwrap_or(0),
                    expert_bytes: decoder.expert_bytes()?,
                    experts: (decoder.config.layers * experts.count) as u64,
                    top_k: experts.top_k as u64,
                    slots: decoder.expert_slots,
                    policy: decoder.expert_policy,
                })
            }
            _ => None,
        }
    }
}

/// The expert cache of an MoE run: the dense blocks (used by every token) stay
/// resident if they fit beside at least `2 × top_k` expert slots; the rest of the
/// budget is expert slots.
fn expert_config(needs: &ExpertNeeds, config: &SessionConfig) -> Result<ExpertConfig, RunError> {
    let expert_bytes = align(needs.expert_bytes);
    let dense_bytes = align(needs.dense_block_bytes);
    let budget = config.vram_budget_bytes;
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
        return Err(RunError::BadInput(format!(
            "vram_budget {} is too small for this MoE model: it needs {} expert slots (2 × top-k) of {} plus a ring of {} dense blocks of {}; raise --vram-budget to at least {}",
            stagehand_actors::Bytes(budget),
            minimum,
            stagehand_actors::Bytes(expert_bytes),
            config.prefetch_depth + 1,
            stagehand_actors::Bytes(dense_bytes),
            stagehand_actors::Bytes(minimum * expert_bytes + dense_needed)
        )));
    }
    Ok(ExpertConfig {
        slots: slots as u32,
        slot_bytes: expert_bytes,
        policy: needs.policy,
    })
}
