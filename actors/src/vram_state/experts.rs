//! The expert cache area of the VRAM allocator: slots for blocks outside the step
//! order (MoE experts), acquired on demand or hinted, kept by an [`ExpertPolicy`].

use crate::arena::align_up;
use crate::expert_cache::{ExpertCache, ExpertPolicy};
use crate::layout::BlockId;
use crate::residency::BlockState;

use super::{Decisions, Placement, VramState};

/// The expert cache: slots for blocks outside the step order, acquired on demand or
/// hinted, kept by an [`ExpertPolicy`]. Laid out after the ring in the arena.
pub(super) struct ExpertArea {
    pub(super) slot_bytes: u64,
    pub(super) slots: Vec<Option<BlockId>>,
    pub(super) cache: ExpertCache,
    /// Per block: the hint round it was last demanded or hinted in. A speculative load
    /// never evicts an expert touched in this round or the one before (needed sooner).
    pub(super) touched_round: Vec<u64>,
    pub(super) round: u64,
    /// Demands that found every slot held or loading; retried on each pass.
    pub(super) pending: Vec<BlockId>,
}

impl VramState {
    /// Adds an expert cache of `slots` × `slot_bytes` after the ring, growing the budget
    /// by its size: plan the rest with `budget − expert area` and call this to make the
    /// total the real budget.
    pub fn with_experts(mut self, slots: u32, slot_bytes: u64, policy: ExpertPolicy) -> Self {
        let slot_bytes = align_up(slot_bytes);
        self.budget_bytes += u64::from(slots) * slot_bytes;
        self.experts = Some(ExpertArea {
            slot_bytes,
            slots: vec![None; slots as usize],
            cache: ExpertCache::new(policy),
            touched_round: vec![0; self.placement.len()],
            round: 1,
            pending: Vec::new(),
        });
        self
    }

    pub(super) fn expert_area_bytes(&self) -> u64 {
        self.experts
            .as_ref()
            .map_or(0, |area| area.slot_bytes * area.slots.len() as u64)
    }

    pub(super) fn expert_offset(&self, slot: usize) -> u64 {
        let slot_bytes = self.experts.as_ref().map_or(0, |area| area.slot_bytes);
        self.ring_area_bytes + slot as u64 * slot_bytes
    }

    pub(super) fn occupied_expert_bytes(&self) -> u64 {
        self.experts.as_ref().map_or(0, |area| {
            area.slots.iter().filter(|slot| slot.is_some()).count() as u64 * area.slot_bytes
        })
    }

    /// Speculative loads of experts the compute thread expects soon (a hint). Each is
    /// loaded only into a free slot or over an expert not touched in this round or
    /// the one before; otherwise it is declined.
    pub fn hint(&mut self, blocks: &[BlockId]) -> Decisions {
        let mut decisions = Decisions::default();
        let Some(area) = self.experts.as_mut() else {
            return decisions;
        };
        area.round += 1;
        let round = area.round;
        for &block in blocks {
            if let Some(touched) = area.touched_round.get_mut(block.index()) {
                *touched = round;
            }
        }
        for &block in blocks {
            if block.index() < self.placement.len()
                && !self.order.contains(block)
                && self.needs_load(block)
            {
                self.try_start(block, true, &mut decisions);
            }
        }
        self.record_peak();
        decisions
    }

    pub(super) fn retry_pending_experts(&mut self, decisions: &mut Decisions) {
        let Some(area) = self.experts.as_mut() else {
            return;
        };
        let pending = std::mem::take(&mut area.pending);
        for block in pending {
            if self.needs_load(block) && !self.try_start(block, false, decisions) {
                if let Some(area) = self.experts.as_mut() {
                    area.pending.push(block);
                }
            }
        }
    }

    pub(super) fn place_expert(
        &mut self,
        block: BlockId,
        speculative: bool,
        decisions: &mut Decisions,
    ) -> Option<Placement> {
        let bytes = align_up(self.block_bytes[block.index()]);
        let area = self.experts.as_ref()?;
        if bytes > area.slot_bytes {
            return None;
        }
        if let Some(slot) = area.slots.iter().position(Option::is_none) {
            self.experts.as_mut()?.slots[slot] = Some(block);
            return Some(Placement::Expert { slot });
        }
        let protected_from = area.round.saturating_sub(1);
        let candidates: Vec<u32> = area
            .slots
            .iter()
            .flatten()
            .filter(|&&held| {
                !self.loading[held.index()]
                    && self.table.holders(held) == 0
                    && self.table.state(held) == BlockState::Ready
                    && !(speculative && area.touched_round[held.index()] >= protected_from)
            })
            .map(|held| held.0)
            .collect();
        let victim = area
            .cache
            .victim(candidates)
            .map(BlockId)
            .filter(|&victim| self.table.try_begin_evict(victim));
        let Some(victim) = victim else {
            if speculative {
                decisions.declined = true;
            }
            return None;
        };
        let slot = area.slots.iter().position(|held| *held == Some(victim))?;
        self.table.finish_evict(victim);
        self.placement[victim.index()] = None;
        decisions.evicted += 1;
        self.experts.as_mut()?.slots[slot] = Some(block);
        Some(Placement::Expert { slot })
    }
}
