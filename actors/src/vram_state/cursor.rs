//! Where the compute thread is: the cursor (a position counted from the session's
//! start, so position / order length is the step), the step a load is for, and the
//! end of the run's last step, past which nothing is prefetched.

use crate::layout::BlockId;

use super::{Placement, VramState};

impl VramState {
    /// The compute thread needs `position` of the order next. Distances to next use are
    /// measured from here, so the block at the cursor (distance 0) is the one needed
    /// soonest and is never a victim for a speculative load.
    pub fn advance(&mut self, position: usize) {
        self.cursor = position;
    }

    /// The compute thread waits for the block at `position`: as [`VramState::advance`],
    /// and a wait past the last step's end lifts it (the run went on after all).
    pub fn demanded_at(&mut self, position: usize) {
        self.advance(position);
        if self.end.is_some_and(|end| position >= end) {
            self.end = None;
        }
    }

    /// The step under way is the last: nothing is prefetched at or past `end`.
    pub fn last_step(&mut self, end: usize) {
        self.end = Some(end);
    }

    /// The step that uses `block` next, seen from the cursor (the cursor's own step for
    /// a block outside the order).
    pub(super) fn step_of_next_use(&self, block: BlockId) -> u64 {
        let distance = self
            .order
            .distance_to_next_use(self.cursor, block)
            .unwrap_or(0);
        ((self.cursor + distance) / self.order.len()) as u64
    }

    /// The compute thread released the streamed block at `position`: it needs the next
    /// position next.
    pub fn released(&mut self, block: BlockId, position: usize) {
        if let Some(Placement::Expert { .. }) = self.placement[block.index()] {
            // An expert's use is counted once, at its release; the cursor stays put.
            if let Some(area) = self.experts.as_mut() {
                area.cache.touch(block.0);
            }
            return;
        }
        self.advance(position + 1);
        self.use_clock += 1;
        if let Some(Placement::Ring { slot }) = self.placement[block.index()] {
            self.ring[slot].last_use = self.use_clock;
        }
    }
}
