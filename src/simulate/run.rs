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

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use stagehand_actors::{
    BlockId, Link, LocalSession, ModelLayout, NoObserver, Observer, SessionConfig, SessionPlan,
    StatsSnapshot, Tee,
};

use super::fit::{whole_block_staging_buffers, FitSettings, MIN_STAGING_BUFFERS};

mod compute;
use super::model::ModelDescription;
use super::policy::Policy;
use super::reuse::{ReuseLedger, VramBytesPerBlock};
use super::steady::{steady, steady_bytes, LinkBytes, SteadyBytes};
use crate::settings::ROWS_HIDING_COPIES;
use crate::sim::FaultPlan;
use crate::sim::HardwareProfile;
use crate::sim::SimClock;
use crate::sim::SimMachine;
use crate::sim::{virtual_time_system, SimError};
use crate::telemetry::trace::{Lane, TraceRecorder};
use compute::{block_durations, ComputeSide, Progress, Record};

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

async fn run_on_current_system(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    policy: Policy,
    options: &RunOptions,
) -> Result<PolicyRun, SimRunError> {
    let layout = model.layout();
    let names: Vec<String> = layout.blocks.iter().map(|b| b.name.clone()).collect();
    let machine = sim_machine(hardware, options, &layout)?;
    let depth = policy.prefetch_depth(options.settings.prefetch_depth);
    let mut config = session_config(policy, depth, options);
    // A decoder's first KV pages and a family's activation tensors are kept out of
    // the plan, as `run::execute` keeps them.
    config.activation_reserve_bytes = model.activation_reserve_bytes();
    let received = VramBytesPerBlock::new(layout.len());
    let observer = observer(options, &machine, &names, &received);
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
    let (speedup, compute_threads) = compute_speedup(model, hardware, &plan);
    let compute = ComputeSide {
        machine: &machine,
        order: &order,
        names: &names,
        block_durations: block_durations(model, hardware, &machine, speedup),
        compute_threads,
        kv_cache: model.kv_cache,
        activation_bytes: model
            .activations
            .as_ref()
            .map_or(0, |acts| acts.reserved_bytes),
        steps: options.steps.max(1),
        progress: Progress::default(),
    };
    let limit = options
        .virtual_time_limit
        .unwrap_or_else(|| default_limit(model, hardware, options.steps));
    let mut record = Record {
        boundaries: vec![(Duration::ZERO, LinkBytes::default())],
        reuse: ReuseLedger::new(received, model.blocks.iter().map(|b| b.bytes).collect()),
    };
    let driven = tokio::time::timeout(
        crate::sim::tokio_duration(limit),
        compute.drive(&mut session, &mut record),
    )
    .await;
    let Ok(outcome) = driven else {
        return Err(SimRunError::Stalled {
            policy: policy.label(),
            limit_seconds: limit.as_secs_f64(),
            step: compute.progress.step.get(),
            block: compute.block_now(),
            seed: options.faults.seed,
        });
    };
    let stats = session.finish().await;
    if let Err(reason) = outcome {
        return Err(SimRunError::Failed {
            policy: policy.label(),
            step: compute.progress.step.get(),
            block: compute.block_now(),
            reason,
            seed: options.faults.seed,
            released: stats.vram.used_bytes == 0 && stats.pinned.used_bytes == 0,
        });
    }
    Ok(Finished {
        policy,
        depth,
        steps: compute.steps,
        acquires: compute.steps * order.len() as u64,
        config,
        plan,
        record,
        stats,
    }
    .into_policy_run())
}

/// What the run's compute threads gain over those the profile's kernels were timed
/// on, and how many they are. `run` computes on every core when nothing streams or a step streams
/// [`ROWS_HIDING_COPIES`] rows or more, and on the timed threads (every core but one)
/// otherwise (`Settings::compute_threads_for` with `compute_threads` unset; an
/// explicit `compute_threads` is not followed here). The profile's own core count is
/// used, not this machine's: it may describe another.
fn compute_speedup(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    plan: &SessionPlan,
) -> (f64, u64) {
    let Some(scaling) = hardware.compute.as_ref().and_then(|costs| costs.threads) else {
        return (1.0, 1);
    };
    let streams = plan.vram.streamed_bytes_per_step > 0;
    if streams && model.tokens_per_step < ROWS_HIDING_COPIES {
        return (1.0, scaling.timed_on);
    }
    (scaling.speedup_on(scaling.all_cores), scaling.all_cores)
}

/// The simulated machine, its reads costed as the settings split them.
fn sim_machine(
    hardware: &HardwareProfile,
    options: &RunOptions,
    layout: &ModelLayout,
) -> Result<SimMachine, SimError> {
    let read_cost = crate::sim::ReadCost::of(options.settings.fast_disk)
        .in_requests(
            options.settings.read_request_bytes,
            options.max_reads_in_flight.max(1) as u64,
        )
        .copying_at(
            hardware
                .disk
                .page_cache_gb_per_s
                .map(|gb_per_s| gb_per_s * 1e9),
        );
    SimMachine::with_read_cost(
        hardware,
        &options.faults,
        Some(layout),
        options.trace.clone(),
        read_cost,
    )
}

/// The session's observer: the copy labels of the trace (if any) beside the count of
/// bytes each block receives in VRAM.
fn observer(
    options: &RunOptions,
    machine: &SimMachine,
    names: &[String],
    received: &Arc<VramBytesPerBlock>,
) -> Arc<dyn Observer> {
    let pipeline_observer: Arc<dyn Observer> = match &options.trace {
        Some(trace) => Arc::new(CopyLabels {
            trace: Arc::clone(trace),
            clock: Arc::clone(&machine.clock),
            names: names.to_vec(),
        }),
        None => Arc::new(NoObserver),
    };
    Arc::new(Tee(pipeline_observer, Arc::clone(received)))
}

/// A run that completed: what its figures are made of.
struct Finished {
    policy: Policy,
    depth: u32,
    steps: u64,
    acquires: u64,
    config: SessionConfig,
    plan: SessionPlan,
    record: Record,
    stats: StatsSnapshot,
}

impl Finished {
    fn into_policy_run(self) -> PolicyRun {
        let Self {
            policy,
            depth,
            steps,
            acquires,
            config,
            plan,
            record: Record { boundaries, reuse },
            stats,
        } = self;
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
        PolicyRun {
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
            acquires,
            virtual_seconds: boundaries.last().map_or(0.0, |last| last.0.as_secs_f64()),
            stats,
        }
    }
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
