//! A pin ceiling that changes at run time (a shared budget, see `shared_budget`):
//! the pinned cache is re-planned for the blocks VRAM streams now, and the cache
//! buffers that no longer fit give way — those of blocks no longer planned first,
//! then the latest in the step order. Buffers lent out for a copy cannot go at once:
//! the ceiling granted counts them.

use crate::host_buffer::HostBuffer;
use crate::layout::BlockId;
use crate::plan::keep_by_priority;

use super::{CacheSlot, PinState};

impl PinState {
    /// Sets the ceiling to `ceiling_bytes` (as configured: a `--fast-disk` chunk ring
    /// sits beside it) with the cache planned for `streamed` (per block: VRAM streams
    /// it). Returns the ceiling now in force — more than asked when lent-out buffers,
    /// the staging ring or LoRA sets hold more — and the buffers to unregister.
    pub fn resize(&mut self, ceiling_bytes: u64, streamed: &[bool]) -> (u64, Vec<HostBuffer>) {
        let beside = if self.plan.chunked {
            self.plan.staging_bytes()
        } else {
            0
        };
        let previous = self.ceiling_bytes;
        let limit = ceiling_bytes.saturating_add(beside);
        self.replan_cache(limit, streamed);
        let mut freed = self.drop_unplanned();
        for position in (0..self.order.len()).rev() {
            if self.used_bytes() <= limit {
                break;
            }
            let block = self.order.at(position);
            freed.extend(self.take_cache_buffer(block));
        }
        self.ceiling_bytes = if limit < previous {
            limit
                .max(self.used_bytes())
                .min(previous.max(self.used_bytes()))
        } else {
            limit
        };
        self.record();
        (self.ceiling_bytes - beside, freed)
    }

    /// Plans the cache for the room under `limit`: streamed blocks of the order by
    /// max-scatter priority, then blocks outside it (experts) in index order.
    fn replan_cache(&mut self, limit: u64, streamed: &[bool]) {
        let is_streamed = |block: BlockId| streamed.get(block.index()).copied().unwrap_or(false);
        let room = limit.saturating_sub(self.staging_bytes + self.lora_bytes);
        let kept = keep_by_priority(&self.order, &self.block_bytes, room, is_streamed);
        let mut cached = vec![false; self.block_bytes.len()];
        let mut cached_bytes = 0;
        for block in kept {
            cached[block.index()] = true;
            cached_bytes += self.block_bytes[block.index()];
        }
        for (index, &bytes) in self.block_bytes.iter().enumerate() {
            let block = BlockId(index as u32);
            if !self.order.contains(block) && cached_bytes + bytes <= room {
                cached[index] = true;
                cached_bytes += bytes;
            }
        }
        self.plan.disk_bytes_per_step = self
            .order
            .blocks()
            .iter()
            .filter(|block| is_streamed(**block) && !cached[block.index()])
            .map(|block| self.block_bytes[block.index()])
            .sum();
        self.plan.cached = cached;
        self.plan.cached_bytes = cached_bytes;
    }

    /// Takes back the cache buffers (not lent out) of blocks no longer planned.
    fn drop_unplanned(&mut self) -> Vec<HostBuffer> {
        let mut freed = Vec::new();
        for index in 0..self.cache.len() {
            if !self.plan.cached[index] {
                freed.extend(self.take_cache_buffer(BlockId(index as u32)));
            }
        }
        freed
    }

    /// `block`'s cache buffer, unless it is lent out or there is none.
    fn take_cache_buffer(&mut self, block: BlockId) -> Option<HostBuffer> {
        let slot = &mut self.cache[block.index()];
        if !matches!(
            slot,
            CacheSlot::Held {
                buffer: Some(_),
                ..
            }
        ) {
            return None;
        }
        match std::mem::replace(slot, CacheSlot::Empty) {
            CacheSlot::Held {
                buffer: Some(buffer),
                ..
            } => {
                self.cache_bytes -= buffer.len() as u64;
                Some(buffer)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
#[path = "resize_tests.rs"]
mod tests;
