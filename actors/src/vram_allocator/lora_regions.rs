//! The LoRA offloader's VRAM regions: placed in the allocator's arena inside the budget
//! (resident weights give way), retried while loads are in flight, freed on detach.

use actix::prelude::*;

use super::VramAllocator;
use crate::error::SessionError;
use crate::messages::{ReleaseLora, ReserveLora};
use crate::observer::ErrorKind;

impl VramAllocator {
    /// Places a LoRA region, or keeps the request while loads are in flight: the
    /// blocks being loaded may be evictable once they land. Answers otherwise.
    pub(super) fn reserve_lora(&mut self, message: ReserveLora) {
        if self.draining.is_some() {
            let _ = message.reply.send(Err(SessionError::Stopped));
            return;
        }
        let base = self.arena.as_ref().map_or(0, |arena| arena.base.0);
        let result = self.state.reserve_lora(message.bytes);
        if result.is_err() && self.state.loads_in_flight() > 0 {
            self.pending_lora.push(message);
            return;
        }
        let result = result.map(|(offset, evicted)| (crate::DevicePtr(base + offset), evicted));
        let _ = message.reply.send(self.reserved(result));
    }

    pub(super) fn retry_lora(&mut self) {
        for message in std::mem::take(&mut self.pending_lora) {
            self.reserve_lora(message);
        }
    }
}

impl Handler<ReserveLora> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: ReserveLora, _ctx: &mut Self::Context) {
        self.reserve_lora(message);
    }
}

impl Handler<ReleaseLora> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: ReleaseLora, _ctx: &mut Self::Context) {
        let base = self.arena.as_ref().map_or(0, |arena| arena.base.0);
        if !self.state.release_lora(message.region.0.wrapping_sub(base)) {
            self.observer.error(ErrorKind::Protocol);
        }
        self.report_usage();
        self.schedule(None);
    }
}
