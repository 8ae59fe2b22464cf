//! Loaded models that share one VRAM budget and one pin ceiling (serve's `[budget]`,
//! or an embedder's own [`SharedBudget`]): each keeps its own session, started with
//! the arena of the whole shared VRAM budget and a lease of it; before each job the
//! model asks the broker for room (the others give way, least recently used first,
//! block by block), and between jobs it says it is idle.
//!
//! What a model asks: its floor is the least its plan runs in (the ring at its
//! prefetch depth, blocks too large to stream, an expert cache, the first
//! activations, the regions of its largest LoRA set; the staging ring of pinned RAM
//! and that set's packs), its want what it would use alone
//! (every block resident beside the ring and the activations of a full batch;
//! every block pinned).

use stagehand_actors::{Lease, PoolAsk, PoolError, SharedBudget};

use crate::run::{
    fitting_depth, lora_pack_bytes, lora_region_bytes, BudgetAsk, Budgets, Prepared, RunError,
};
use crate::settings::Settings;
use stagehand_actors::arena_bytes;

/// One model's place in a shared budget.
#[derive(Clone)]
pub struct SharedMember {
    /// The broker.
    pub pool: SharedBudget,
    /// The model's name in it (serve's model name).
    pub name: String,
}

impl SharedMember {
    /// The whole shared budget: each member's arena is its VRAM part.
    pub fn pool_total(&self) -> Lease {
        self.pool.total()
    }

    /// The arena a member's session starts with: the whole shared VRAM budget.
    pub fn capacity_bytes(&self) -> u64 {
        self.pool.total().vram_bytes
    }

    /// The model is about to run a job: it is ranked first and grown toward its want.
    /// Returns its lease now (`None`, logged, when the broker refused).
    pub fn begin_use(&self) -> Option<Lease> {
        self.pool
            .begin_use(&self.name)
            .inspect_err(|error| tracing::warn!("shared budget: {}: {error}", self.name))
            .ok()
    }

    /// The model found no room for any of its work: [`Self::begin_use`]. Returns
    /// whether its VRAM lease grew (another model gave way); false when nothing more
    /// can be had now.
    pub fn ask_for_room(&self) -> bool {
        let before = (self.pool.snapshot().into_iter())
            .find(|member| member.name == self.name)
            .map_or(0, |member| member.lease.vram_bytes);
        self.begin_use()
            .is_some_and(|after| after.vram_bytes > before)
    }

    /// The model waits for a job: it gives way first.
    pub fn end_use(&self) {
        self.pool.end_use(&self.name);
    }
}

/// Leaves the shared budget when dropped (a model's session has finished, or never
/// started): its lease is free for the others. Leaving twice is harmless.
pub(crate) struct LeaveOnDrop(pub Option<SharedMember>);

impl Drop for LeaveOnDrop {
    fn drop(&mut self) {
        if let Some(member) = &self.0 {
            let _ = member.pool.leave(&member.name);
        }
    }
}

/// Opens a budget of `vram_bytes` of VRAM and `pin_bytes` of pinned RAM to share.
pub fn open_shared_budget(vram_bytes: u64, pin_bytes: u64) -> Result<SharedBudget, RunError> {
    if vram_bytes == 0 || pin_bytes == 0 {
        return Err(RunError::setting(
            if vram_bytes == 0 {
                "budget.vram_budget"
            } else {
                "budget.pin_ceiling"
            },
            "budget.vram_budget and budget.pin_ceiling must be above 0",
        ));
    }
    SharedBudget::start(Lease {
        vram_bytes,
        pin_bytes,
    })
    .map_err(pool_error)
}

/// The floor and want of `prepared` at prefetch `depth`, for `ask`'s steps.
pub fn pool_ask(prepared: &Prepared, settings: &Settings, depth: u32, ask: BudgetAsk) -> PoolAsk {
    let (minimum, total) = prepared.plan_minimum_bytes(depth, ask.policy);
    let layout = prepared.facts().layout();
    let slot = arena_bytes(layout.largest_block_bytes());
    let ring = slot * u64::from(depth + 1);
    let staging = if settings.fast_disk {
        0
    } else {
        (settings.staging_buffers.max(2) as u64) * slot
    };
    // The largest adapter set the model may attach: its VRAM regions beside the
    // ring, its packs pinned (a switch to it must fit whatever the others hold).
    let lora_regions = lora_region_bytes(prepared, depth);
    let lora_pinned = lora_pack_bytes(prepared);
    PoolAsk {
        floor: Lease {
            vram_bytes: minimum + prepared.activation_bytes(1) + lora_regions,
            pin_bytes: staging + lora_pinned,
        },
        want: Lease {
            vram_bytes: total + ring + prepared.activation_bytes(ask.steps) + lora_regions,
            pin_bytes: layout.total_bytes() + staging + lora_pinned,
        },
    }
}

/// The budgets and prefetch depth of `prepared` in `member`'s shared budget: the
/// depth that fits the whole of it, then the lease the broker gives the model's ask
/// (its floor and want) — joining the budget under `member`'s name.
pub fn shared_budgets(
    prepared: &Prepared,
    settings: &Settings,
    ask: BudgetAsk,
    member: &SharedMember,
) -> Result<(Budgets, u32), RunError> {
    let whole = member.pool_total();
    let whole = Budgets {
        vram_budget_bytes: whole.vram_bytes,
        pin_ceiling_bytes: whole.pin_bytes,
    };
    let depth = fitting_depth(prepared, settings, whole, ask);
    let lease = member
        .pool
        .join(&member.name, pool_ask(prepared, settings, depth, ask))
        .map_err(pool_error)?;
    let budgets = Budgets {
        vram_budget_bytes: lease.vram_bytes,
        pin_ceiling_bytes: lease.pin_bytes,
    };
    Ok((budgets, depth))
}

/// What the shared budget refused, by kind: a model that does not fit beside the
/// others names the budget to raise and the least it needs; a name already in the
/// budget is the setting to change (serve's `models.name`, a [`SharedMember`]'s
/// `name`); the rest (a name not in it, a lease past the budget, a broker that
/// stopped or whose thread could not start) break the broker's protocol.
pub(crate) fn pool_error(error: PoolError) -> RunError {
    let message = error.to_string();
    let (total, needed) = match &error {
        PoolError::DoesNotFit { total, needed, .. } => (*total, *needed),
        PoolError::Taken(_) => return RunError::setting("models.name", message),
        _ => {
            return RunError::Internal {
                message,
                source: Some(Box::new(error)),
            }
        }
    };
    let (budget, given_bytes, least_bytes) = if needed.vram_bytes > total.vram_bytes {
        (
            crate::run::Budget::Vram,
            total.vram_bytes,
            needed.vram_bytes,
        )
    } else {
        (
            crate::run::Budget::PinCeiling,
            total.pin_bytes,
            needed.pin_bytes,
        )
    };
    RunError::BudgetTooSmall {
        budget,
        given_bytes,
        least_bytes,
        message,
        source: Some(Box::new(error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_budgets_refusal_keeps_its_kind() {
        // Proves a shared budget's refusals are kinds, not words: one that does not fit
        // names the budget and the least it needs, a name already in it is a setting,
        // a broken protocol is stagehand's own bug (all three were `BadInput` or
        // `Failed` strings).
        let lease = |vram_bytes, pin_bytes| Lease {
            vram_bytes,
            pin_bytes,
        };
        let does_not_fit = pool_error(PoolError::DoesNotFit {
            name: "a".into(),
            total: lease(100, 100),
            needed: lease(150, 10),
        });
        assert!(
            matches!(
                does_not_fit,
                RunError::BudgetTooSmall {
                    budget: crate::run::Budget::Vram,
                    given_bytes: 100,
                    least_bytes: 150,
                    ..
                }
            ),
            "{does_not_fit:?}"
        );
        let taken = pool_error(PoolError::Taken("a".into()));
        assert!(
            matches!(&taken, RunError::BadSetting { key, .. } if key == "models.name"),
            "{taken:?}"
        );
        assert_eq!(taken.exit_code(), 2);
        let exceeded = pool_error(PoolError::Exceeded {
            name: "a".into(),
            reported: lease(2, 0),
            free: lease(1, 0),
        });
        assert!(
            matches!(exceeded, RunError::Internal { .. }),
            "{exceeded:?}"
        );
        assert_eq!(exceeded.exit_code(), 1);
    }
}
