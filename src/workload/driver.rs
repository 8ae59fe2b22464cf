//! Runs steps of a workload over a session on the calling (compute) thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stagehand_actors::{BlockId, LoraUsage, Session, SessionError, SessionPlan, StatsSnapshot};

use super::linear_stack::{first_difference, first_difference_within, Activations, LinearStack};
use super::lora_set::{LoraSet, LORA_TOLERANCE};
use super::lora_steps::{LoraSteps, Path};
use super::stream_verify::checksum;
use super::WorkloadError;
use crate::device::cpu::block_bytes;

/// What each step computes on the blocks it acquires.
pub enum Workload {
    LinearStack {
        model: LinearStack,
        reference: Vec<f32>,
        /// LoRA sets by step; empty: no LoRA.
        lora: Vec<LoraPhase>,
    },
    Moe(super::moe::MoeRun),
    StreamVerify {
        names: Vec<String>,
        checksums: Vec<u64>,
    },
}

/// From `from_step` on, the run applies `set` (attached to the session when the phase
/// starts, detached when it ends) and checks every step against `reference`.
pub struct LoraPhase {
    pub from_step: u64,
    pub set: LoraSet,
    pub reference: Vec<f32>,
}

pub struct DriverOptions {
    /// Steps to run; 0 runs until `stop` is set.
    pub steps: u64,
    pub stop: Arc<AtomicBool>,
    /// Called after each step with its index and duration.
    pub on_step: Box<dyn FnMut(u64, f64) + Send>,
}

/// Step times a report keeps: the first step and the latest ones.
pub const REPORT_STEP_HISTORY: usize = 4096;

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub steps: u64,
    /// The first step's time and the latest ones' ([`REPORT_STEP_HISTORY`] in all).
    pub step_seconds: Vec<f64>,
    /// Time the compute thread spent computing (not waiting) in each step.
    pub compute_seconds: Vec<f64>,
    /// Counters after the first (cold) step, to derive steady-state figures.
    pub after_first_step: StatsSnapshot,
    /// Counters after the session was shut down.
    pub stats: StatsSnapshot,
    pub plan: SessionPlan,
    /// Every step's result matched the reference (bit for bit, or checksums).
    pub verified_steps: u64,
    /// The LoRA offloader's accounting just before shutdown.
    pub lora: LoraUsage,
    /// Steps checked within [`LORA_TOLERANCE`] rather than bit for bit.
    pub tolerance_steps: u64,
    /// MoE runs: expert acquires that found the expert ready, and those that waited.
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_hints: u64,
}

impl RunReport {
    /// A report with nothing run yet, for a session that planned `plan`.
    pub fn new(plan: SessionPlan) -> Self {
        Self {
            steps: 0,
            step_seconds: Vec::new(),
            compute_seconds: Vec::new(),
            after_first_step: StatsSnapshot::default(),
            stats: StatsSnapshot::default(),
            plan,
            verified_steps: 0,
            lora: LoraUsage::default(),
            tolerance_steps: 0,
            expert_hits: 0,
            expert_misses: 0,
            expert_hints: 0,
        }
    }

    /// Median of the steps after the first.
    pub fn steady_step_seconds(&self) -> f64 {
        median(
            self.step_seconds
                .get(1..)
                .filter(|s| !s.is_empty())
                .unwrap_or(&self.step_seconds),
        )
    }

    pub fn steady_compute_seconds(&self) -> f64 {
        median(
            self.compute_seconds
                .get(1..)
                .filter(|s| !s.is_empty())
                .unwrap_or(&self.compute_seconds),
        )
    }

    /// LoRA bytes copied pinned → VRAM per steady step: the packs re-sent with
    /// streamed blocks (the first, cold step excluded).
    pub fn steady_lora_bytes_per_step(&self) -> f64 {
        let later_steps = self.steps.saturating_sub(1).max(1) as f64;
        let first = self.after_first_step.pinned_to_vram.lora_bytes;
        self.stats.pinned_to_vram.lora_bytes.saturating_sub(first) as f64 / later_steps
    }

    /// Bytes per steady-state step over a link, from the counters' growth after step 1.
    pub fn steady_bytes_per_step(&self, link: stagehand_actors::Link) -> f64 {
        let later_steps = self.steps.saturating_sub(1);
        if later_steps == 0 {
            return self.stats.link(link).model_bytes as f64;
        }
        let grown =
            self.stats.link(link).model_bytes - self.after_first_step.link(link).model_bytes;
        grown as f64 / later_steps as f64
    }
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Runs the steps. On any failure the session is still shut down — every budget is
/// released — before the error is returned.
pub fn drive(
    session: Session,
    workload: &Workload,
    options: DriverOptions,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    drive_traced(session, workload, options, None)
}

/// As [`drive`], recording each block's compute into `trace` (`--trace`).
pub fn drive_traced(
    mut session: Session,
    workload: &Workload,
    mut options: DriverOptions,
    trace: Option<&crate::sim::TraceObserver>,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    // A stop request also ends any wait inside a step (a miss, an attach).
    session.stop_on(Arc::clone(&options.stop));
    let phases = match workload {
        Workload::Moe(run) => return super::moe::drive(session, run, options),
        Workload::LinearStack { lora, .. } => &lora[..],
        Workload::StreamVerify { .. } => &[][..],
    };
    let order: Vec<BlockId> = session.order().to_vec();
    let plan = session.plan().clone();
    let mut activations = match workload {
        Workload::LinearStack { model, .. } => Some(model.activations()),
        _ => None,
    };
    let mut lora = LoraSteps::new(session.order().len(), phases);
    let initial = activations.as_ref().map(|a| a.x.clone());
    let mut report = RunReport::new(plan);
    let mut step = 0u64;
    while options.steps == 0 || step < options.steps {
        if options.stop.load(Ordering::Relaxed) {
            break;
        }
        if let (Some(activations), Some(initial)) = (activations.as_mut(), initial.as_ref()) {
            activations.x.copy_from_slice(initial);
        }
        let started = Instant::now();
        let outcome = lora.enter_step(&mut session, step).and_then(|()| {
            run_step(
                &mut session,
                &order,
                workload,
                activations.as_mut(),
                &mut lora,
                step,
                trace,
            )
        });
        let compute_seconds = match outcome {
            Ok((seconds, path)) => {
                if path == Path::LowRank {
                    report.tolerance_steps += 1;
                }
                seconds
            }
            // Stopped inside a step: the steps before it stand; the session drains below.
            Err(WorkloadError::Session(SessionError::Interrupted)) => break,
            Err(error) => {
                let stats = session.finish();
                return Err(Box::new((error, stats)));
            }
        };
        close_step(
            &mut session,
            &mut report,
            step,
            started,
            compute_seconds,
            &mut options.on_step,
        );
        step += 1;
    }
    report.steps = step;
    report.lora = session.lora_usage().unwrap_or_default();
    report.stats = session.finish();
    Ok(report)
}

/// Closes a verified step: flushes its counters to the session, records its times,
/// keeps the counters after the cold first step, and tells the caller.
pub(super) fn close_step(
    session: &mut Session,
    report: &mut RunReport,
    step: u64,
    started: Instant,
    compute_seconds: f64,
    on_step: &mut Box<dyn FnMut(u64, f64) + Send>,
) {
    session.step_done();
    let step_seconds = started.elapsed().as_secs_f64();
    if report.step_seconds.len() == REPORT_STEP_HISTORY {
        // Bounded for runs that never end (`--steps 0`): the cold first step stays,
        // the oldest steady one goes.
        report.step_seconds.remove(1);
        report.compute_seconds.remove(1);
    }
    report.step_seconds.push(step_seconds);
    report.compute_seconds.push(compute_seconds);
    report.verified_steps += 1;
    if step == 0 {
        report.after_first_step = session.stats();
    }
    on_step(step, step_seconds);
}

/// One pass over the order. Returns the seconds spent computing, and whether any
/// block took the low-rank LoRA path (then the step is checked within tolerance).
fn run_step(
    session: &mut Session,
    order: &[BlockId],
    workload: &Workload,
    mut activations: Option<&mut Activations>,
    lora: &mut LoraSteps<'_>,
    step: u64,
    trace: Option<&crate::sim::TraceObserver>,
) -> Result<(f64, Path), WorkloadError> {
    let mut compute_seconds = 0.0;
    let mut step_path = Path::Exact;
    for &block in order {
        let handle = session.acquire(block)?;
        let started = Instant::now();
        let result = match (workload, activations.as_deref_mut()) {
            (Workload::LinearStack { model, .. }, Some(activations)) => lora
                .forward(session, model, &handle, activations)
                .map(|path| {
                    if path == Path::LowRank {
                        step_path = Path::LowRank;
                    }
                }),
            (Workload::StreamVerify { names, checksums }, _) => {
                // SAFETY: the handle is held until the release below, so the allocator
                // can neither evict nor overwrite this range meanwhile.
                let bytes = unsafe { block_bytes(handle.ptr, handle.bytes) };
                if checksum(bytes) == checksums[block.index()] {
                    Ok(())
                } else {
                    Err(WorkloadError::Corrupt {
                        block: names[block.index()].clone(),
                        offset: 0,
                    })
                }
            }
            _ => Ok(()),
        };
        compute_seconds += started.elapsed().as_secs_f64();
        if let Some(trace) = trace {
            trace.compute(block, started, Instant::now());
        }
        session.release(handle);
        result?;
    }
    if let (Workload::LinearStack { reference, .. }, Some(activations)) = (workload, activations) {
        let expected = lora.phase().map_or(reference, |phase| &phase.reference);
        let difference = match step_path {
            Path::LowRank => first_difference_within(&activations.x, expected, LORA_TOLERANCE),
            Path::Exact => first_difference(&activations.x, expected),
        };
        if let Some((index, got, expected)) = difference {
            return Err(WorkloadError::Mismatch {
                step,
                index,
                got,
                expected,
            });
        }
    }
    Ok((compute_seconds, step_path))
}
