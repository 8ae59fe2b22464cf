//! What a run keeps of its steps' outputs for the check against the fully-resident
//! reference after its last step (so the reference pass never competes with the
//! measured steps), and the check itself.

use std::ops::ControlFlow;

use stagehand_actors::SessionError;

use super::reference::Reference;
use super::report::RunReport;
use crate::compute::Compute;
use crate::families::linear_stack::{first_difference, first_difference_within};
use crate::families::lora_set::LORA_TOLERANCE;
use crate::families::{Family, FamilyError};

/// The output of a step, kept until the run is verified after its last step: whole
/// when small or when it is checked within a tolerance, else as a hash of its bits.
enum Recorded {
    Whole(Vec<f32>),
    Hash { hash: u64, length: usize },
}

/// Outputs up to this many values are kept whole for the final check.
const WHOLE_OUTPUT_VALUES: usize = 1 << 16;

/// Steps, and bytes of outputs, recorded for the check after the last step at most;
/// a run with more steps (`--steps` is the user's) checks the rest as it goes, so its
/// memory does not grow with its length.
const RECORDED_STEPS: usize = 100_000;
const RECORDED_BYTES: usize = 256 << 20;

fn bits_hash(values: &[f32]) -> u64 {
    let bytes: Vec<u8> = values
        .iter()
        .flat_map(|value| value.to_bits().to_le_bytes())
        .collect();
    crate::compute::checksum::checksum(&bytes)
}

/// The outputs kept so far: each step's, whether it took the low-rank path.
pub(super) struct Recorder {
    recorded: Vec<(u64, Recorded, bool)>,
    bytes: usize,
    /// Check each step as it goes instead of keeping it (a run without a step count,
    /// or one past the bound on what is kept).
    inline: bool,
}

impl Recorder {
    pub(super) fn new(inline: bool) -> Self {
        Self {
            recorded: Vec::new(),
            bytes: 0,
            inline,
        }
    }

    /// Keeps step `step`'s output for [`Recorder::verify`], or checks it now. `Break`:
    /// a stop request cut the reference short; the step ran but is not counted as
    /// verified, and the run ends here.
    pub(super) fn check_or_keep<C: Compute, F: Family>(
        &mut self,
        compute: &C,
        reference: &mut Reference<'_, C, F>,
        step: u64,
        values: &[f32],
        low_rank: bool,
        report: &mut RunReport,
    ) -> Result<ControlFlow<()>, FamilyError> {
        // What is kept for the check after the last step is bounded too: past the
        // bound, the remaining steps are checked as they go.
        if self.recorded.len() >= RECORDED_STEPS || self.bytes >= RECORDED_BYTES {
            self.inline = true;
        }
        if self.inline {
            return match check(compute, reference, step, values, low_rank) {
                Ok(()) => {
                    report.verified_steps += 1;
                    Ok(ControlFlow::Continue(()))
                }
                Err(FamilyError::Session(SessionError::Interrupted)) => Ok(ControlFlow::Break(())),
                Err(error) => Err(error),
            };
        }
        let kept = if low_rank || values.len() <= WHOLE_OUTPUT_VALUES {
            Recorded::Whole(values.to_vec())
        } else {
            Recorded::Hash {
                hash: bits_hash(values),
                length: values.len(),
            }
        };
        self.bytes += match &kept {
            Recorded::Whole(values) => values.len() * 4,
            Recorded::Hash { .. } => 16,
        };
        self.recorded.push((step, kept, low_rank));
        Ok(ControlFlow::Continue(()))
    }

    /// Checks each recorded step against the reference, in step order.
    pub(super) fn verify<C: Compute, F: Family>(
        self,
        compute: &C,
        reference: &mut Reference<'_, C, F>,
        report: &mut RunReport,
    ) -> Result<(), FamilyError> {
        for (step, kept, low_rank) in self.recorded {
            let checked = match kept {
                Recorded::Whole(values) => check(compute, reference, step, &values, low_rank),
                Recorded::Hash { hash, length } => match reference.expected(compute, step) {
                    Ok(expected) if expected.len() != length || bits_hash(expected) != hash => {
                        Err(FamilyError::internal(format!(
                            "output mismatch at step {step}: its {length} values differ from the fully-resident reference's"
                        )))
                    }
                    Ok(_) => Ok(()),
                    Err(error) => Err(error),
                },
            };
            match checked {
                Ok(()) => report.verified_steps += 1,
                // A stop request cut the reference pass short: the steps checked so far
                // stand, the rest are reported as not verified.
                Err(FamilyError::Session(SessionError::Interrupted)) => return Ok(()),
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }
}

/// Compares a step's output with the reference: bit for bit, or within the LoRA
/// tolerance when a block took the low-rank path.
fn check<C: Compute, F: Family>(
    compute: &C,
    reference: &mut Reference<'_, C, F>,
    step: u64,
    got: &[f32],
    low_rank: bool,
) -> Result<(), FamilyError> {
    let expected = reference.expected(compute, step)?;
    compare(step, got, expected, low_rank)
}

/// A step's output against its reference: bit for bit, or within the LoRA tolerance
/// when a block took the low-rank path (a length that differs is a mismatch too).
pub(super) fn compare(
    step: u64,
    got: &[f32],
    expected: &[f32],
    low_rank: bool,
) -> Result<(), FamilyError> {
    let difference = if low_rank {
        first_difference_within(got, expected, LORA_TOLERANCE)
    } else {
        first_difference(got, expected)
    };
    match difference {
        None => Ok(()),
        Some((index, got, expected)) => Err(FamilyError::Mismatch {
            step,
            index,
            got,
            expected,
        }),
    }
}
