//! VramAllocator: owns the VRAM budget, the arena and the residency table's state
//! transitions. Turns scheduling decisions into pin requests and device copies, and
//! publishes blocks as ready when their copy completes.

use std::sync::Arc;

use actix::prelude::*;

use crate::mailbox::Post;
use tokio::time::Instant;

use crate::device::{Device, DeviceArena};
use crate::error::SessionError;
use crate::layout::BlockId;
use crate::lora_offloader::LoraOffloader;
use crate::messages::{
    Demand, Drain, EnsurePinned, Hint, Invalidate, LoraPrefetch, PinFailed, Pinned, ReadAhead,
    ReleaseActivations, Released, Reply, ReserveActivations, ReserveLora, ReturnBuffer, Streamed,
};
use crate::observer::{ErrorKind, Link, Observer, Owner, Tier, TierUsage};
use crate::pin_manager::PinManager;
use crate::residency::{BlockState, ResidencyTable};
use crate::vram_state::{Decisions, VramState};

type Waiter = Reply<Result<(), SessionError>>;

pub struct VramAllocator {
    state: VramState,
    table: Arc<ResidencyTable>,
    device: Arc<dyn Device>,
    arena: Option<DeviceArena>,
    pins: Addr<PinManager>,
    /// Told of every load while an adapter is attached, so factors ride with blocks.
    lora: Addr<LoraOffloader>,
    observer: Arc<dyn Observer>,
    /// Per block: the arena offset of the load in flight.
    load_offsets: Vec<u64>,
    /// Per block: the step that uses the load in flight (its bytes count for it).
    load_steps: Vec<u64>,
    waiters: Vec<Vec<Waiter>>,
    /// Blocks that had waiters when last looked at (some may have been answered since):
    /// what the progress check walks, instead of every block.
    waiting: Vec<BlockId>,
    /// LoRA regions that did not fit while loads were in flight (a block being
    /// loaded cannot be evicted yet); retried as each load ends.
    pending_lora: Vec<ReserveLora>,
    draining: Option<Reply<()>>,
    /// The LoRA offloader has drained: no copy of its own still lands in the arena.
    lora_drained: bool,
    /// The read-ahead list last sent to the pin manager.
    read_ahead: Vec<BlockId>,
}

/// The actors the allocator sends to, created (from its address) before it starts,
/// so it is never without them.
pub struct Peers {
    pub pins: Addr<PinManager>,
    pub lora: Addr<LoraOffloader>,
}

impl VramAllocator {
    pub fn new(
        state: VramState,
        table: Arc<ResidencyTable>,
        device: Arc<dyn Device>,
        arena: DeviceArena,
        peers: Peers,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let blocks = table.len();
        observer.plan_streamed(state.streamed_bytes_per_step());
        Self {
            state,
            table,
            device,
            arena: Some(arena),
            pins: peers.pins,
            lora: peers.lora,
            observer,
            load_offsets: vec![0; blocks],
            load_steps: vec![0; blocks],
            waiters: (0..blocks).map(|_| Vec::new()).collect(),
            waiting: Vec::new(),
            pending_lora: Vec::new(),
            draining: None,
            lora_drained: false,
            read_ahead: Vec::new(),
        }
    }

    fn report_usage(&self) {
        let (model_bytes, blocks) = self.state.placed_model();
        self.observer.tier_usage(
            Tier::Vram,
            TierUsage {
                model_bytes,
                lora_bytes: self.state.lora_bytes(),
                other_bytes: self.state.activation_bytes(),
                budget_bytes: self.state.budget_bytes(),
                blocks,
            },
        );
    }

    fn apply(&mut self, decisions: Decisions) {
        if decisions.evicted > 0 {
            self.observer.eviction(Tier::Vram, decisions.evicted);
        }
        if decisions.declined {
            self.observer.speculative_declined();
        }
        let base = self
            .arena
            .as_ref()
            .map_or(crate::DevicePtr(0), |arena| arena.base);
        let lora_attached = self.state.lora_bytes() > 0;
        for load in &decisions.loads {
            self.load_offsets[load.block.index()] = load.offset;
            self.load_steps[load.block.index()] = load.step;
            self.pins.post(EnsurePinned {
                block: load.block,
                destination: base.offset(load.offset),
            });
            if lora_attached {
                self.lora.post(LoraPrefetch { block: load.block });
            }
        }
        if decisions.read_ahead != self.read_ahead {
            self.read_ahead = decisions.read_ahead;
            self.pins.post(ReadAhead {
                blocks: self.read_ahead.clone(),
            });
        }
        if !decisions.loads.is_empty() || decisions.evicted > 0 {
            self.report_usage();
        }
        let lead = self.prefetch_lead();
        self.observer.prefetch_lead(lead);
    }

    /// Ready blocks ahead of the cursor before the first one that is not.
    fn prefetch_lead(&self) -> u64 {
        let order = self.state.order();
        let cursor = self.state_cursor();
        (0..order.len())
            .take_while(|step| self.table.state(order.at(cursor + step)) == BlockState::Ready)
            .count() as u64
    }

    fn state_cursor(&self) -> usize {
        self.state.cursor()
    }

    fn schedule(&mut self, demand: Option<BlockId>) {
        if self.draining.is_some() {
            return;
        }
        let decisions = self.state.schedule(demand);
        self.apply(decisions);
        self.answer_the_stuck();
    }

    fn notify(&mut self, block: BlockId, result: Result<(), SessionError>) {
        for waiter in self.waiters[block.index()].drain(..) {
            let _ = waiter.send(result.clone());
        }
    }

    fn return_buffer(&self, message: ReturnBuffer) {
        self.pins.post(message);
    }

    fn copy_finished(
        &mut self,
        block: BlockId,
        outcome: Result<crate::HostBuffer, (crate::DeviceError, crate::HostBuffer)>,
        home: crate::pin_state::BufferHome,
        bytes: u64,
        started: Instant,
    ) {
        let buffer = match outcome {
            Ok(buffer) => {
                let seconds = started.elapsed().as_secs_f64();
                self.observer
                    .transfer(Link::PinnedToVram, Owner::Model, bytes, seconds);
                self.observer
                    .block_transfer(Link::PinnedToVram, block, bytes, seconds);
                self.observer
                    .step_load(Link::PinnedToVram, self.load_steps[block.index()], bytes);
                self.publish(block);
                buffer
            }
            Err((error, buffer)) => {
                self.observer.error(ErrorKind::Copy);
                self.state.abandon(block, true);
                self.notify(
                    block,
                    Err(SessionError::CopyFailed {
                        block,
                        reason: error.to_string(),
                    }),
                );
                buffer
            }
        };
        self.return_buffer(ReturnBuffer {
            block,
            buffer,
            home,
        });
        self.retry_lora();
        self.schedule(None);
        self.report_usage();
        self.try_finish_drain();
    }

    /// The block's bytes are in place: flip it to ready and wake whoever waits.
    fn publish(&mut self, block: BlockId) {
        if self.draining.is_some() {
            self.state.abandon(block, false);
        } else if let Some((offset, streamed)) = self.state.loaded(block) {
            let base = self.arena.as_ref().map_or(0, |arena| arena.base.0);
            self.table
                .publish_ready(block, crate::DevicePtr(base + offset), streamed);
        }
        self.notify(block, Ok(()));
    }

    /// Reports a reservation (activations or LoRA factors) and turns it into a reply.
    fn reserved<T>(
        &mut self,
        result: Result<(T, u64), crate::vram_state::ActivationError>,
    ) -> Result<T, SessionError> {
        let reply = match result {
            Ok((value, evicted)) => {
                if evicted > 0 {
                    self.observer.eviction(Tier::Vram, evicted);
                    self.observer
                        .plan_streamed(self.state.streamed_bytes_per_step());
                }
                Ok(value)
            }
            Err(error) => {
                self.observer.error(ErrorKind::Budget);
                Err(SessionError::from(error))
            }
        };
        self.report_usage();
        reply
    }

    fn try_finish_drain(&mut self) {
        if self.draining.is_none() || self.state.loads_in_flight() > 0 || !self.lora_drained {
            return;
        }
        let evicted = self.state.evict_all();
        if evicted > 0 {
            self.observer.eviction(Tier::Vram, evicted);
        }
        self.state.release_activations(u64::MAX);
        self.state.release_all_lora();
        if let Some(arena) = self.arena.take() {
            self.device.free_arena(arena);
        }
        for index in 0..self.waiters.len() {
            self.notify(BlockId(index as u32), Err(SessionError::Stopped));
        }
        for message in std::mem::take(&mut self.pending_lora) {
            let _ = message.reply.send(Err(SessionError::Stopped));
        }
        self.report_usage();
        if let Some(reply) = self.draining.take() {
            let _ = reply.send(());
        }
    }
}

mod lora_regions;
mod resize;
mod waits;

impl Actor for VramAllocator {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        self.report_usage();
        self.schedule(None);
    }
}

impl Handler<Demand> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Demand, _ctx: &mut Self::Context) {
        let Demand {
            block,
            position,
            reply,
        } = message;
        if self.draining.is_some() {
            let _ = reply.send(Err(SessionError::Stopped));
            return;
        }
        match self.table.state(block) {
            BlockState::Ready => {
                let _ = reply.send(Ok(()));
                return;
            }
            BlockState::Failed => self.table.finish_evict(block),
            _ => {}
        }
        if self.waiters[block.index()].is_empty() {
            self.waiting.push(block);
        }
        self.waiters[block.index()].push(reply);
        self.state.demanded_at(position);
        self.schedule(Some(block));
    }
}

impl Handler<Released> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Released, _ctx: &mut Self::Context) {
        self.state.released(message.block, message.position);
        self.schedule(None);
    }
}

impl Handler<Pinned> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Pinned, ctx: &mut Self::Context) {
        let Pinned {
            block,
            buffer,
            home,
        } = message;
        let Some(arena) = self.arena.as_ref().filter(|_| self.draining.is_none()) else {
            self.state.abandon(block, false);
            self.return_buffer(ReturnBuffer {
                block,
                buffer,
                home,
            });
            self.try_finish_drain();
            return;
        };
        let bytes = self.table.block_bytes(block);
        let destination = arena.base.offset(self.load_offsets[block.index()]);
        let started = Instant::now();
        let copy = self.device.copy_to_device(buffer, 0, bytes, destination);
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(copy).map(move |outcome, actor, _ctx| {
                actor.copy_finished(block, outcome, home, bytes, started)
            }),
        );
    }
}

impl Handler<Streamed> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Streamed, _ctx: &mut Self::Context) {
        if self.draining.is_none() {
            let block = message.block;
            self.observer.step_load(
                Link::DiskToVram,
                self.load_steps[block.index()],
                self.table.block_bytes(block),
            );
        }
        self.publish(message.block);
        self.retry_lora();
        self.schedule(None);
        self.report_usage();
        self.try_finish_drain();
    }
}

impl Handler<PinFailed> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: PinFailed, _ctx: &mut Self::Context) {
        self.state.abandon(message.block, true);
        self.notify(message.block, Err(message.error));
        self.retry_lora();
        self.report_usage();
        self.try_finish_drain();
    }
}

impl Handler<crate::messages::LastStep> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: crate::messages::LastStep, _ctx: &mut Self::Context) {
        self.state.last_step(message.end);
    }
}

impl Handler<ReserveActivations> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: ReserveActivations, _ctx: &mut Self::Context) {
        let result = self
            .state
            .reserve_activations(message.bytes)
            .map(|evicted| {
                let count = evicted.len() as u64;
                if count > 0 {
                    self.observer.activations_displaced(count);
                }
                (evicted, count)
            });
        let _ = message.reply.send(self.reserved(result));
    }
}

impl Handler<ReleaseActivations> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: ReleaseActivations, _ctx: &mut Self::Context) {
        self.state.release_activations(message.bytes);
        self.report_usage();
        self.schedule(None);
    }
}

impl Handler<Drain> for VramAllocator {
    type Result = ();

    /// Stops scheduling, drains the LoRA offloader (its regions live in the arena),
    /// waits for loads in flight, then frees everything.
    fn handle(&mut self, message: Drain, ctx: &mut Self::Context) {
        self.draining = Some(message.reply);
        let lora = self.lora.clone();
        let drained = async move {
            let (reply, done) = flume::bounded(1);
            lora.post(Drain { reply });
            let _ = done.recv_async().await;
        };
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(drained).map(|(), actor, _ctx| {
                actor.lora_drained = true;
                actor.try_finish_drain();
            }),
        );
    }
}

impl Handler<Invalidate> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Invalidate, _ctx: &mut Self::Context) {
        let dropped = self.state.invalidate(&message.blocks);
        if dropped > 0 {
            self.observer.eviction(Tier::Vram, dropped);
            self.report_usage();
        }
        self.schedule(None);
        let _ = message.reply.send(dropped);
    }
}

impl Handler<Hint> for VramAllocator {
    type Result = ();

    fn handle(&mut self, message: Hint, _ctx: &mut Self::Context) {
        if self.draining.is_some() {
            return;
        }
        let mut decisions = self.state.hint(&message.blocks);
        // A hint pass does not look along the order: keep the read-ahead list.
        decisions.read_ahead = self.read_ahead.clone();
        self.apply(decisions);
    }
}
