//! The LoRA offloader's pinned set: granted inside the pin ceiling (the model's pinned
//! cache gives way), given back on detach.

use actix::prelude::*;

use super::PinManager;
use crate::error::SessionError;
use crate::messages::{AllocateLoraPins, FreeLoraPins};
use crate::observer::{ErrorKind, Tier};

impl Handler<AllocateLoraPins> for PinManager {
    type Result = ();

    /// LoRA factors get their own pinned set inside the ceiling. Adapters attach
    /// between steps, where compute waits anyway, so the cache buffers that give way
    /// are unregistered here rather than at the next sync point.
    fn handle(&mut self, message: AllocateLoraPins, _ctx: &mut Self::Context) {
        let AllocateLoraPins { sizes, reply } = message;
        if self.draining.is_some() {
            let _ = reply.send(Err(SessionError::Stopped));
            return;
        }
        let requested_bytes: u64 = sizes.iter().sum();
        let freed = match self.state.reserve_lora(requested_bytes) {
            Ok(freed) => freed,
            Err(available_bytes) => {
                self.observer.error(ErrorKind::Budget);
                let _ = reply.send(Err(SessionError::LoraPinCeiling {
                    requested_bytes,
                    available_bytes,
                    ceiling_bytes: self.state.ceiling_bytes(),
                }));
                return;
            }
        };
        if !freed.is_empty() {
            self.observer.eviction(Tier::Pinned, freed.len() as u64);
        }
        drop(freed);
        let mut buffers = Vec::with_capacity(sizes.len());
        for &size in &sizes {
            match self.device.allocate_pinned(size) {
                Ok(buffer) => buffers.push(buffer),
                Err(error) => {
                    drop(buffers);
                    self.state.release_lora(requested_bytes);
                    self.observer.error(ErrorKind::Pin);
                    self.report_usage();
                    let _ = reply.send(Err(SessionError::PinFailed(error.to_string())));
                    return;
                }
            }
        }
        self.report_usage();
        let _ = reply.send(Ok(buffers));
    }
}

impl Handler<FreeLoraPins> for PinManager {
    type Result = ();

    fn handle(&mut self, message: FreeLoraPins, _ctx: &mut Self::Context) {
        let bytes: u64 = message
            .buffers
            .iter()
            .map(|buffer| buffer.len() as u64)
            .sum();
        drop(message.buffers);
        self.state.release_lora(bytes);
        self.report_usage();
    }
}
