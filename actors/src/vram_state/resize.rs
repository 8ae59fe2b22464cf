//! A budget that changes at run time: the model shares one VRAM budget with others
//! (see `shared_budget`), and the pool asks it to give way or hands it room.
//!
//! Giving way is a partial unload: resident blocks of the lowest max-scatter priority
//! turn into streamed ones (as under activation pressure) — in the run's last step,
//! those past their last use first (Belady) — until what the model commits, and the
//! activation room it keeps, fit the new budget; what cannot give way (the ring, held blocks, blocks larger
//! than a ring slot, activations, LoRA regions) stays, and the budget granted says so.
//! Taking room is the reverse: streamed blocks of the highest priority are planned
//! resident again while they fit, and load as the order reaches them.

use crate::arena::{align_up, FreeList};
use crate::layout::BlockId;

use super::VramState;

/// What a resize did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Resized {
    /// The budget now in force: the one asked for, or (giving way) the least the
    /// model's commitments allow, whichever is larger.
    pub budget_bytes: u64,
    /// Resident blocks that gave way (they stream from now on).
    pub evicted: u64,
    /// Streamed blocks planned resident again.
    pub made_resident: u64,
}

impl VramState {
    /// The most this state may ever be given: the arena it was started with. The
    /// resident area is sized to it, so growing needs no new allocation.
    pub fn with_capacity(mut self, capacity_bytes: u64) -> Self {
        let capacity_bytes = capacity_bytes.max(self.budget_bytes);
        self.capacity_bytes = capacity_bytes;
        self.resident_area = FreeList::new(capacity_bytes.saturating_sub(self.resident_base()));
        self
    }

    /// The arena's size: the largest budget [`VramState::resize`] accepts.
    pub fn capacity_bytes(&self) -> u64 {
        // Set-asides added after `new` (experts, activation room) raise the budget.
        self.capacity_bytes.max(self.budget_bytes)
    }

    /// Makes the budget `target_bytes` (at most the capacity): gives way block by
    /// block when it shrinks (`evict_for_another`), plans blocks back when it grows.
    pub fn resize(&mut self, target_bytes: u64) -> Resized {
        let target = target_bytes.min(self.capacity_bytes());
        let previous = self.budget_bytes;
        let mut resized = Resized::default();
        // The activation room stays free: a step's first reservation must not have
        // to evict blocks that may be loading then (they cannot give way).
        while self.committed_bytes() + self.kept_room_bytes() > target {
            if self.evict_for_another().is_none() {
                break;
            }
            resized.evicted += 1;
        }
        let floor = self.committed_bytes().max(self.used_bytes());
        // A shrink never grows the budget, even when less than asked could give way.
        self.budget_bytes = if target < previous {
            target.max(floor).min(previous)
        } else {
            target
        };
        resized.made_resident = self.plan_back();
        resized.budget_bytes = self.budget_bytes;
        self.record_peak();
        resized
    }

    /// Plans streamed blocks resident again, highest priority first, while they fit
    /// beside what is committed. Returns how many.
    fn plan_back(&mut self) -> u64 {
        let mut added = 0;
        for block in self.order.by_priority() {
            let index = block.index();
            if self.plan.resident[index] || self.placement[index].is_some() {
                // Resident already, or in a ring slot: it stays where it is until its
                // slot is taken (counting it twice, as both, would be wasted room).
                continue;
            }
            let footprint = align_up(self.block_bytes[index]);
            if self.committed_bytes() + self.kept_room_bytes() + footprint > self.budget_bytes {
                continue;
            }
            self.plan.resident[index] = true;
            let uses = self.order.uses(block) as u64;
            self.plan.streamed_bytes_per_step = self
                .plan
                .streamed_bytes_per_step
                .saturating_sub(uses * self.block_bytes[index]);
            added += 1;
        }
        added
    }

    /// Per block: whether it streams through VRAM now (what the pinned tier may cache).
    pub fn streamed_blocks(&self) -> Vec<bool> {
        (0..self.block_bytes.len())
            .map(|index| self.order.contains(BlockId(index as u32)) && !self.plan.resident[index])
            .collect()
    }
}

#[cfg(test)]
#[path = "resize_tests.rs"]
mod tests;
