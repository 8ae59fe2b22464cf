//! A demo model's automatic pin ceiling leaves room to work.
//!
//! A generated demo model (however it is named) defaults to a pin ceiling of half the
//! model, so its disk tier streams too. On a small demo (`demo-model --blocks 6 --dim
//! 64`) half the model is no more than the staging ring itself: nothing is left for a
//! pinned cache, nor for the pinned set a LoRA adapter takes from that cache, and
//! `run --lora` failed with its defaults. The automatic ceiling is therefore at least
//! the staging ring plus two of the largest blocks (a cache that can give way). A
//! ceiling the user set is left as set.

use stagehand_actors::Bytes;

use super::{available_ram_bytes, Budgets, Prepared};
use crate::settings::Settings;

/// Blocks of pinned cache an automatic demo ceiling keeps beside the staging ring.
const CACHE_BLOCKS: u64 = 2;

pub fn demo_pin_room(prepared: &Prepared, settings: &Settings, budgets: Budgets) -> Budgets {
    if settings.pin_ceiling.is_some() || !prepared.is_demo {
        return budgets;
    }
    let largest = prepared.workload.layout().largest_block_bytes();
    // As `session_config` stages: whole blocks, as many as the depth keeps busy; the
    // fast-disk chunk ring sits beside the ceiling instead.
    let staging = if settings.fast_disk {
        0
    } else {
        largest
            * u64::from(
                settings
                    .staging_buffers
                    .clamp(2, settings.prefetch_depth + 2),
            )
    };
    let wanted = staging + CACHE_BLOCKS * largest;
    if budgets.pin_ceiling_bytes >= wanted {
        return budgets;
    }
    let spare = available_ram_bytes()
        .map(|available| available.saturating_sub(settings.ram_floor.as_u64()));
    let raised = spare.map_or(wanted, |spare| wanted.min(spare));
    if raised <= budgets.pin_ceiling_bytes {
        return budgets;
    }
    tracing::info!(
        "pin ceiling raised from {} (half the demo model) to {}: the staging ring and {CACHE_BLOCKS} blocks of cache",
        Bytes(budgets.pin_ceiling_bytes),
        Bytes(raised)
    );
    Budgets {
        pin_ceiling_bytes: raised,
        ..budgets
    }
}
