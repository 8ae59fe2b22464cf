//! The allocator's side of a shared budget: a [`Resize`] re-plans the VRAM tier in
//! the new budget, then hands the pinned part on to the pin manager, which answers.

use actix::prelude::*;

use super::VramAllocator;
use crate::error::SessionError;
use crate::mailbox::Post;
use crate::messages::{Resize, ResizePins};
use crate::observer::Tier;

impl Handler<Resize> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Resize, _ctx: &mut Self::Context) {
        let Resize { lease, reply } = message;
        if self.draining.is_some() {
            let _ = reply.send(Err(SessionError::Stopped));
            return;
        }
        let resized = self.state.resize(lease.vram_bytes);
        if resized.evicted > 0 {
            self.observer.eviction(Tier::Vram, resized.evicted);
        }
        self.observer
            .plan_streamed(self.state.streamed_bytes_per_step());
        self.report_usage();
        // No scheduling pass here: loads started now would lend out the very cache
        // buffers the pinned tier is about to give back. The next demand schedules.
        self.pins.post(ResizePins {
            ceiling_bytes: lease.pin_bytes,
            streamed: self.state.streamed_blocks(),
            vram_bytes: resized.budget_bytes,
            reply,
        });
    }
}
