//! Simulated runs: N steps of a model description on a hardware profile, through the
//! same actors a real run uses (a `LocalSession` on the virtual-time runtime).
//!
//! The compute side is a task on the actors' own thread that acquires each block,
//! spends the block's modelled compute time on the simulated compute stream, and
//! releases it. Step times come from the exact timeline ([`SimClock`]), bytes per link
//! from the session's own `Stats`, so a simulated run reports exactly what a real run
//! would report about itself.
//!
//! Three policies run through the same machinery; only the session's configuration
//! differs (see [`Policy`]).

use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use stagehand_actors::{
    BlockId, Link, LocalSession, NoObserver, Observer, SessionConfig, StatsSnapshot, Tee,
};

use super::fit::{whole_block_staging_buffers, FitSettings, MIN_STAGING_BUFFERS};
use super::model::ModelDescription;
use super::policy::Policy;
use super::reuse::{ReuseLedger, VramBytesPerBlock};
use super::steady::{steady, steady_bytes, LinkBytes, SteadyBytes};
use crate::families::KvCache;
use crate::sim::FaultPlan;
use crate::sim::HardwareProfile;
use crate::sim::SimClock;
use crate::sim::SimMachine;
use crate::sim::{virtual_time_system, SimError};
use crate::telemetry::trace::{Lane, TraceRecorder};

/// What a simulated run needs besides the model and the machine.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Steps to run (the first is the cold one); at least 1.
    pub steps: u64,
    /// Budgets and depths, as resolved by the fit check.
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
    pub settings: FitSettings,
    pub faults: FaultPlan,
    pub trace: Option<Arc<TraceRecorder>>,
    /// Reads the disk reader keeps in flight (the settings' `reader_threads`, ≥ 2).
    pub max_reads_in_flight: usize,
    /// The run must end within this much virtual time, or it is reported as stalled.
    /// `None`: derived from the model and the machine (very generous).
    pub virtual_time_limit: Option<Duration>,
}

/// What one simulated run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyRun {
    pub policy: Policy,
    pub prefetch_depth: u32,
    pub steps: u64,
    /// Exact virtual duration of every step.
    pub step_seconds: Vec<f64>,
    pub cold_step_seconds: f64,
    /// Median of the steady-state steps (see [`super::steady_window`]).
    pub steady_step_seconds: f64,
    /// Bytes over each link in each step (the counters' growth across the step).
    pub bytes_per_step: Vec<LinkBytes>,
    /// Per step: bytes of the blocks acquired that needed no copy since their previous
    /// use (they stayed in VRAM a whole cycle): the resident set every step after the
    /// first, plus any streamed block the ring happened to keep.
    pub reused_bytes_per_step: Vec<u64>,
    /// Mean bytes over each link per steady-state step (see [`super::steady_window`]).
    pub steady_bytes_per_step: SteadyBytes,
    /// What the session's plan says must cross each step.
    pub plan_streamed_bytes_per_step: u64,
    pub plan_disk_bytes_per_step: u64,
    pub vram_budget_bytes: u64,
    pub peak_vram_bytes: u64,
    /// The pin ceiling, plus the fast-disk chunk ring that sits beside it.
    pub pinned_limit_bytes: u64,
    pub peak_pinned_bytes: u64,
    /// Blocks the compute side acquired, in order, over the whole run.
    pub acquires: u64,
    /// Exact virtual time from start to the end of the last step.
    pub virtual_seconds: f64,
    pub stats: StatsSnapshot,
}

/// Why a simulated run did not complete.
#[derive(Debug, thiserror::Error)]
pub enum SimRunError {
    #[error(transparent)]
    Setup(#[from] SimError),
    #[error("{policy}: the session refused the budgets: {reason}")]
    Plan {
        policy: &'static str,
        reason: String,
    },
    #[error("{policy}: step {step} failed at block `{block}`: {reason} (seed {seed}; {})",
        if *released { "every budget was released" } else { "budgets NOT fully released" })]
    Failed {
        policy: &'static str,
        step: u64,
        block: String,
        reason: String,
        seed: u64,
        /// VRAM and pinned usage were back to zero after the session shut down.
        released: bool,
    },
    #[error("{policy}: no progress: the run did not end within {limit_seconds:.1} s of virtual time (stuck in step {step} at block `{block}`, seed {seed}) — a deadlock in the pipeline")]
    Stalled {
        policy: &'static str,
        limit_seconds: f64,
        step: u64,
        block: String,
        seed: u64,
    },
}

/// Runs `options.steps` steps of `model` on `hardware` under `policy`.
pub fn run_policy(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    policy: Policy,
    options: &RunOptions,
) -> Result<PolicyRun, SimRunError> {
    let system = virtual_time_system()?;
    system.block_on(run_on_current_system(model, hardware, policy, options))
}

/// Where the compute side is, for stall reports.
#[derive(Default)]
struct Progress {
    step: Cell<u64>,
    position: Cell<usize>,
}

async fn run_on_current_system(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    policy: Policy,
    options: &RunOptions,
) -> Result<PolicyRun, SimRunError> {
    let layout = model.layout();
    let names: Vec<String> = layout.blocks.iter().map(|b| b.name.clone()).collect();
    let read_cost = crate::sim::ReadCost::of(options.settings.fast_disk).in_requests(
        options.settings.read_request_bytes,
        options.max_reads_in_flight.max(1) as u64,
    );
    let machine = SimMachine::with_read_cost(
        hardware,
        &options.faults,
        Some(&layout),
        options.trace.clone(),
        read_cost,
    )?;
    let depth = policy.prefetch_depth(options.settings.prefetch_depth);
    let mut config = session_config(policy, depth, options);
    // A decoder's first KV pages are kept out of the plan, as `run::execute` keeps them.
    config.activation_reserve_bytes = model.kv_cache.map_or(0, |kv| kv.start_reserve_bytes());
    let pipeline_observer: Arc<dyn Observer> = match &options.trace {
        Some(trace) => Arc::new(CopyLabels {
            trace: Arc::clone(trace),
            clock: Arc::clone(&machine.clock),
            names: names.clone(),
        }),
        None => Arc::new(NoObserver),
    };
    let received = VramBytesPerBlock::new(layout.len());
    let observer: Arc<dyn Observer> = Arc::new(Tee(pipeline_observer, Arc::clone(&received)));
    let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
    let mut session = LocalSession::start(
        config.clone(),
        layout,
        order.clone(),
        machine.device.clone(),
        machine.storage.clone(),
        observer,
    )
    .map_err(|error| SimRunError::Plan {
        policy: policy.label(),
        reason: error.to_string(),
    })?;
    let plan = session.plan().clone();
    let block_durations = |first_step: bool| -> Vec<(Duration, u64)> {
        model
            .blocks
            .iter()
            .map(|block| {
                let work = match (&block.first_step_work, first_step) {
                    (Some(first), true) => Some(first),
                    _ => block.work.as_ref(),
                };
                let time =
                    machine
                        .compute
                        .block_time(model.block_step_flops(block), block.bytes, work);
                (time, block.bytes)
            })
            .collect()
    };
    let mut block_durations = [block_durations(true), block_durations(false)];
    // The first step's compute faults in the cast buffer (the CPU backend's widened
    // weights) on a profile that charges first touches.
    if let (Some(gb_per_s), Some(first)) = (
        hardware.first_touch_gb_per_s,
        block_durations[0].first_mut(),
    ) {
        let cast_bytes = model
            .blocks
            .iter()
            .filter_map(|block| block.work.as_ref())
            .map(crate::compute::work::Work::cast_buffer_bytes)
            .max()
            .unwrap_or(0);
        first.0 += crate::sim::FirstTouch::new(gb_per_s).duration(cast_bytes);
    }

    let progress = Progress::default();
    let limit = options
        .virtual_time_limit
        .unwrap_or_else(|| default_limit(model, hardware, options.steps));
    let steps = options.steps.max(1);
    let mut record = Record {
        boundaries: vec![(Duration::ZERO, LinkBytes::default())],
        reuse: ReuseLedger::new(received, model.blocks.iter().map(|b| b.bytes).collect()),
    };
    let driven = tokio::time::timeout(
        limit,
        drive(
            &mut session,
            &machine,
            &order,
            &names,
            &block_durations,
            model.kv_cache,
            steps,
            &progress,
            &mut record,
        ),
    )
    .await;
    let outcome = match driven {
        Ok(outcome) => outcome,
        Err(_elapsed) => {
            let block = names
                .get(order[progress.position.get() % order.len()].index())
                .cloned()
                .unwrap_or_default();
            return Err(SimRunError::Stalled {
                policy: policy.label(),
                limit_seconds: limit.as_secs_f64(),
                step: progress.step.get(),
                block,
                seed: options.faults.seed,
            });
        }
    };
    let stats = session.finish().await;
    if let Err(reason) = outcome {
        let block = names
            .get(order[progress.position.get() % order.len()].index())
            .cloned()
            .unwrap_or_default();
        return Err(SimRunError::Failed {
            policy: policy.label(),
            step: progress.step.get(),
            block,
            reason,
            seed: options.faults.seed,
            released: stats.vram.used_bytes == 0 && stats.pinned.used_bytes == 0,
        });
    }

    let Record { boundaries, reuse } = record;
    let step_seconds: Vec<f64> = boundaries
        .windows(2)
        .map(|pair| (pair[1].0 - pair[0].0).as_secs_f64())
        .collect();
    let bytes_per_step: Vec<LinkBytes> = boundaries
        .windows(2)
        .map(|pair| pair[1].1.minus(pair[0].1))
        .collect();
    let pinned_limit_bytes = if plan.pins.chunked {
        config.pin_ceiling_bytes + plan.pins.staging_bytes()
    } else {
        config.pin_ceiling_bytes
    };
    Ok(PolicyRun {
        policy,
        prefetch_depth: depth,
        steps,
        cold_step_seconds: step_seconds.first().copied().unwrap_or(0.0),
        steady_step_seconds: steady(&step_seconds),
        steady_bytes_per_step: steady_bytes(&bytes_per_step),
        step_seconds,
        bytes_per_step,
        reused_bytes_per_step: reuse.into_per_step(),
        plan_streamed_bytes_per_step: plan.vram.streamed_bytes_per_step,
        plan_disk_bytes_per_step: plan.pins.disk_bytes_per_step,
        vram_budget_bytes: config.vram_budget_bytes,
        peak_vram_bytes: stats.vram.peak_used_bytes,
        pinned_limit_bytes,
        peak_pinned_bytes: stats.pinned.peak_used_bytes,
        acquires: steps * order.len() as u64,
        virtual_seconds: boundaries.last().map_or(0.0, |last| last.0.as_secs_f64()),
        stats,
    })
}

/// Steps one simulation may run: each keeps its time and bytes for the report, and a
/// steady state shows after a few (a 70B model's 10,000 steps take about 30 s).
pub const MAX_STEPS: u64 = 10_000;

/// The session configuration of a policy, staged like `stagehand run` stages it.
fn session_config(policy: Policy, depth: u32, options: &RunOptions) -> SessionConfig {
    let settings = &options.settings;
    SessionConfig {
        vram_budget_bytes: options.vram_budget_bytes,
        pin_ceiling_bytes: options.pin_ceiling_bytes,
        prefetch_depth: depth,
        // As `stagehand run`: whole-block staging keeps depth + 1 reads busy at most
        // (the fit check stages with the same count).
        staging_buffers: if settings.fast_disk {
            settings.staging_buffers
        } else {
            whole_block_staging_buffers(settings.staging_buffers, depth).max(MIN_STAGING_BUFFERS)
        },
        fast_disk_chunk_bytes: settings.fast_disk.then_some(settings.staging_buffer_bytes),
        policy: policy.residency(),
        max_reads_in_flight: options.max_reads_in_flight.max(2),
        activation_reserve_bytes: 0,
    }
}

/// What the compute side records as it goes.
struct Record {
    /// The exact time and the link counters at the start and at each step's end.
    boundaries: Vec<(Duration, LinkBytes)>,
    reuse: ReuseLedger,
}

/// The compute side: every block in order, every step. Records the exact time and
/// the link counters at each step's end, and which uses needed no copy. An error is
/// the failing acquire's message.
#[allow(clippy::too_many_arguments)]
async fn drive(
    session: &mut LocalSession,
    machine: &SimMachine,
    order: &[BlockId],
    names: &[String],
    block_durations: &[Vec<(Duration, u64)>; 2],
    kv_cache: Option<KvCache>,
    steps: u64,
    progress: &Progress,
    record: &mut Record,
) -> Result<(), String> {
    for step in 0..steps {
        // A signal stops a long simulation between steps, like a real run.
        crate::signals::check().map_err(|interrupted| interrupted.to_string())?;
        progress.step.set(step);
        // The decoder grows its KV cache before the step's first block; resident
        // weights give way when the budget is full, as in the real session.
        let growth = kv_cache.map_or(0, |kv| kv.growth_bytes(step));
        if growth > 0 {
            session
                .reserve_activations(growth)
                .await
                .map_err(|error| format!("the KV cache does not fit: {error}"))?;
        }
        let block_durations = &block_durations[usize::from(step > 0)];
        for (position, &block) in order.iter().enumerate() {
            progress.position.set(position);
            let handle = session
                .acquire(block)
                .await
                .map_err(|error| error.to_string())?;
            let index = block.index();
            record.reuse.used(step, block);
            let (duration, weight_bytes) = block_durations[index];
            machine
                .compute
                .compute_reading(names[index].clone(), duration, weight_bytes)
                .await;
            session.release(handle).await;
        }
        session.step_done().await;
        record
            .boundaries
            .push((machine.clock.now(), LinkBytes::of(&session.stats())));
    }
    Ok(())
}

/// Far more virtual time than any policy needs: every step reading and copying the
/// whole model serially at the slowest rates, plus its compute, ten times over.
fn default_limit(model: &ModelDescription, hardware: &HardwareProfile, steps: u64) -> Duration {
    let bytes = model.total_bytes() as f64;
    let disk = bytes / hardware.disk_rates().bytes_per_second.max(1) as f64;
    let link = bytes / hardware.link_rates().pageable_bytes_per_second.max(1) as f64;
    let rates = hardware.compute_rates();
    let compute: f64 = model
        .blocks
        .iter()
        .map(|block| {
            rates
                .block_duration(model.block_step_flops(block), block.bytes)
                .as_secs_f64()
        })
        .sum();
    // Latencies: a seek per extent and a copy per block, generously.
    let latency =
        model.tensor_count() as f64 * (hardware.disk_rates().request_latency.as_secs_f64() + 1e-3);
    let per_step = disk + link + compute + latency;
    Duration::try_from_secs_f64(10.0 * per_step * (steps.max(1) as f64 + 1.0) + 60.0)
        .unwrap_or(Duration::MAX)
}

/// Names the copy slices the device recorded. The device cannot know which block a
/// copy carries; the actors report it in `block_transfer` from the copy's completion
/// handler, where the clock's causal time is that copy's exact end, so the slice that
/// ended then on the copy lane is this block's.
struct CopyLabels {
    trace: Arc<TraceRecorder>,
    clock: Arc<SimClock>,
    names: Vec<String>,
}

impl Observer for CopyLabels {
    fn block_transfer(&self, link: Link, block: BlockId, _bytes: u64, _seconds: f64) {
        if matches!(link, Link::PinnedToVram | Link::DiskToVram) {
            if let Some(name) = self.names.get(block.index()) {
                self.trace.relabel(Lane::Copy, self.clock.now(), name);
            }
        }
    }
}
