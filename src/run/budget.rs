//! The one budget policy (docs/configuration.md, "Budgets that work out of the box"), used by `run`,
//! `embed`, `generate`, `bench`, `validate` and the CUDA backend alike:
//!
//! 1. **Configured or a share of the model** ([`resolve_budgets`]): `vram_budget` as
//!    set, else a share of the streamed bytes (40 %, so the demo really streams); the
//!    pin ceiling as set, else half the model for a generated demo, else what the host
//!    can spare — and never more than the free RAM above `ram_floor`.
//! 2. **Raised to what the plan needs** ([`automatic_budget`]): an automatic VRAM
//!    budget, plus the activations the run reserves (a decoder's KV cache), is raised
//!    to the planner's minimum at the run's prefetch depth.
//! 3. **Room for a demo's pinned cache** ([`demo_pin_room`]).
//!
//! [`budgets_for`] is all three. Every footprint counts what the arena really takes:
//! blocks rounded up to [`stagehand_actors::SLOT_ALIGN`] ([`arena_bytes`]).

use stagehand_actors::{arena_bytes, BlockId, Bytes, ResidencyPolicy, StepOrder, VramPlan};

use super::{memory, Prepared};
use crate::os::available_ram_bytes;
use crate::settings::Settings;

/// Share of the model the VRAM budget defaults to, so the demo streams.
pub const DEFAULT_VRAM_FRACTION: f64 = 0.4;
/// Share of the model a demo's pin ceiling defaults to, so the disk tier works too.
pub const DEFAULT_DEMO_PIN_FRACTION: f64 = 0.5;
/// Blocks of pinned cache an automatic demo ceiling keeps beside the staging ring.
const DEMO_CACHE_BLOCKS: u64 = 2;

/// The budgets a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Budgets {
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
}

/// What a run asks of the budget policy beside its settings.
#[derive(Debug, Clone, Copy)]
pub struct BudgetAsk {
    /// Steps the run takes (a decoder's KV cache grows with them; 0: until stopped,
    /// counted as one).
    pub steps: u64,
    pub policy: ResidencyPolicy,
    /// Share of the streamed bytes an automatic VRAM budget starts from.
    pub vram_share: f64,
}

impl BudgetAsk {
    /// A run of `steps` steps under the planned policy, at the default share.
    pub fn steps(steps: u64) -> Self {
        Self {
            steps,
            policy: ResidencyPolicy::Planned,
            vram_share: DEFAULT_VRAM_FRACTION,
        }
    }
}

/// The budgets for a prepared model: the three steps of the module docs.
pub fn budgets_for(prepared: &Prepared, settings: &Settings, ask: BudgetAsk) -> Budgets {
    let model_bytes = prepared.streamed_model_bytes();
    let budgets = resolve_with_share(settings, model_bytes, prepared.is_demo, ask.vram_share);
    let budgets = automatic_budget(prepared, settings, budgets, ask.steps, ask.policy);
    demo_pin_room(prepared, settings, budgets)
}

/// Step 1 at the default share.
pub fn resolve_budgets(settings: &Settings, model_bytes: u64, is_demo: bool) -> Budgets {
    resolve_with_share(settings, model_bytes, is_demo, DEFAULT_VRAM_FRACTION)
}

fn resolve_with_share(settings: &Settings, model_bytes: u64, is_demo: bool, share: f64) -> Budgets {
    let vram_budget_bytes = settings
        .vram_budget
        .map(|size| size.as_u64())
        .unwrap_or((model_bytes as f64 * share) as u64);
    // What may be pinned: MemAvailable less the floor and less the fast-disk staging
    // ring, which is pinned beside the ceiling (every pinned byte counts against the floor).
    let spare = available_ram_bytes().map(|available| memory::pinnable_bytes(available, settings));
    let wanted = match settings.pin_ceiling {
        Some(size) => size.as_u64(),
        None if is_demo => (model_bytes as f64 * DEFAULT_DEMO_PIN_FRACTION) as u64,
        None => spare.unwrap_or(model_bytes),
    };
    let pin_ceiling_bytes = match spare {
        Some(spare) if wanted > spare => {
            tracing::warn!(
                "pin_ceiling lowered from {} to {} so free RAM stays above ram_floor",
                Bytes(wanted),
                Bytes(spare)
            );
            spare
        }
        _ => wanted,
    };
    Budgets {
        vram_budget_bytes,
        pin_ceiling_bytes,
    }
}

/// Step 2: the VRAM budget a run uses is the configured one, or the automatic one
/// raised to what the plan needs (a ring of `prefetch_depth + 1` slots of the largest
/// block) plus the activations it reserves, so a model runs with no flags; the note
/// says when it then fits whole.
pub fn automatic_budget(
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
    steps: u64,
    policy: ResidencyPolicy,
) -> Budgets {
    if settings.vram_budget.is_some() {
        return budgets;
    }
    let (plan_minimum, total) = plan_minimum_bytes(prepared, settings.prefetch_depth, policy);
    // LoRA regions sit in the resident area beside the weights the plan keeps there.
    let activations =
        prepared.activation_bytes(steps) + lora_region_bytes(prepared, settings.prefetch_depth);
    let minimum = plan_minimum + activations;
    let wanted = budgets.vram_budget_bytes + activations;
    if wanted >= minimum {
        return Budgets {
            vram_budget_bytes: wanted,
            ..budgets
        };
    }
    let fits = if plan_minimum >= total {
        "; the model then fits whole"
    } else {
        ""
    };
    let kv = if activations > 0 {
        format!(
            " plus {} of activations (a KV cache, a block's working set) and LoRA regions",
            Bytes(activations)
        )
    } else {
        String::new()
    };
    tracing::info!(
        "vram budget raised from {} to {}, the least this model's plan needs (a ring of {} slots of its largest block{kv}){fits}",
        Bytes(budgets.vram_budget_bytes),
        Bytes(minimum),
        settings.prefetch_depth + 1
    );
    Budgets {
        vram_budget_bytes: minimum,
        ..budgets
    }
}

/// The least VRAM budget the plan accepts at prefetch depth `depth` under `policy`
/// (the planner's own minimum: a ring of `depth + 1` slots of the largest streamed
/// block beside the blocks too large to stream — an `lm_head` many times a layer's
/// size stays resident rather than size every slot — plus an expert cache of
/// 2 × top-k slots for MoE models), and the budget that holds every block.
pub fn plan_minimum_bytes(prepared: &Prepared, depth: u32, policy: ResidencyPolicy) -> (u64, u64) {
    let facts = prepared.facts();
    let layout = facts.layout();
    let order = facts.order();
    let in_order = |index: usize| order.contains(&BlockId(index as u32));
    let largest_expert = layout
        .blocks
        .iter()
        .enumerate()
        .filter(|(index, _)| !in_order(*index))
        .map(|(_, block)| arena_bytes(block.bytes))
        .max()
        .unwrap_or(0);
    let expert_floor = facts.experts().map_or(0, |experts| 2 * experts.top_k) * largest_expert;
    let total: u64 = layout
        .blocks
        .iter()
        .map(|block| arena_bytes(block.bytes))
        .sum();
    let dense_minimum = StepOrder::new(order, layout.blocks.len()).map_or(0, |steps| {
        VramPlan::minimum_capacity_bytes(layout, &steps, depth, policy)
    });
    ((dense_minimum + expert_floor).min(total), total)
}

/// VRAM the attached LoRA adapters' regions take (the largest of the sets a session
/// may attach): per adapter, a slot for each ring
/// slot and one more (`depth + 2`), each as large as its largest pack (what the LoRA
/// offloader asks the allocator for).
pub fn lora_region_bytes(prepared: &Prepared, depth: u32) -> u64 {
    let blocks = prepared.facts().layout().len();
    prepared
        .lora_sets()
        .map(|set| {
            (0..set.adapters().len())
                .map(|adapter| {
                    let largest = (0..blocks)
                        .map(|block| set.pack_bytes(adapter, block))
                        .max()
                        .unwrap_or(0);
                    u64::from(depth + 2) * arena_bytes(largest.max(1))
                })
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// VRAM that holds the whole model resident: every block and LoRA pack in the arena,
/// plus a ring of the largest block per prefetch slot (what an automatic budget on a
/// real device never needs to exceed).
pub fn resident_need_bytes(prepared: &Prepared, prefetch_depth: u32) -> u64 {
    let layout = prepared.facts().layout();
    let blocks: u64 = layout
        .blocks
        .iter()
        .map(|block| arena_bytes(block.bytes))
        .sum();
    let ring = u64::from(prefetch_depth + 1) * arena_bytes(layout.largest_block_bytes());
    blocks + ring + lora_pack_bytes(prepared)
}

/// Bytes of every pack of the largest LoRA set the session may attach, each rounded
/// as the arena places it: what the set pins (the offloader holds all its packs in
/// pinned RAM), and what it takes in VRAM when every pack is resident. One set is
/// attached at a time (a switch detaches the last), so the largest counts.
pub fn lora_pack_bytes(prepared: &Prepared) -> u64 {
    let blocks = prepared.facts().layout().len();
    prepared
        .lora_sets()
        .map(|set| {
            (0..set.adapters().len())
                .flat_map(|adapter| {
                    (0..blocks).map(move |block| arena_bytes(set.pack_bytes(adapter, block)))
                })
                .sum::<u64>()
        })
        .max()
        .unwrap_or(0)
}

/// Step 3: a demo model's automatic pin ceiling leaves room to work.
///
/// A generated demo model (however it is named) defaults to a pin ceiling of half the
/// model, so its disk tier streams too. On a small demo (`demo-model --blocks 6 --dim
/// 64`) half the model is no more than the staging ring itself: nothing is left for a
/// pinned cache, nor for the pinned set a LoRA adapter takes from that cache, and
/// `run --lora` failed with its defaults. The automatic ceiling is therefore at least
/// the staging ring plus two of the largest blocks (a cache that can give way). A
/// ceiling the user set is left as set.
pub fn demo_pin_room(prepared: &Prepared, settings: &Settings, budgets: Budgets) -> Budgets {
    if settings.pin_ceiling.is_some() || !prepared.is_demo {
        return budgets;
    }
    let largest = prepared.facts().layout().largest_block_bytes();
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
    let wanted = staging + DEMO_CACHE_BLOCKS * largest;
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
        "pin ceiling raised from {} (half the demo model) to {}: the staging ring and {DEMO_CACHE_BLOCKS} blocks of cache",
        Bytes(budgets.pin_ceiling_bytes),
        Bytes(raised)
    );
    Budgets {
        pin_ceiling_bytes: raised,
        ..budgets
    }
}

/// The prefetch depth a run takes: the settings' when the user set one; otherwise the
/// deepest up to it (the shipped default, 2) whose plan fits `budgets` with what the
/// run reserves beside the weights, and depth 0 when none does (whose refusal then
/// names the least budget: one slot of the largest block). A deeper ring hides more of
/// each copy, but every slot is a block that could have stayed resident, so the
/// default is not exceeded here; `stagehand simulate` searches deeper ones.
pub fn fitting_depth(
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
    ask: BudgetAsk,
) -> u32 {
    let wanted = settings.prefetch_depth;
    if !settings.choose_prefetch_depth {
        return wanted;
    }
    let activations = prepared.activation_bytes(ask.steps);
    let fits = |depth: u32| {
        plan_minimum_bytes(prepared, depth, ask.policy).0 + activations <= budgets.vram_budget_bytes
    };
    let Some(depth) = (0..=wanted).rev().find(|&depth| fits(depth)) else {
        // None fits: depth 0, whose refusal names the least budget.
        return 0;
    };
    if depth < wanted {
        tracing::info!(
            "prefetch depth {depth}: the deepest the vram budget of {} fits (depth {wanted} needs {}); set --prefetch-depth to choose",
            Bytes(budgets.vram_budget_bytes),
            Bytes(plan_minimum_bytes(prepared, wanted, ask.policy).0 + activations)
        );
    }
    depth
}

impl Prepared {
    /// See [`plan_minimum_bytes`].
    pub fn plan_minimum_bytes(&self, depth: u32, policy: ResidencyPolicy) -> (u64, u64) {
        plan_minimum_bytes(self, depth, policy)
    }
}
