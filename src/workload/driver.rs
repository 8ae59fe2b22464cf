//! Runs steps of a workload over a session on the calling (compute) thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stagehand_actors::{BlockId, Session, SessionPlan, StatsSnapshot};

use super::linear_stack::{first_difference, Activations, LinearStack};
use super::stream_verify::checksum;
use super::WorkloadError;
use crate::device::cpu::block_bytes;

/// What each step computes on the blocks it acquires.
pub enum Workload {
    LinearStack {
        model: LinearStack,
        reference: Vec<f32>,
    },
    StreamVerify {
        names: Vec<String>,
        checksums: Vec<u64>,
    },
}

pub struct DriverOptions {
    /// Steps to run; 0 runs until `stop` is set.
    pub steps: u64,
    pub stop: Arc<AtomicBool>,
    /// Called after each step with its index and duration.
    pub on_step: Box<dyn FnMut(u64, f64) + Send>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub steps: u64,
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
}

impl RunReport {
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
    mut session: Session,
    workload: &Workload,
    mut options: DriverOptions,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    let order: Vec<BlockId> = session.order().to_vec();
    let plan = session.plan().clone();
    let mut activations = match workload {
        Workload::LinearStack { model, .. } => Some(model.activations()),
        Workload::StreamVerify { .. } => None,
    };
    let initial = activations.as_ref().map(|a| a.x.clone());
    let mut report = RunReport {
        steps: 0,
        step_seconds: Vec::new(),
        compute_seconds: Vec::new(),
        after_first_step: StatsSnapshot::default(),
        stats: StatsSnapshot::default(),
        plan,
        verified_steps: 0,
    };
    let mut step = 0u64;
    while options.steps == 0 || step < options.steps {
        if options.stop.load(Ordering::Relaxed) {
            break;
        }
        if let (Some(activations), Some(initial)) = (activations.as_mut(), initial.as_ref()) {
            activations.x.copy_from_slice(initial);
        }
        let started = Instant::now();
        let outcome = run_step(&mut session, &order, workload, activations.as_mut(), step);
        let compute_seconds = match outcome {
            Ok(seconds) => seconds,
            Err(error) => {
                let stats = session.finish();
                return Err(Box::new((error, stats)));
            }
        };
        session.step_done();
        let step_seconds = started.elapsed().as_secs_f64();
        report.step_seconds.push(step_seconds);
        report.compute_seconds.push(compute_seconds);
        report.verified_steps += 1;
        if step == 0 {
            report.after_first_step = session.stats();
        }
        (options.on_step)(step, step_seconds);
        step += 1;
    }
    report.steps = step;
    report.stats = session.finish();
    Ok(report)
}

/// One pass over the order. Returns the seconds spent computing.
fn run_step(
    session: &mut Session,
    order: &[BlockId],
    workload: &Workload,
    mut activations: Option<&mut Activations>,
    step: u64,
) -> Result<f64, WorkloadError> {
    let mut compute_seconds = 0.0;
    for &block in order {
        let handle = session.acquire(block)?;
        // SAFETY: the handle is held until the release below, so the allocator can
        // neither evict nor overwrite this range meanwhile.
        let bytes = unsafe { block_bytes(handle.ptr, handle.bytes) };
        let started = Instant::now();
        let result = match (workload, activations.as_deref_mut()) {
            (Workload::LinearStack { model, .. }, Some(activations)) => {
                model.forward_block(block.index(), bytes, activations)
            }
            (Workload::StreamVerify { names, checksums }, _) => {
                if checksum(bytes) == checksums[block.index()] {
                    Ok(())
                } else {
                    Err(WorkloadError::Corrupt {
                        block: names[block.index()].clone(),
                        offset: 0,
                    })
                }
            }
            (Workload::LinearStack { .. }, None) => Ok(()),
        };
        compute_seconds += started.elapsed().as_secs_f64();
        session.release(handle);
        result?;
    }
    if let (Workload::LinearStack { reference, .. }, Some(activations)) = (workload, activations) {
        if let Some((index, got, expected)) = first_difference(&activations.x, reference) {
            return Err(WorkloadError::Mismatch {
                step,
                index,
                got,
                expected,
            });
        }
    }
    Ok(compute_seconds)
}
