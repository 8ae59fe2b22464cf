//! How a pipeline's stages are checked against the resident pass, and when.
//!
//! Where people work the check is cheap: every block against the file as it lands,
//! and the first step recomputed from resident blocks — unless the first step is the
//! whole stage (an encoder's, the VAE's), which that would compute twice. A run does
//! that recompute after its last step. For most stages that is where it belongs; for
//! Wan 2.2's high-noise expert it put a whole resident step between its last step and
//! the low-noise expert's first (24.75 s of a 26.5 s switch at 160 × 96 on two cores).
//! So a stage may defer its first step's check ([`PipelineRun::stage_deferred`]): its
//! run checks the weights as they land and keeps its outputs, and the pipeline checks
//! the first step when nothing waits on it (the video pipeline: after sampling, before
//! the VAE, when no session holds a byte). The check itself is the run's own
//! ([`crate::run::verify_first_step`]).

use std::time::Instant;

use super::{PipelineError, PipelinePart, PipelineRun, Stage};
use crate::families::{Extras, WorkloadKind};
use crate::run::{verify_first_step, Prepared, RunError};
use crate::settings::Verify;

/// A stage's first step left unchecked by its run, to be checked by
/// [`FirstStepCheck::check`] before the pipeline's result is given out. Move-only:
/// the check is done once.
#[must_use = "a deferred first step must be checked"]
pub(super) struct FirstStepCheck {
    prepared: Prepared,
}

impl FirstStepCheck {
    /// Checks the first step of `stage` (the stage this check was deferred from)
    /// against the fully-resident pass; on success the stage's report counts it.
    pub(super) fn check(
        self,
        run: &PipelineRun<'_>,
        stage: &mut Stage,
    ) -> Result<(), PipelineError> {
        let failed = |source| PipelineError::Stage {
            stage: stage.name,
            source,
        };
        if run.stop.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(failed(RunError::Cancelled {
                message: "stopped before its first step was checked".into(),
            }));
        }
        let checked = verify_first_step(&self.prepared, run.settings, &mut stage.outcome);
        checked.map_err(|error| failed(RunError::from(error)))
    }
}

impl PipelineRun<'_> {
    /// The check a stage of `steps` steps runs: the settings' `verify`, else the cheap
    /// one (the first step recomputed only when the stage has more than one).
    pub(super) fn verify_for(&self, steps: u64) -> Verify {
        self.settings.verify.unwrap_or(match steps {
            0 | 1 => Verify::Weights,
            _ => Verify::First,
        })
    }

    /// [`PipelineRun::stage`] of `steps` steps (batch 1) whose first step's check, when
    /// the stage would make one (`verify = first`), is left to the caller: the run
    /// checks the weights as they land, and the returned [`FirstStepCheck`] the first
    /// step when the caller chooses. Any other `verify` runs as it would.
    pub(super) fn stage_deferred(
        &self,
        (name, kind): (&'static str, WorkloadKind),
        model: &PipelinePart,
        extras: &Extras,
        steps: u64,
    ) -> Result<(Stage, Option<FirstStepCheck>), PipelineError> {
        let started = Instant::now();
        let prepared = self.open((name, kind), model, extras, 1)?;
        self.run_deferred((name, started), model, prepared, steps)
    }

    /// [`PipelineRun::stage_deferred`] of a model already opened (at `started`).
    pub(super) fn run_deferred(
        &self,
        (name, started): (&'static str, Instant),
        model: &PipelinePart,
        prepared: Prepared,
        steps: u64,
    ) -> Result<(Stage, Option<FirstStepCheck>), PipelineError> {
        let verify = self.verify_for(steps);
        // A LoRA run's first step may take the low-rank path, checked within a
        // tolerance as it runs; `verify_first_step` checks bit for bit.
        let deferred = verify == Verify::First && prepared.workload.lora.is_empty();
        let verify = if deferred { Verify::Weights } else { verify };
        let stage = self.run_opened((name, started), model, &prepared, (steps, verify))?;
        Ok((stage, deferred.then_some(FirstStepCheck { prepared })))
    }
}
