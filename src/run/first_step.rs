//! `verify = first`'s recompute of a run's first step, done when its owner chooses
//! rather than at the end of the run.
//!
//! A run checks its first step after its last one (the reference never competes with
//! the measured steps), which puts a whole resident step between that run and the
//! next. Between Wan 2.2's two experts that was most of the switch (24.75 s of 26.5 s
//! at 160 × 96 on two cores). A pipeline can instead run the stage with
//! `verify = weights` (every block still checked against the file as it lands), its
//! outputs kept, and hand the outcome here later — when no session holds a budget and
//! nothing waits on it. The check is the run's own: the same family's first step
//! over blocks read from the files ([`Workload::reference`](super::driver::Workload::reference)), on a compute built as
//! the run's was, compared bit for bit.

use crate::families::{Family, FamilyError, Visit};
use crate::settings::{Settings, Verify};

use super::{Outcome, Prepared};

/// Checks the first step of `outcome` — a CPU run of `prepared` under `settings`
/// that kept its outputs and did not check them (`verify = weights`) — against the
/// fully-resident pass, bit for bit; on success the step counts as verified and the
/// report says `verify = first`. A run with LoRA sets (whose blocks may take the
/// low-rank path, checked within a tolerance) is refused: check it as it runs.
pub fn verify_first_step(
    prepared: &Prepared,
    settings: &Settings,
    outcome: &mut Outcome,
) -> Result<(), FamilyError> {
    let workload = &prepared.workload;
    if !workload.lora.is_empty() {
        return Err(FamilyError::internal(
            "a run with LoRA checks its first step as it runs, within the LoRA tolerance".into(),
        ));
    }
    let key = workload.model.visit(KeyOf(0));
    let Some(got) = outcome.report.outputs.get(&key) else {
        return Err(FamilyError::internal(
            "the run kept no output of its first step to check".into(),
        ));
    };
    let compute = super::execute::cpu_compute(prepared, settings, outcome.budgets);
    let expected = workload.reference(&compute, &prepared.index, 0)?;
    super::recorded::compare(0, got, &expected, false)?;
    outcome.report.verified_steps += 1;
    outcome.report.verify = Verify::First;
    Ok(())
}

/// The reference key of a step, whichever family the workload holds.
struct KeyOf(u64);

impl Visit for KeyOf {
    type Output = u64;

    fn visit<F: Family>(self, family: &F) -> u64 {
        family.reference_key(self.0)
    }
}
