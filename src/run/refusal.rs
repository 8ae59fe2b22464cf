//! A VRAM budget refused by the plan, as the run words it: the plan checked what was
//! left after the run's set-asides, so the flag's value needs them on top.

use stagehand_actors::{Bytes, PlanError, SessionError};

use super::error::{Budget, RunError};

/// A VRAM budget below the plan's minimum, checked net of the set-asides (KV pages,
/// LoRA regions, an expert cache): the flag needs them on top, and the message says
/// so with the plan's own breakdown of the weights' share and, as the plan does, the
/// smaller prefetch depth the budget fits as it is (`fits_at_depth`).
pub(super) fn vram_refusal(
    error: SessionError,
    given: Bytes,
    needed: Bytes,
    fits_at_depth: Option<u32>,
    vram_budget_bytes: u64,
) -> RunError {
    let whole = vram_budget_bytes.max(given.0);
    let set_aside = whole - given.0;
    let least = least_at_flag(Bytes(needed.0 + set_aside));
    let message = if set_aside == 0 {
        error.to_string()
    } else {
        let depth = fits_at_depth.map_or(String::new(), |depth| {
            format!(", or --prefetch-depth {depth}")
        });
        format!(
            "vram_budget {} is below the {} this model needs at minimum ({} set aside for activations, LoRA regions or experts before the weights are planned + {needed} for the weights{}): set --vram-budget {} or more{depth}",
            Bytes(whole),
            Bytes(needed.0 + set_aside),
            Bytes(set_aside),
            weights_breakdown(&error),
            Bytes(least).flag_value_at_least(),
        )
    };
    RunError::BudgetTooSmall {
        budget: Budget::Vram,
        given_bytes: whole,
        least_bytes: least,
        message,
        source: Some(Box::new(error)),
    }
}

/// The plan's own account of the weights' minimum: ": largest block 32 MiB ×
/// (prefetch_depth 2 + 1)".
fn weights_breakdown(error: &SessionError) -> String {
    match error {
        SessionError::Plan(PlanError::VramBudgetTooSmall { largest, depth, .. }) => {
            format!(": largest block {largest} × (prefetch_depth {depth} + 1)")
        }
        SessionError::Plan(PlanError::VramBudgetTooSmallForLargeBlocks {
            oversized,
            slot,
            depth,
            ..
        }) => format!(
            ": {oversized} of blocks too large to stream, kept resident, + largest streamed block {slot} × (prefetch_depth {depth} + 1)"
        ),
        _ => String::new(),
    }
}

/// What `--vram-budget`/`--pin-ceiling` states for "at least `bytes`", in bytes (the
/// message's `set --vram-budget 1.5MiB or more`, parsed back): a retry with it passes.
pub(super) fn least_at_flag(bytes: Bytes) -> u64 {
    bytes
        .flag_value_at_least()
        .parse::<bytesize::ByteSize>()
        .map_or(bytes.0, |size| size.as_u64().max(bytes.0))
}
