//! The CUDA driver loop: the compute thread of a `--device cuda` run.
//!
//! Per block: acquire it (the session says it is in VRAM only after the host saw its
//! copy's event complete, so the compute stream needs no device-side wait on the copy
//! stream), queue its layers on the compute stream at `handle.ptr + block_offset`,
//! record a "compute done" event, and keep the handle until that event has completed:
//! releasing earlier would let the allocator copy the next block into the slot while a
//! kernel still reads it. A streamed hold is waited for as soon as the next block's
//! kernels are queued behind it (so the GPU always has work while this thread waits,
//! and the slot frees the moment its compute ends); resident holds go when a poll
//! sees their event. Before a blocking acquire every hold is released, because the
//! block we wait for may need one of those slots.
//!
//! The step's compute time is the device time between timed events around each block's
//! kernels, so it counts compute and not the waits for copies.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stagehand_actors::{BlockHandle, BlockId, Session, StatsSnapshot};

use super::device::CudaDevice;
use super::error::CudaError;
use super::events::Event;
use super::floats::DType;
use super::holds::Holds;
use super::linear::{normalised_error, tolerance};
use super::stack::LinearStackGpu;
use super::verify::StreamVerifyGpu;
use crate::workload::driver::RunReport;
use crate::workload::WorkloadError;

/// What the output of a linear-stack step is compared with.
pub enum OutputCheck {
    /// The CPU backend's fully-resident result (`LinearStack::reference`).
    Reference(Vec<f32>),
    /// The first step's own output: later steps must agree with it within tolerance.
    /// For configurations whose CPU reference would take too long (the bench's large
    /// batch); the streamed run is then checked against the resident run's output.
    FirstStep,
}

/// The device-side workload of a run.
pub enum GpuWork {
    LinearStack {
        stack: LinearStackGpu,
        check: OutputCheck,
    },
    StreamVerify {
        verify: StreamVerifyGpu,
        names: Vec<String>,
    },
}

impl GpuWork {
    fn reset(&self) -> Result<(), CudaError> {
        match self {
            GpuWork::LinearStack { stack, .. } => stack.reset(),
            GpuWork::StreamVerify { verify, .. } => verify.reset(),
        }
    }

    fn run_block(&self, block: usize, handle: &BlockHandle) -> Result<(), CudaError> {
        match self {
            GpuWork::LinearStack { stack, .. } => stack.forward_block(block, handle.ptr),
            GpuWork::StreamVerify { verify, .. } => verify.check_block(block, handle.ptr),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StepError {
    #[error("cuda: {0}")]
    Cuda(#[from] CudaError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error(
        "output mismatch at step {step}: normalised error {error:.3e} over the f32 tolerance \
         {tolerance:.0e} (element {index}: {got}, expected {expected})"
    )]
    OverTolerance {
        step: u64,
        error: f32,
        tolerance: f32,
        index: usize,
        got: f32,
        expected: f32,
    },
}

pub struct StepOptions {
    /// Steps to run; 0 runs until `stop` is set.
    pub steps: u64,
    pub stop: Arc<AtomicBool>,
    pub on_step: Box<dyn FnMut(u64, f64) + Send>,
}

/// What the loop measured beyond the common report.
#[derive(Debug, Clone, Default)]
pub struct StepFigures {
    /// The driver's used figure (`cuMemGetInfo` total − free) at the end of each step.
    pub used_bytes_per_step: Vec<u64>,
    /// Linear stack: each step's normalised error against its check.
    pub normalised_errors: Vec<f32>,
    /// Linear stack: the last step's output.
    pub last_output: Option<Vec<f32>>,
}

/// Runs the steps. On any failure the holds are released and the session is shut down
/// (every budget released) before the error is returned.
pub fn drive_cuda(
    mut session: Session,
    device: &CudaDevice,
    work: &mut GpuWork,
    mut options: StepOptions,
) -> Result<(RunReport, StepFigures), Box<(StepError, StatsSnapshot)>> {
    let order: Vec<BlockId> = session.order().to_vec();
    let mut report = RunReport::new(session.plan().clone());
    let mut figures = StepFigures::default();
    let mut holds: Holds<Arc<Event>> = Holds::with_capacity(order.len());
    let mut step = 0u64;
    while options.steps == 0 || step < options.steps {
        if options.stop.load(Ordering::Relaxed) {
            break;
        }
        let started = Instant::now();
        let outcome = run_step(&mut session, device, &order, work, &mut holds, step).and_then(
            |compute_seconds| {
                check_step(work, step, &mut figures)?;
                Ok(compute_seconds)
            },
        );
        let compute_seconds = match outcome {
            Ok(seconds) => seconds,
            Err(error) => {
                let _ = device.synchronize();
                let _ = holds.release_all(&mut |handle| session.release(handle));
                let stats = session.finish();
                return Err(Box::new((error, stats)));
            }
        };
        session.step_done();
        let step_seconds = started.elapsed().as_secs_f64();
        report.step_seconds.push(step_seconds);
        report.compute_seconds.push(compute_seconds);
        report.verified_steps += 1;
        if let Ok(memory) = device.memory() {
            figures
                .used_bytes_per_step
                .push(memory.total_bytes - memory.free_bytes);
        }
        if step == 0 {
            report.after_first_step = session.stats();
        }
        (options.on_step)(step, step_seconds);
        step += 1;
    }
    report.steps = step;
    report.stats = session.finish();
    Ok((report, figures))
}

/// One pass over the order; returns the device seconds spent computing. Every hold is
/// released when it returns `Ok`.
fn run_step(
    session: &mut Session,
    device: &CudaDevice,
    order: &[BlockId],
    work: &GpuWork,
    holds: &mut Holds<Arc<Event>>,
    step: u64,
) -> Result<f64, StepError> {
    let stream = device.compute_stream();
    work.reset()?;
    let mut timings = Vec::with_capacity(order.len());
    for &block in order {
        let handle = match session.try_acquire(block) {
            Some(handle) => handle,
            None => {
                holds.release_all(&mut |handle| session.release(handle))?;
                session.acquire(block).map_err(WorkloadError::from)?
            }
        };
        let queued = Event::record_timed(stream).and_then(|start| {
            work.run_block(block.index(), &handle)?;
            Ok((start, Arc::new(Event::record_timed(stream)?)))
        });
        let (start, end) = match queued {
            Ok(events) => events,
            Err(error) => {
                // Whatever was queued may still read the block: wait, then let it go.
                let _ = stream.synchronize();
                session.release(handle);
                return Err(error.into());
            }
        };
        holds.push(handle, end.clone());
        timings.push((start, end));
        holds.release_behind_newest(&mut |handle| session.release(handle))?;
    }
    holds.release_all(&mut |handle| session.release(handle))?;
    let mut compute_seconds = 0.0;
    for (start, end) in &timings {
        compute_seconds += end.seconds_since(start)?;
    }
    tracing::trace!(step, compute_seconds, "cuda step computed");
    Ok(compute_seconds)
}

/// Compares the step's result with its check (waits for the compute stream).
fn check_step(work: &mut GpuWork, step: u64, figures: &mut StepFigures) -> Result<(), StepError> {
    match work {
        GpuWork::LinearStack { stack, check } => {
            let output = stack.read_output()?;
            let reference = match check {
                OutputCheck::Reference(reference) => reference,
                OutputCheck::FirstStep => {
                    *check = OutputCheck::Reference(output.clone());
                    figures.normalised_errors.push(0.0);
                    figures.last_output = Some(output);
                    return Ok(());
                }
            };
            let error = normalised_error(reference, &output);
            figures.normalised_errors.push(error);
            let limit = tolerance(DType::F32);
            if error.is_nan() || error > limit {
                let (index, got, expected) = largest_difference(&output, reference);
                return Err(StepError::OverTolerance {
                    step,
                    error,
                    tolerance: limit,
                    index,
                    got,
                    expected,
                });
            }
            figures.last_output = Some(output);
            Ok(())
        }
        GpuWork::StreamVerify { verify, names } => match verify.compare()? {
            Ok(()) => Ok(()),
            Err(mismatch) => Err(WorkloadError::Corrupt {
                block: names
                    .get(mismatch.block)
                    .cloned()
                    .unwrap_or_else(|| format!("block {}", mismatch.block)),
                offset: 0,
            }
            .into()),
        },
    }
}

/// The element where `got` is furthest from `expected` (NaN counts as furthest).
pub fn largest_difference(got: &[f32], expected: &[f32]) -> (usize, f32, f32) {
    let mut worst = (0usize, f32::NAN, f32::NAN);
    let mut worst_delta = -1f32;
    for (index, (a, b)) in got.iter().zip(expected).enumerate() {
        let delta = (a - b).abs();
        let delta = if delta.is_nan() { f32::INFINITY } else { delta };
        if delta > worst_delta {
            worst_delta = delta;
            worst = (index, *a, *b);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_difference_is_reported_and_nan_wins() {
        // Proves a mismatch report points at the worst element, NaN above all.
        assert_eq!(
            largest_difference(&[1.0, 2.5, 3.0], &[1.0, 2.0, 3.1]),
            (1, 2.5, 2.0)
        );
        let (index, got, _) = largest_difference(&[1.0, f32::NAN], &[1.5, 0.0]);
        assert_eq!(index, 1);
        assert!(got.is_nan());
    }
}
