//! Why a model does not fit: a budget that cannot work, with the figures, and what to
//! change.

use serde::Serialize;
use stagehand_actors::Bytes;

use super::MIN_STAGING_BUFFERS;

/// A budget that cannot work, with the figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FitFailure {
    /// `vram_budget` asks for more than the card has after reserve and headroom.
    VramBudgetAboveDevice {
        budget_bytes: u64,
        available_bytes: u64,
    },
    /// The budget cannot hold the streaming ring.
    VramBelowRing {
        budget_bytes: u64,
        ring_bytes: u64,
        largest_block_bytes: u64,
        prefetch_depth: u32,
        /// The least budget the pipeline's plan takes at this depth (`VramPlan`).
        needed_bytes: u64,
        /// The deepest smaller prefetch depth this budget fits, if any.
        fits_at_depth: Option<u32>,
        /// The least budget at the depth that needs least (prefetch depth 0: one slot).
        least_bytes: u64,
        /// What the budget must hold beside the weights (a decoder's first KV pages, a
        /// step's activation tensors), counted in the figures above.
        activation_bytes: u64,
    },
    /// `pin_ceiling` asks for more than the host can spare above the RAM floor.
    PinCeilingAboveHost {
        ceiling_bytes: u64,
        available_bytes: u64,
    },
    /// The pin ceiling cannot hold the staging ring.
    PinnedBelowStaging {
        ceiling_bytes: u64,
        staging_bytes: u64,
        largest_block_bytes: u64,
        staging_buffers: u32,
    },
    /// A staging ring needs at least `MIN_STAGING_BUFFERS` buffers of some size.
    StagingRingUnusable {
        staging_buffers: u32,
        staging_buffer_bytes: u64,
    },
}

impl FitFailure {
    /// The setting that fails.
    pub fn budget(&self) -> &'static str {
        match self {
            FitFailure::VramBudgetAboveDevice { .. } | FitFailure::VramBelowRing { .. } => {
                "vram_budget"
            }
            FitFailure::PinCeilingAboveHost { .. } | FitFailure::PinnedBelowStaging { .. } => {
                "pin_ceiling"
            }
            FitFailure::StagingRingUnusable { .. } => "staging_buffers",
        }
    }

    /// How many bytes the budget is short (or over, for the "above" cases).
    pub fn short_by_bytes(&self) -> u64 {
        match *self {
            FitFailure::VramBudgetAboveDevice {
                budget_bytes,
                available_bytes,
            } => budget_bytes - available_bytes,
            FitFailure::VramBelowRing {
                budget_bytes,
                needed_bytes,
                ..
            } => needed_bytes.saturating_sub(budget_bytes),
            FitFailure::PinCeilingAboveHost {
                ceiling_bytes,
                available_bytes,
            } => ceiling_bytes - available_bytes,
            FitFailure::PinnedBelowStaging {
                ceiling_bytes,
                staging_bytes,
                ..
            } => staging_bytes - ceiling_bytes,
            FitFailure::StagingRingUnusable {
                staging_buffers,
                staging_buffer_bytes,
            } => {
                let wanted = u64::from(staging_buffers.max(MIN_STAGING_BUFFERS))
                    * staging_buffer_bytes.max(1);
                wanted.saturating_sub(u64::from(staging_buffers) * staging_buffer_bytes)
            }
        }
    }
}

impl std::fmt::Display for FitFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let short = Bytes(self.short_by_bytes());
        match *self {
            FitFailure::VramBudgetAboveDevice { budget_bytes, available_bytes } => write!(
                f,
                "vram_budget {} is {short} more than the card has after reserve_vram and vram_headroom ({}); set --vram-budget {} or less",
                Bytes(budget_bytes),
                Bytes(available_bytes),
                Bytes(available_bytes).flag_value_at_most()
            ),
            FitFailure::VramBelowRing { budget_bytes, ring_bytes, largest_block_bytes, prefetch_depth, needed_bytes, fits_at_depth, least_bytes, activation_bytes } => {
                let activations = match activation_bytes {
                    0 => String::new(),
                    bytes => format!(" + activations {}", Bytes(bytes)),
                };
                if needed_bytes == ring_bytes {
                    write!(
                        f,
                        "vram_budget {} is {short} short of the streaming ring: largest block {} × (prefetch_depth {prefetch_depth} + 1){activations} = {}",
                        Bytes(budget_bytes),
                        Bytes(largest_block_bytes),
                        Bytes(ring_bytes)
                    )?;
                } else {
                    write!(
                        f,
                        "vram_budget {} is {short} short of the {} this model needs at prefetch_depth {prefetch_depth} (blocks too large to stream kept resident, plus a ring of {} slots{activations})",
                        Bytes(budget_bytes),
                        Bytes(needed_bytes),
                        prefetch_depth + 1
                    )?;
                }
                match fits_at_depth {
                    Some(depth) => write!(
                        f,
                        "; set --vram-budget {} or more, or --prefetch-depth {depth}",
                        Bytes(needed_bytes).flag_value_at_least()
                    ),
                    // No depth fits: the least budget is the one at depth 0.
                    None if prefetch_depth > 0 => write!(
                        f,
                        "; set --vram-budget {} or more with --prefetch-depth 0 (one slot; {} at prefetch_depth {prefetch_depth})",
                        Bytes(least_bytes).flag_value_at_least(),
                        Bytes(needed_bytes)
                    ),
                    None => write!(f, "; set --vram-budget {} or more", Bytes(needed_bytes).flag_value_at_least()),
                }
            }
            FitFailure::PinCeilingAboveHost { ceiling_bytes, available_bytes } => write!(
                f,
                "pin_ceiling {} is {short} more than the host can spare above its RAM floor ({}); set --pin-ceiling {} or less, or add RAM",
                Bytes(ceiling_bytes),
                Bytes(available_bytes),
                Bytes(available_bytes).flag_value_at_most()
            ),
            FitFailure::PinnedBelowStaging { ceiling_bytes, staging_bytes, largest_block_bytes, staging_buffers } => {
                write!(
                    f,
                    "pin_ceiling {} is {short} short of the staging ring: largest block {} × {staging_buffers} staging buffers = {}; set --pin-ceiling {} or more",
                    Bytes(ceiling_bytes),
                    Bytes(largest_block_bytes),
                    Bytes(staging_bytes),
                    Bytes(staging_bytes).flag_value_at_least()
                )?;
                if staging_buffers > MIN_STAGING_BUFFERS
                    && largest_block_bytes * u64::from(MIN_STAGING_BUFFERS) <= ceiling_bytes
                {
                    write!(f, ", or --staging-buffers {MIN_STAGING_BUFFERS}")?;
                }
                Ok(())
            }
            FitFailure::StagingRingUnusable { staging_buffers, staging_buffer_bytes } => write!(
                f,
                "a staging ring of {staging_buffers} × {} cannot stream: it needs at least {MIN_STAGING_BUFFERS} buffers of more than 0 bytes; raise --staging-buffers or --staging-buffer-size",
                Bytes(staging_buffer_bytes)
            ),
        }
    }
}
