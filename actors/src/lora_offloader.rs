//! LoraOffloader: LoRA adapters attached to base weights, with their own accounting.
//!
//! The compute side loads and validates an adapter, then attaches it here. The
//! offloader reserves the factors' VRAM from the allocator — inside the budget, counted
//! as LoRA bytes, never as model bytes, so "loaded" never reads more than the model —
//! and keeps its own tally of host and device bytes per adapter. Detaching gives the
//! VRAM back. The arithmetic (bake into resident weights, low-rank apply on streamed
//! ones) runs on the compute thread, which holds the factors.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use serde::Serialize;

use crate::error::SessionError;
use crate::messages::{ReleaseLora, Reply, ReserveLora};
use crate::observer::{Link, Observer, Owner};
use crate::vram_allocator::VramAllocator;

/// An adapter's factors, as far as the budgets are concerned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterSummary {
    pub name: String,
    pub strength: f32,
    /// Bytes of its factors, held once in host memory and once in VRAM.
    pub bytes: u64,
}

/// The offloader's own accounting, apart from the model's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoraUsage {
    pub adapters: Vec<AdapterSummary>,
    pub host_bytes: u64,
    pub vram_bytes: u64,
    /// Adapters attached and detached since the start.
    pub attached_total: u64,
    pub detached_total: u64,
}

/// Attach an adapter: reserve its VRAM, then count it. Replaces one of the same name.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Attach {
    pub adapter: AdapterSummary,
    pub reply: Reply<Result<(), SessionError>>,
}

/// Detach by name; answers whether it was attached.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Detach {
    pub name: String,
    pub reply: Reply<bool>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Usage(pub Reply<LoraUsage>);

pub struct LoraOffloader {
    adapters: BTreeMap<String, AdapterSummary>,
    attached_total: u64,
    detached_total: u64,
    allocator: Addr<VramAllocator>,
    observer: Arc<dyn Observer>,
}

impl LoraOffloader {
    pub(crate) fn new(allocator: Addr<VramAllocator>, observer: Arc<dyn Observer>) -> Self {
        Self {
            adapters: BTreeMap::new(),
            attached_total: 0,
            detached_total: 0,
            allocator,
            observer,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.adapters.values().map(|adapter| adapter.bytes).sum()
    }

    fn usage(&self) -> LoraUsage {
        let bytes = self.bytes();
        LoraUsage {
            adapters: self.adapters.values().cloned().collect(),
            host_bytes: bytes,
            vram_bytes: bytes,
            attached_total: self.attached_total,
            detached_total: self.detached_total,
        }
    }

    fn remove(&mut self, name: &str) -> bool {
        let Some(adapter) = self.adapters.remove(name) else {
            return false;
        };
        self.allocator.do_send(ReleaseLora {
            bytes: adapter.bytes,
        });
        self.detached_total += 1;
        true
    }
}

impl Actor for LoraOffloader {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
    }
}

impl Handler<Attach> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Attach, ctx: &mut Self::Context) {
        let Attach { adapter, reply } = message;
        self.remove(&adapter.name);
        let (reserved, answer) = flume::bounded(1);
        self.allocator.do_send(ReserveLora {
            bytes: adapter.bytes,
            reply: reserved,
        });
        let wait = async move {
            answer
                .recv_async()
                .await
                .unwrap_or(Err(SessionError::Stopped))
        };
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(wait).map(move |result, actor, _ctx| {
                if result.is_ok() {
                    // The factors were read from the file into host memory by the
                    // loader, then cross to the device once while attached.
                    actor
                        .observer
                        .transfer(Link::DiskToPinned, Owner::Lora, adapter.bytes, 0.0);
                    actor
                        .observer
                        .transfer(Link::PinnedToVram, Owner::Lora, adapter.bytes, 0.0);
                    actor.attached_total += 1;
                    actor.adapters.insert(adapter.name.clone(), adapter);
                }
                let _ = reply.send(result);
            }),
        );
    }
}

impl Handler<Detach> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Detach, _ctx: &mut Self::Context) {
        let removed = self.remove(&message.name);
        let _ = message.reply.send(removed);
    }
}

impl Handler<Usage> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Usage, _ctx: &mut Self::Context) {
        let _ = message.0.send(self.usage());
    }
}
