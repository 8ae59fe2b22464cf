//! The pin manager's side of a shared budget: the pinned cache re-planned under a new
//! ceiling. Like an adapter's attach, this runs between steps of the model it
//! belongs to (or while it idles), so the buffers that give way are unregistered here
//! rather than at the next sync point.

use actix::prelude::*;

use super::PinManager;
use crate::error::SessionError;
use crate::messages::ResizePins;
use crate::observer::Tier;
use crate::pool_state::Lease;

impl Handler<ResizePins> for PinManager {
    type Result = ();

    fn handle(&mut self, message: ResizePins, _ctx: &mut Self::Context) {
        let ResizePins {
            ceiling_bytes,
            streamed,
            vram_bytes,
            reply,
        } = message;
        if self.draining.is_some() {
            let _ = reply.send(Err(SessionError::Stopped));
            return;
        }
        let (pin_bytes, freed) = self.state.resize(ceiling_bytes, &streamed);
        if !freed.is_empty() {
            self.observer.eviction(Tier::Pinned, freed.len() as u64);
        }
        drop(freed);
        self.report_usage();
        let _ = reply.send(Ok(Lease {
            vram_bytes,
            pin_bytes,
        }));
    }
}
