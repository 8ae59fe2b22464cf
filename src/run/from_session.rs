//! The actors' [`SessionError`] as the run's kind (the list in [`RunError`]'s docs).

use std::path::PathBuf;

use stagehand_actors::{Bytes, PlanError, SessionError};

use super::error::{Budget, Cause, RunError};
use super::refusal::{least_at_flag, vram_refusal};

impl RunError {
    /// A session that could not start or failed, by kind: a plan whose budgets are
    /// too small names the budget and the least that works. `vram_budget_bytes`: the
    /// session's VRAM budget.
    pub(crate) fn from_session(error: SessionError, vram_budget_bytes: u64) -> Self {
        let message = error.to_string();
        let budget = |budget, given: Bytes, least: Bytes, error| RunError::BudgetTooSmall {
            budget,
            given_bytes: given.0,
            least_bytes: least_at_flag(least),
            message: message.clone(),
            source: Some(Box::new(error) as Cause),
        };
        match error {
            SessionError::Plan(PlanError::VramBudgetTooSmall {
                budget: given,
                needed,
                fits_at_depth,
                ..
            })
            | SessionError::Plan(PlanError::VramBudgetTooSmallForLargeBlocks {
                budget: given,
                needed,
                fits_at_depth,
                ..
            }) => vram_refusal(error, given, needed, fits_at_depth, vram_budget_bytes),
            SessionError::Plan(PlanError::PinCeilingTooSmall {
                ceiling, needed, ..
            }) => budget(Budget::PinCeiling, ceiling, needed, error),
            SessionError::NoPlace { needed, .. } => {
                budget(Budget::Vram, Bytes(vram_budget_bytes), needed, error)
            }
            SessionError::LoraPinCeiling {
                requested_bytes,
                available_bytes,
                ceiling_bytes,
            } => budget(
                Budget::PinCeiling,
                Bytes(ceiling_bytes),
                Bytes(ceiling_bytes + requested_bytes.saturating_sub(available_bytes)),
                error,
            ),
            SessionError::Plan(PlanError::Zero { what }) => RunError::setting(what, message),
            SessionError::Interrupted => RunError::Cancelled { message },
            SessionError::ReadFailed {
                ref file,
                file_changed,
                ..
            } => {
                // An adapter's fault that names no file (an injected one) has no path.
                let path = file.as_ref().map(PathBuf::from).unwrap_or_default();
                let source = Some(Box::new(error) as Cause);
                if file_changed {
                    RunError::CheckpointChanged {
                        path,
                        message,
                        source,
                    }
                } else {
                    RunError::Io {
                        path,
                        message,
                        source,
                    }
                }
            }
            SessionError::Device(_)
            | SessionError::CopyFailed { .. }
            | SessionError::PinFailed(_) => RunError::Device {
                message,
                source: Some(Box::new(error)),
            },
            // Room taken now by others (activations, an adapter's regions, blocks
            // evicted as soon as they landed): the next try may fit.
            SessionError::Activations(_) | SessionError::Starved { .. } => RunError::NoRoom {
                message,
                source: Some(Box::new(error)),
            },
            SessionError::TooManyAdapters { .. } => RunError::BadRequest {
                field: "lora".to_string(),
                message,
                source: Some(Box::new(error)),
            },
            // The compute side asked what the session cannot mean: a block past the
            // layout, a LoRA request out of order, a call after the session stopped,
            // an empty step order. Stagehand builds every one of those.
            SessionError::UnknownBlock { .. }
            | SessionError::Stopped
            | SessionError::Lora { .. }
            | SessionError::Plan(_) => RunError::Internal {
                message,
                source: Some(Box::new(error)),
            },
        }
    }
}
