//! LoraOffloader: LoRA adapters' factors, streamed with their blocks through the same
//! tiers in their own accounting — a pinned set from the pin manager, a VRAM region
//! from the allocator — and copied to the device on the copy stream as their blocks
//! load. The decisions live in [`crate::lora_state`]; this actor turns messages into
//! calls on it and runs the copies.
//!
//! Attach: the compute side hands over per-block packs of factors (read from the
//! adapter file and validated by the loader). The offloader asks the pin manager for
//! pinned buffers (the model's pinned cache gives way under the ceiling), then the
//! allocator for its VRAM region (resident weights give way, like activations), fills
//! the buffers and answers the adapter's [`LoraSlot`]. Detach gives both back once
//! the adapter's copies in flight have landed. A failed attach gives back whatever it
//! got: nothing leaks.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use actix::prelude::*;

use crate::mailbox::Post;
use tokio::time::Instant;

use crate::device::Device;
use crate::error::SessionError;
use crate::layout::BlockId;
use crate::lora_state::{AdapterSummary, Detached, LoraSlot, LoraState, LoraUsage, PackLoad};
use crate::messages::{
    AllocateLoraPins, Drain, FreeLoraPins, LoraPrefetch, ReleaseLora, Reply, ReserveLora,
};
use crate::observer::{ErrorKind, Link, Observer, Owner};
use crate::pin_manager::PinManager;
use crate::residency::BlockState;
use crate::vram_allocator::VramAllocator;

type Waiter = Reply<Result<(), SessionError>>;

/// One block's factors of an adapter, laid out by the compute side.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPack {
    /// The block whose weights these factors patch.
    pub block: BlockId,
    /// The factors as the compute side will read them in VRAM; the offloader copies
    /// them as they are and never looks inside. An empty pack is refused at attach.
    pub bytes: Vec<u8>,
}

/// An adapter to attach: its name (unique among attached ones), strength and packs.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraAttach {
    /// Its name, strength and total size: what the budgets and summaries see.
    pub summary: AdapterSummary,
    /// One pack per block it patches; blocks without a pack are left unpatched.
    pub packs: Vec<LoraPack>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Attach {
    pub adapter: LoraAttach,
    pub reply: Reply<Result<LoraSlot, SessionError>>,
}

/// Detach by name; answers whether it was attached, once its budgets are back.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Detach {
    pub name: String,
    pub reply: Reply<bool>,
}

/// The compute thread needs `block`'s pack of `slot` and it is not ready.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct DemandPack {
    pub slot: LoraSlot,
    pub block: BlockId,
    pub reply: Reply<Result<(), SessionError>>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Usage(pub Reply<LoraUsage>);

pub struct LoraOffloader {
    state: LoraState,
    device: Arc<dyn Device>,
    allocator: Addr<VramAllocator>,
    pins: Addr<PinManager>,
    observer: Arc<dyn Observer>,
    waiters: HashMap<(LoraSlot, BlockId), Vec<Waiter>>,
    /// Demands that found every slot held or loading; retried as copies land.
    pending: VecDeque<(LoraSlot, BlockId)>,
    detach_replies: HashMap<LoraSlot, Reply<bool>>,
    draining: Option<Reply<()>>,
}

impl LoraOffloader {
    pub(crate) fn new(
        state: LoraState,
        device: Arc<dyn Device>,
        allocator: Addr<VramAllocator>,
        pins: Addr<PinManager>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Self {
            state,
            device,
            allocator,
            pins,
            observer,
            waiters: HashMap::new(),
            pending: VecDeque::new(),
            detach_replies: HashMap::new(),
            draining: None,
        }
    }

    fn start_copy(&mut self, load: PackLoad, ctx: &mut Context<Self>) {
        let PackLoad {
            slot,
            block,
            buffer,
            bytes,
            destination,
        } = load;
        let started = Instant::now();
        let copy = self.device.copy_to_device(buffer, 0, bytes, destination);
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(copy).map(move |outcome, actor, ctx| {
                let (buffer, result) = match outcome {
                    Ok(buffer) => {
                        let seconds = started.elapsed().as_secs_f64();
                        actor
                            .observer
                            .transfer(Link::PinnedToVram, Owner::Lora, bytes, seconds);
                        (buffer, Ok(()))
                    }
                    Err((error, buffer)) => {
                        actor.observer.error(ErrorKind::Copy);
                        let reason = error.to_string();
                        (buffer, Err(SessionError::CopyFailed { block, reason }))
                    }
                };
                let detached = actor.state.loaded(slot, block, buffer, result.is_ok());
                for waiter in actor.waiters.remove(&(slot, block)).unwrap_or_default() {
                    let _ = waiter.send(result.clone());
                }
                if let Some(detached) = detached {
                    actor.give_back(detached);
                }
                actor.retry_pending(ctx);
                actor.try_finish_drain();
            }),
        );
    }

    /// Demands that waited for a slot: a copy has landed, so one may be free now.
    fn retry_pending(&mut self, ctx: &mut Context<Self>) {
        for _ in 0..self.pending.len() {
            let Some((slot, block)) = self.pending.pop_front() else {
                break;
            };
            self.demand(slot, block, ctx);
        }
    }

    /// Serves a demand: answers waiters if the pack is ready, else loads it (or
    /// queues it until a slot frees up).
    fn demand(&mut self, slot: LoraSlot, block: BlockId, ctx: &mut Context<Self>) {
        if !self.state.is_attached(slot) || !self.state.has_pack(slot, block) {
            let problem = format!("has no factors for {block}");
            for waiter in self.waiters.remove(&(slot, block)).unwrap_or_default() {
                let _ = waiter.send(Err(SessionError::Lora {
                    name: format!("#{}", slot.index()),
                    problem: problem.clone(),
                }));
            }
            return;
        }
        match self.state.state(slot, block) {
            BlockState::Ready => {
                for waiter in self.waiters.remove(&(slot, block)).unwrap_or_default() {
                    let _ = waiter.send(Ok(()));
                }
            }
            BlockState::Loading => {}
            _ => match self.state.start_load(slot, block) {
                Some(load) => self.start_copy(load, ctx),
                // Every slot is held or loading: a landing copy frees one. With none in
                // flight, only the compute thread could, and it waits here: answered.
                None if self.state.copies_in_flight() == 0 => {
                    self.observer.error(ErrorKind::Budget);
                    let problem = format!(
                        "no pack slot is free for {block}: the compute thread holds every one of its packs in VRAM; release a pack before acquiring the next"
                    );
                    for waiter in self.waiters.remove(&(slot, block)).unwrap_or_default() {
                        let _ = waiter.send(Err(SessionError::Lora {
                            name: format!("#{}", slot.index()),
                            problem: problem.clone(),
                        }));
                    }
                }
                None => self.pending.push_back((slot, block)),
            },
        }
    }

    fn give_back(&mut self, detached: Detached) {
        let Detached {
            slot,
            region,
            buffers,
        } = detached;
        self.allocator.post(ReleaseLora { region });
        self.pins.post(FreeLoraPins { buffers });
        self.pending.retain(|&(pending, _)| pending != slot);
        self.waiters.retain(|&(waiting, _), waiters| {
            if waiting == slot {
                for waiter in waiters.drain(..) {
                    let _ = waiter.send(Err(SessionError::Stopped));
                }
            }
            waiting != slot
        });
        if let Some(reply) = self.detach_replies.remove(&slot) {
            let _ = reply.send(true);
        }
    }

    fn try_finish_drain(&mut self) {
        if self.draining.is_some() && !self.state.any_attached() {
            if let Some(reply) = self.draining.take() {
                let _ = reply.send(());
            }
        }
    }
}

impl Actor for LoraOffloader {
    type Context = Context<Self>;
}

impl Handler<Attach> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Attach, ctx: &mut Self::Context) {
        let Attach { adapter, reply } = message;
        let refuse = |problem: String| SessionError::Lora {
            name: adapter.summary.name.clone(),
            problem,
        };
        if self.draining.is_some() {
            let _ = reply.send(Err(SessionError::Stopped));
            return;
        }
        if self.state.find(&adapter.summary.name).is_some() {
            let _ = reply.send(Err(refuse("is already attached; detach it first".into())));
            return;
        }
        if let Some(pack) = adapter
            .packs
            .iter()
            .find(|pack| pack.block.index() >= self.state.blocks() || pack.bytes.is_empty())
        {
            let problem = format!(
                "has a pack for {} of {} bytes; the model has {} blocks and packs are not empty",
                pack.block,
                pack.bytes.len(),
                self.state.blocks()
            );
            let _ = reply.send(Err(refuse(problem)));
            return;
        }
        let Some(slot) = self.state.claim() else {
            let _ = reply.send(Err(SessionError::TooManyAdapters {
                max: crate::lora_state::MAX_ADAPTERS,
            }));
            return;
        };
        let sizes = adapter.packs.iter().map(|p| p.bytes.len() as u64).collect();
        let plan = self.state.plan_attach(sizes);
        let pins = self.pins.clone();
        let allocator = self.allocator.clone();
        let (pack_sizes, region_bytes) = (plan.pack_sizes.clone(), plan.region_bytes());
        // Pinned set first, then the VRAM region; whatever was granted goes back if
        // the other is refused.
        let acquire = async move {
            let (pinned_reply, pinned) = flume::bounded(1);
            pins.post(AllocateLoraPins {
                sizes: pack_sizes,
                reply: pinned_reply,
            });
            let buffers = pinned
                .recv_async()
                .await
                .unwrap_or(Err(SessionError::Stopped))?;
            let (region_reply, region) = flume::bounded(1);
            allocator.post(ReserveLora {
                bytes: region_bytes,
                reply: region_reply,
            });
            match region
                .recv_async()
                .await
                .unwrap_or(Err(SessionError::Stopped))
            {
                Ok(region) => Ok((buffers, region)),
                Err(error) => {
                    pins.post(FreeLoraPins { buffers });
                    Err(error)
                }
            }
        };
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(acquire).map(move |granted, actor, _ctx| {
                let (mut buffers, region) = match granted {
                    Ok(granted) => granted,
                    Err(error) => {
                        actor.state.unclaim(slot);
                        let _ = reply.send(Err(error));
                        return;
                    }
                };
                for (buffer, pack) in buffers.iter_mut().zip(&adapter.packs) {
                    // A simulator's virtual buffer has no bytes to fill.
                    if let Some(bytes) = buffer.as_mut_slice() {
                        bytes[..pack.bytes.len()].copy_from_slice(&pack.bytes);
                    }
                }
                let blocks: Vec<BlockId> = adapter.packs.iter().map(|pack| pack.block).collect();
                let bytes = adapter.summary.bytes;
                actor
                    .state
                    .attach(slot, adapter.summary, &plan, &blocks, buffers, region);
                // The loader read the factors from the adapter file into host memory;
                // they now sit in the offloader's pinned set.
                actor
                    .observer
                    .transfer(Link::DiskToPinned, Owner::Lora, bytes, 0.0);
                let _ = reply.send(Ok(slot));
            }),
        );
    }
}

impl Handler<Detach> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Detach, _ctx: &mut Self::Context) {
        let Some(slot) = self.state.find(&message.name) else {
            let _ = message.reply.send(false);
            return;
        };
        self.detach_replies.insert(slot, message.reply);
        if let Some(detached) = self.state.begin_detach(slot, false) {
            self.give_back(detached);
        }
    }
}

impl Handler<LoraPrefetch> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: LoraPrefetch, ctx: &mut Self::Context) {
        if self.draining.is_some() {
            return;
        }
        for load in self.state.prefetch(message.block) {
            self.start_copy(load, ctx);
        }
    }
}

impl Handler<DemandPack> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: DemandPack, ctx: &mut Self::Context) {
        let DemandPack { slot, block, reply } = message;
        if self.draining.is_some() {
            let _ = reply.send(Err(SessionError::Stopped));
            return;
        }
        self.waiters.entry((slot, block)).or_default().push(reply);
        self.demand(slot, block, ctx);
    }
}

impl Handler<Usage> for LoraOffloader {
    type Result = ();

    fn handle(&mut self, message: Usage, _ctx: &mut Self::Context) {
        let _ = message.0.send(self.state.usage());
    }
}

impl Handler<Drain> for LoraOffloader {
    type Result = ();

    /// Shutdown: detach everything, once copies in flight have landed, before the
    /// allocator frees the arena the regions live in.
    fn handle(&mut self, message: Drain, _ctx: &mut Self::Context) {
        self.draining = Some(message.reply);
        for slot in self.state.attached() {
            if let Some(detached) = self.state.begin_detach(slot, true) {
                self.give_back(detached);
            }
        }
        self.try_finish_drain();
    }
}
