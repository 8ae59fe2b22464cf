//! No wait without an end: a block the compute thread waits for and nothing in flight
//! can place is answered with an error instead of a wait.

use super::VramAllocator;
use crate::error::SessionError;
use crate::observer::ErrorKind;
use crate::residency::BlockState;

impl VramAllocator {
    /// No wait without an end: a block the compute thread waits for that found no
    /// place, while no load is in flight (none will land and free or take a slot) and
    /// no LoRA region waits, can never be placed — the compute thread, waiting,
    /// releases nothing; a shared budget that may still grow is left to the pool. Its
    /// waiters get [`SessionError::NoPlace`], naming what holds the room and a budget
    /// that has it.
    pub(super) fn answer_the_stuck(&mut self) {
        let waiters = &self.waiters;
        self.waiting
            .retain(|block| !waiters[block.index()].is_empty());
        // A shared budget below its arena may yet be handed room by the pool.
        let may_grow = self.state.capacity_bytes() > self.state.budget_bytes();
        if self.state.loads_in_flight() > 0 || !self.pending_lora.is_empty() || may_grow {
            return;
        }
        for block in std::mem::take(&mut self.waiting) {
            if self.waiters[block.index()].is_empty() {
                continue;
            }
            if self.table.state(block) == BlockState::Ready {
                self.notify(block, Ok(()));
                continue;
            }
            let (reason, needed) = self.state.no_place(block);
            self.observer.error(ErrorKind::Budget);
            let error = SessionError::NoPlace {
                block,
                bytes: self.table.block_bytes(block),
                reason,
                needed,
            };
            self.notify(block, Err(error));
        }
    }
}
