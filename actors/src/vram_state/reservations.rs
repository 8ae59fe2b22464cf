//! What the compute side reserves beside the weights: activations (always win) and
//! LoRA regions (the offloader's own VRAM, placed in the resident area), and the
//! invalidation of patched resident copies.

use crate::arena::align_up;
use crate::layout::BlockId;
use crate::plan::Bytes;

use super::{ActivationError, Placement, VramState};

impl VramState {
    /// Activations always win: evicts resident blocks until `bytes` more fit, and
    /// streams those blocks from now on. The victims are the resident blocks of lowest
    /// max-scatter priority, so what stays resident is the set the plan would choose
    /// for the smaller budget (the plan re-balances). Returns the blocks that gave way.
    pub fn reserve_activations(&mut self, bytes: u64) -> Result<Vec<BlockId>, ActivationError> {
        let mut evicted = Vec::new();
        // The ring and the expert area are committed whether or not their slots are
        // filled right now: activations come out of the resident area.
        while self.committed_bytes() + bytes > self.budget_bytes {
            match self.evict_lowest_priority() {
                Some(block) => evicted.push(block),
                None => return Err(self.do_not_fit(bytes, false)),
            }
        }
        self.activation_bytes += bytes;
        self.record_peak();
        Ok(evicted)
    }

    /// The blocks the plan keeps resident (placed or still to load), LoRA regions, the
    /// ring and expert areas whole, and activations: what a new activation
    /// reservation must fit beside.
    pub(super) fn committed_bytes(&self) -> u64 {
        self.planned_resident_bytes()
            + self.lora_bytes
            + self.resident_base()
            + self.activation_bytes
    }

    /// The arena bytes of every block the plan keeps resident, loaded yet or not.
    fn planned_resident_bytes(&self) -> u64 {
        (0..self.plan.resident.len())
            .filter(|&index| self.plan.resident[index])
            .map(|index| align_up(self.block_bytes[index]))
            .sum()
    }

    /// Grows the budget by `bytes` kept for activations and LoRA regions: plan with
    /// `budget − bytes` and call this to make the total the real budget (as with the
    /// expert area). The resident area reaches to the budget's end, so a LoRA region
    /// (placed in it, unlike activations) finds that room.
    pub fn with_activation_room(mut self, bytes: u64) -> Self {
        self.activation_room_bytes += bytes;
        self.budget_bytes += bytes;
        self.resident_area.grow(bytes);
        self
    }

    pub fn release_activations(&mut self, bytes: u64) {
        self.activation_bytes = self.activation_bytes.saturating_sub(bytes);
    }

    /// Places a LoRA region of `bytes` in the resident area, inside the budget,
    /// counted as LoRA bytes. It must leave room for every block the plan keeps
    /// resident, loaded yet or not (a block still to load that found no room, with no
    /// ring slot to fall back on, would be waited for forever): while it does not,
    /// the planned-resident block of lowest max-scatter priority gives way and streams
    /// from now on (as for activations). Then, where free space is too fragmented for
    /// one region, placed blocks give way, furthest next use first. Refused when no
    /// block can give way. Returns its arena offset and how many blocks gave way.
    pub fn reserve_lora(&mut self, bytes: u64) -> Result<(u64, u64), ActivationError> {
        let aligned = align_up(bytes.max(1));
        let mut evicted = 0;
        while self.committed_bytes() + aligned > self.budget_bytes {
            if self.evict_lowest_priority().is_none() {
                return Err(self.do_not_fit(aligned, true));
            }
            evicted += 1;
        }
        loop {
            if self.used_bytes() + aligned <= self.budget_bytes {
                // At the area's end: blocks placed after it still find one range.
                if let Some(offset) = self.resident_area.allocate_last(aligned) {
                    self.lora_bytes += aligned;
                    self.lora_regions.push((offset, aligned));
                    self.record_peak();
                    return Ok((self.resident_base() + offset, evicted));
                }
            }
            // Free space too fragmented for one region.
            if !self.evict_one_resident() {
                return Err(self.do_not_fit(aligned, true));
            }
            evicted += 1;
        }
    }

    /// Frees the LoRA region at arena `offset`; false if there is none.
    pub fn release_lora(&mut self, offset: u64) -> bool {
        let Some(relative) = offset.checked_sub(self.resident_base()) else {
            return false;
        };
        let Some(index) = self
            .lora_regions
            .iter()
            .position(|&(start, _)| start == relative)
        else {
            return false;
        };
        let (start, bytes) = self.lora_regions.swap_remove(index);
        self.resident_area.free(start, bytes);
        self.lora_bytes -= bytes;
        true
    }

    /// Frees every LoRA region (shutdown).
    pub fn release_all_lora(&mut self) {
        for (start, bytes) in std::mem::take(&mut self.lora_regions) {
            self.resident_area.free(start, bytes);
        }
        self.lora_bytes = 0;
    }

    /// Evicts the evictable resident block of lowest max-scatter priority (its first
    /// position in the order, bit-reversed) and streams it from now on.
    pub(super) fn evict_lowest_priority(&mut self) -> Option<BlockId> {
        let victim = self.planned_resident().min_by_key(|&block| {
            self.order
                .first_position(block)
                .map_or(0, crate::plan::max_scatter_priority)
        })?;
        self.evict_resident(victim).then_some(victim)
    }

    /// The block that gives way to another model (a shrink of a shared budget): in
    /// the run's last step, Belady's choice — a block whose next use is at or past the
    /// step's end is never used again, so it goes first, then the block whose one use
    /// left comes last; before the last step, as under activation pressure.
    pub(super) fn evict_for_another(&mut self) -> Option<BlockId> {
        let Some(end) = self.end else {
            return self.evict_lowest_priority();
        };
        let victim = self.planned_resident().max_by_key(|&block| {
            let distance = self.order.distance_to_next_use(self.cursor, block);
            distance.map_or(end, |distance| (self.cursor + distance).min(end))
        })?;
        self.evict_resident(victim).then_some(victim)
    }

    /// The activation room the plan keeps that activations have not taken yet.
    pub(super) fn kept_room_bytes(&self) -> u64 {
        self.activation_room_bytes
            .saturating_sub(self.activation_bytes)
    }

    /// Resident blocks that could give way now: placed, not loading, unheld, and small
    /// enough to stream through a ring slot.
    fn evictable_resident(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.placement
            .iter()
            .enumerate()
            .filter_map(|(index, placement)| match placement {
                Some(Placement::Resident { .. }) => Some(BlockId(index as u32)),
                _ => None,
            })
            .filter(|&block| {
                !self.loading[block.index()]
                    && self.table.holders(block) == 0
                    && align_up(self.block_bytes[block.index()]) <= self.slot_bytes()
            })
    }

    /// Blocks the plan keeps resident (loaded yet or not) that could stream instead:
    /// not loading, unheld, and small enough for a ring slot.
    fn planned_resident(&self) -> impl Iterator<Item = BlockId> + '_ {
        (0..self.plan.resident.len())
            .filter(|&index| self.plan.resident[index])
            .map(|index| BlockId(index as u32))
            .filter(|&block| {
                !self.loading[block.index()]
                    && self.table.holders(block) == 0
                    && align_up(self.block_bytes[block.index()]) <= self.slot_bytes()
            })
    }

    /// Evicts resident `block` (when it is loaded) and marks it streamed; false if it
    /// cannot be evicted.
    fn evict_resident(&mut self, block: BlockId) -> bool {
        let placed = matches!(
            self.placement[block.index()],
            Some(Placement::Resident { .. })
        );
        if placed {
            if !self.table.try_begin_evict(block) {
                return false;
            }
            self.unplace(block);
            self.table.finish_evict(block);
        }
        if std::mem::replace(&mut self.plan.resident[block.index()], false) {
            // It streams from now on: the plan moves its bytes every step it is used.
            let uses = self.order.uses(block) as u64;
            self.plan.streamed_bytes_per_step += uses * self.block_bytes[block.index()];
        }
        true
    }

    /// Evicts the unheld resident block needed furthest ahead and streams it from now
    /// on (LoRA regions: the block is back soonest where it hurts least). A block
    /// larger than a ring slot cannot stream: it stays. False if none.
    fn evict_one_resident(&mut self) -> bool {
        let victim = self.evictable_resident().max_by_key(|&block| {
            self.order
                .distance_to_next_use(self.cursor, block)
                .unwrap_or(usize::MAX)
        });
        victim.is_some_and(|block| self.evict_resident(block))
    }

    fn do_not_fit(&self, requested: u64, lora: bool) -> ActivationError {
        let budget = Bytes(self.budget_bytes);
        let ring = Bytes(self.ring_area_bytes);
        let taken = self.ring_area_bytes + self.activation_bytes + self.lora_bytes;
        let available = Bytes(self.budget_bytes.saturating_sub(taken));
        if lora {
            let held = self
                .resident_area
                .used_bytes()
                .saturating_sub(self.lora_bytes);
            return ActivationError::LoraDoesNotFit {
                requested: Bytes(requested),
                budget,
                ring,
                available,
                held: Bytes(held),
                // At least one region more than the budget holds now: the room kept
                // for the run's first activations is not the resident area's to give.
                needed: Bytes((taken + requested + held).max(self.budget_bytes + requested)),
            };
        }
        // Activations are refused only once no planned-resident block can give way: the
        // budget must hold them all, loaded yet or not, beside the request.
        ActivationError::DoNotFit {
            requested: Bytes(requested),
            budget,
            ring,
            available,
            held: Bytes(self.planned_resident_bytes()),
            needed: Bytes(self.committed_bytes() + requested),
        }
    }

    /// Drops the device copy of each ready, unheld block so its next use reloads it:
    /// its resident copy was patched (a LoRA bake) and the patch changed. Returns how
    /// many were dropped.
    pub fn invalidate(&mut self, blocks: &[BlockId]) -> u64 {
        let mut dropped = 0;
        for &block in blocks {
            let index = block.index();
            if index >= self.placement.len()
                || self.placement[index].is_none()
                || self.loading[index]
                || !self.table.try_begin_evict(block)
            {
                continue;
            }
            self.unplace(block);
            self.table.finish_evict(block);
            dropped += 1;
        }
        dropped
    }
}
