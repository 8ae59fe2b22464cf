//! What the two experts held together while both were open, and what the second
//! loaded before its first step: each expert's session reports its tiers' usage and
//! its transfers to an observer of its own, and this one sums them.

use std::sync::{Arc, Mutex, PoisonError};

use stagehand_actors::{Lease, Link, Observer, Owner, Tier, TierUsage};

/// The two experts side by side, as measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BothOpen {
    /// Model bytes of the second expert that reached VRAM before its first step
    /// began (its start sent): the prefetch during the first expert's last step.
    pub prefetched_bytes: u64,
    /// The most VRAM both experts' sessions held at once (weights and activations).
    pub peak_vram_bytes: u64,
    /// The most pinned RAM both held at once.
    pub peak_pinned_bytes: u64,
    /// The one budget both ran in: the shared VRAM budget and pin ceiling.
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
    /// The least VRAM each expert's plan runs in (its ring, what cannot stream, its
    /// activations): two of them must fit in the budget for the second to open
    /// beside the first.
    pub expert_floor_vram_bytes: u64,
}

/// The sums, fed by both experts' observers.
#[derive(Default)]
pub(super) struct Pair {
    state: Mutex<PairState>,
}

#[derive(Default)]
struct PairState {
    /// Per expert, per tier (VRAM, pinned): the bytes last reported in use.
    used: [[u64; 2]; 2],
    /// Per tier: the most both held at once.
    peak: [u64; 2],
    second_began: bool,
    prefetched_bytes: u64,
}

impl Pair {
    /// The observer of expert `expert` (0: the first, 1: the second).
    pub(super) fn expert(self: &Arc<Self>, expert: usize) -> ExpertUsage {
        ExpertUsage {
            pair: Arc::clone(self),
            expert: expert.min(1),
        }
    }

    /// The second expert's first step begins: later loads are not prefetched.
    pub(super) fn second_began(&self) {
        self.lock().second_began = true;
    }

    /// The figures, in the budget `(vram, pin)`, each expert's floor `floor`.
    pub(super) fn figures(
        &self,
        [vram_budget_bytes, pin_ceiling_bytes]: [u64; 2],
        floor: Option<Lease>,
    ) -> BothOpen {
        let state = self.lock();
        BothOpen {
            prefetched_bytes: state.prefetched_bytes,
            peak_vram_bytes: state.peak[0],
            peak_pinned_bytes: state.peak[1],
            vram_budget_bytes,
            pin_ceiling_bytes,
            expert_floor_vram_bytes: floor.map_or(0, |floor| floor.vram_bytes),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PairState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One expert's side of a [`Pair`].
pub(super) struct ExpertUsage {
    pair: Arc<Pair>,
    expert: usize,
}

impl Observer for ExpertUsage {
    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        let tier = match tier {
            Tier::Vram => 0,
            Tier::Pinned => 1,
        };
        let mut state = self.pair.lock();
        state.used[self.expert][tier] = usage.used_bytes();
        let both = state.used[0][tier] + state.used[1][tier];
        state.peak[tier] = state.peak[tier].max(both);
    }

    fn transfer(&self, link: Link, owner: Owner, bytes: u64, _seconds: f64) {
        let to_vram = matches!(link, Link::PinnedToVram | Link::DiskToVram);
        if self.expert != 1 || owner != Owner::Model || !to_vram {
            return;
        }
        let mut state = self.pair.lock();
        if !state.second_began {
            state.prefetched_bytes += bytes;
        }
    }
}
