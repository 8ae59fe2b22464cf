//! The compute thread's API: how an inference engine embeds stagehand.
//!
//! ```text
//! let mut session = Session::start(config, layout, order, device, storage, observer)?;
//! for step in 0..steps {
//!     for &block in &order {
//!         let handle = session.acquire(block)?;   // atomic load when resident
//!         compute(handle.ptr, handle.bytes);
//!         session.release(handle);
//!     }
//!     session.step_done();
//! }
//! let report = session.finish()?;
//! ```
//!
//! `acquire` of a ready block touches only the residency table. A miss sends one
//! message and waits for that block only. Releases of resident blocks send nothing;
//! releases of streamed blocks send one message, because they free a ring slot.

use std::sync::Arc;
use std::thread::JoinHandle;

use actix::prelude::*;
use tokio::time::Instant;

use crate::compute_stream::ComputeStream;
use crate::device::{Device, MemorySpace};
use crate::error::SessionError;
use crate::expert_cache::ExpertPolicy;
use crate::layout::{BlockId, ModelLayout};
use crate::lora_offloader::{Attach, DemandPack, Detach, LoraAttach, LoraOffloader, Usage};
use crate::lora_state::{LoraSlot, LoraState, LoraUsage};
use crate::messages::{
    Hint, Invalidate, Miss, ReleaseActivations, ReleaseStreamed, ReserveActivations, Shutdown,
    StepDone,
};
use crate::observer::{AcquireBatch, Observer};
use crate::plan::{PinPlan, ResidencyPolicy, StepOrder, VramPlan};
use crate::residency::{BlockHandle, ResidencyTable};
use crate::stats::{Stats, StatsSnapshot};
use crate::storage::Storage;
use crate::vram_allocator::VramAllocator;

mod prepare;

use prepare::Prepared;

/// How a session uses its budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
    pub prefetch_depth: u32,
    pub staging_buffers: u32,
    /// `--fast-disk`: stream blocks without a pinned copy through a ring of
    /// `staging_buffers` chunks of this size straight to VRAM. `None`: whole-block staging.
    pub fast_disk_chunk_bytes: Option<u64>,
    pub policy: ResidencyPolicy,
    pub max_reads_in_flight: usize,
}

/// An expert cache for blocks outside the step order (MoE experts): `slots` slots of
/// `slot_bytes` each, carved out of the VRAM budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertConfig {
    pub slots: u32,
    pub slot_bytes: u64,
    pub policy: ExpertPolicy,
}

impl ExpertConfig {
    pub fn area_bytes(&self) -> u64 {
        u64::from(self.slots) * crate::arena::align_up(self.slot_bytes)
    }
}

/// What the session decided at start, for summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPlan {
    pub vram: VramPlan,
    pub pins: PinPlan,
}

/// A started pipeline. Owned by the compute thread (it is `Send`, not `Sync`).
pub struct Session {
    /// The device's address space: what a held block's `DevicePtr` means.
    memory_space: MemorySpace,
    table: Arc<ResidencyTable>,
    /// Packs of LoRA factors in VRAM, one entry per (adapter slot, block).
    lora_table: Arc<ResidencyTable>,
    /// LoRA packs the compute thread holds now (a detach waits for none).
    lora_held: u32,
    stream: Addr<ComputeStream>,
    lora: Addr<LoraOffloader>,
    allocator: Addr<VramAllocator>,
    order: StepOrder,
    position: usize,
    batch: AcquireBatch,
    step_started: Instant,
    stats: Arc<Stats>,
    plan: SessionPlan,
    system_thread: Option<JoinHandle<()>>,
}

struct Wiring {
    stream: Addr<ComputeStream>,
    lora: Addr<LoraOffloader>,
    allocator: Addr<VramAllocator>,
}

impl Session {
    /// Plans the budgets and starts the actors on their own thread.
    pub fn start(
        config: SessionConfig,
        layout: ModelLayout,
        order: Vec<BlockId>,
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, SessionError> {
        Self::start_with_experts(config, None, layout, order, device, storage, observer)
    }

    /// As [`Session::start`], with an expert cache for the blocks outside `order`.
    pub fn start_with_experts(
        config: SessionConfig,
        experts: Option<ExpertConfig>,
        layout: ModelLayout,
        order: Vec<BlockId>,
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, SessionError> {
        let prepared = Prepared::new(&config, experts, &layout, order)?;
        let memory_space = device.memory_space();
        let (sender, receiver) = flume::bounded(1);
        let moved = prepared.clone();
        let thread = std::thread::Builder::new()
            .name("stagehand-actors".into())
            .spawn(move || {
                let system = System::new();
                system.block_on(async move {
                    let wiring = moved
                        .start_actors(config, experts, layout, device, storage, observer, true);
                    let _ = sender.send(wiring);
                });
                if let Err(error) = system.run() {
                    tracing::error!("actor system: {error}");
                }
            })
            .map_err(|error| {
                SessionError::Device(format!("could not start the actor thread: {error}"))
            })?;
        let wiring = receiver.recv().map_err(|_| SessionError::Stopped)??;
        Ok(prepared.into_session(wiring, Some(thread), memory_space))
    }

    /// Starts the actors on the current actix system (the simulator's paused runtime).
    /// Use the `_async` methods from a task on that same thread.
    pub fn start_local(
        config: SessionConfig,
        layout: ModelLayout,
        order: Vec<BlockId>,
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, SessionError> {
        let prepared = Prepared::new(&config, None, &layout, order)?;
        let memory_space = device.memory_space();
        let wiring = prepared
            .clone()
            .start_actors(config, None, layout, device, storage, observer, false)?;
        Ok(prepared.into_session(wiring, None, memory_space))
    }

    /// The address space of the blocks this session hands out.
    pub fn memory_space(&self) -> MemorySpace {
        self.memory_space
    }

    pub fn plan(&self) -> &SessionPlan {
        &self.plan
    }

    pub fn order(&self) -> &[BlockId] {
        self.order.blocks()
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    pub fn lora(&self) -> &Addr<LoraOffloader> {
        &self.lora
    }

    /// The hot path: a hold on `block` if it is ready, without a message or a lock.
    #[inline]
    pub fn try_acquire(&mut self, block: BlockId) -> Option<BlockHandle> {
        let handle = self.table.try_acquire(block)?;
        self.batch.hits += 1;
        self.advance_to(block);
        Some(handle)
    }

    #[inline]
    fn advance_to(&mut self, block: BlockId) {
        if self.order.at(self.position) != block {
            if !self.order.contains(block) {
                // A block outside the order (an expert) does not move the position.
                return;
            }
            if let Some(distance) = self.order.distance_to_next_use(self.position, block) {
                self.position += distance;
            }
        }
        self.position = (self.position + 1) % self.order.len();
    }

    fn current_position(&self, block: BlockId) -> usize {
        let distance = self
            .order
            .distance_to_next_use(self.position, block)
            .unwrap_or(0);
        (self.position + distance) % self.order.len()
    }

    fn check_block(&self, block: BlockId) -> Result<(), SessionError> {
        if block.index() >= self.table.len() {
            return Err(SessionError::UnknownBlock {
                block,
                block_count: self.table.len(),
            });
        }
        Ok(())
    }

    fn send_miss(&self, block: BlockId) -> flume::Receiver<Result<(), SessionError>> {
        let (reply, receiver) = flume::bounded(1);
        self.stream.do_send(Miss {
            block,
            position: self.current_position(block),
            reply,
        });
        receiver
    }

    /// Blocks the calling thread until `block` is resident, then holds it.
    pub fn acquire(&mut self, block: BlockId) -> Result<BlockHandle, SessionError> {
        if let Some(handle) = self.try_acquire(block) {
            return Ok(handle);
        }
        block_on(self.wait_for(block))
    }

    /// As [`Session::acquire`], for a task on the actors' own runtime.
    pub async fn acquire_async(&mut self, block: BlockId) -> Result<BlockHandle, SessionError> {
        if let Some(handle) = self.try_acquire(block) {
            return Ok(handle);
        }
        self.wait_for(block).await
    }

    /// The miss path: asks for the block and waits for that block only.
    async fn wait_for(&mut self, block: BlockId) -> Result<BlockHandle, SessionError> {
        self.check_block(block)?;
        let started = Instant::now();
        for _attempt in 0..MAX_MISS_ATTEMPTS {
            let receiver = self.send_miss(block);
            receiver
                .recv_async()
                .await
                .map_err(|_| SessionError::Stopped)??;
            if let Some(handle) = self.table.try_acquire(block) {
                self.count_miss(started);
                self.advance_to(block);
                return Ok(handle);
            }
        }
        Err(SessionError::Starved {
            block,
            attempts: MAX_MISS_ATTEMPTS,
        })
    }

    fn count_miss(&mut self, started: Instant) {
        self.batch.misses += 1;
        self.batch.stall_seconds += started.elapsed().as_secs_f64();
    }

    /// Attaches a LoRA adapter: its packs go to the offloader's own pinned set and a
    /// VRAM region of a few pack slots is placed inside the budget (counted as LoRA
    /// bytes). From now on each block's factors travel with the block. Waits for the
    /// answer; a refused attach leaves nothing behind.
    pub fn attach_lora(&mut self, adapter: LoraAttach) -> Result<LoraSlot, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.lora.do_send(Attach { adapter, reply });
        receiver.recv().map_err(|_| SessionError::Stopped)?
    }

    /// Detaches an adapter and gives its pinned set and VRAM back once its copies in
    /// flight have landed; `false` if none had that name. Release every LoRA handle
    /// first.
    pub fn detach_lora(&mut self, name: &str) -> Result<bool, SessionError> {
        if self.lora_held > 0 {
            return Err(SessionError::Lora {
                name: name.to_string(),
                problem: format!(
                    "cannot be detached while {} of its packs are held; release them first",
                    self.lora_held
                ),
            });
        }
        let (reply, receiver) = flume::bounded(1);
        self.lora.do_send(Detach {
            name: name.to_string(),
            reply,
        });
        receiver.recv().map_err(|_| SessionError::Stopped)
    }

    /// Holds `block`'s factors of adapter `slot` in VRAM: an atomic load when they
    /// came with the block, else one message and a wait for that pack only. Only for
    /// blocks the adapter patches (those it was given packs for).
    pub fn acquire_lora(
        &mut self,
        slot: LoraSlot,
        block: BlockId,
    ) -> Result<BlockHandle, SessionError> {
        self.check_block(block)?;
        let key = LoraState::key(self.table.len(), slot, block);
        for _attempt in 0..MAX_MISS_ATTEMPTS {
            if let Some(handle) = self.lora_table.try_acquire(key) {
                self.lora_held += 1;
                return Ok(handle);
            }
            let (reply, receiver) = flume::bounded(1);
            self.lora.do_send(DemandPack { slot, block, reply });
            block_on(receiver.recv_async()).map_err(|_| SessionError::Stopped)??;
        }
        Err(SessionError::Starved {
            block,
            attempts: MAX_MISS_ATTEMPTS,
        })
    }

    /// Drops the hold on a pack. Sends nothing: the offloader reuses unheld slots.
    pub fn release_lora(&mut self, handle: BlockHandle) {
        self.lora_table.release(&handle);
        self.lora_held = self.lora_held.saturating_sub(1);
    }

    /// The LoRA offloader's own accounting.
    pub fn lora_usage(&self) -> Result<LoraUsage, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.lora.do_send(Usage(reply));
        receiver.recv().map_err(|_| SessionError::Stopped)
    }

    /// Drops the device copies of these blocks (ready and unheld ones) so their next use
    /// reloads pristine bytes — after patching resident copies with a LoRA set that has
    /// since changed. Waits until done; returns how many were dropped.
    pub fn invalidate(&mut self, blocks: &[BlockId]) -> Result<u64, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.allocator.do_send(Invalidate {
            blocks: blocks.to_vec(),
            reply,
        });
        receiver.recv().map_err(|_| SessionError::Stopped)
    }

    /// Speculative prefetch of blocks outside the order (experts the router is expected
    /// to pick): loaded if that evicts nothing needed sooner. Does not wait.
    pub fn hint(&mut self, blocks: &[BlockId]) {
        let blocks: Vec<BlockId> = blocks
            .iter()
            .copied()
            .filter(|block| block.index() < self.table.len())
            .collect();
        if !blocks.is_empty() {
            self.allocator.do_send(Hint { blocks });
        }
    }

    /// Drops the hold. Only a streamed block's release sends a message.
    #[inline]
    pub fn release(&mut self, handle: BlockHandle) {
        let left = self.table.release(&handle);
        if handle.streamed && left == 0 {
            let position = (self.position + self.order.len() - 1) % self.order.len();
            self.stream.do_send(ReleaseStreamed {
                block: handle.block,
                position,
            });
        }
    }

    /// Marks the end of a step: flushes the batched hit/miss counts and times the step.
    pub fn step_done(&mut self) {
        let now = Instant::now();
        let step_seconds = now.duration_since(self.step_started).as_secs_f64();
        self.step_started = now;
        self.stream.do_send(StepDone {
            batch: std::mem::take(&mut self.batch),
            step_seconds,
        });
    }

    /// Reserves VRAM for activations, evicting weights if needed (activations win).
    /// Returns the resident blocks that gave way: they stream from now on.
    pub fn reserve_activations(&mut self, bytes: u64) -> Result<Vec<BlockId>, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.stream.do_send(ReserveActivations { bytes, reply });
        receiver.recv().map_err(|_| SessionError::Stopped)?
    }

    pub async fn reserve_activations_async(
        &mut self,
        bytes: u64,
    ) -> Result<Vec<BlockId>, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.stream.do_send(ReserveActivations { bytes, reply });
        receiver
            .recv_async()
            .await
            .map_err(|_| SessionError::Stopped)?
    }

    pub fn release_activations(&mut self, bytes: u64) {
        self.stream.do_send(ReleaseActivations { bytes });
    }

    /// Drains every actor, releases every budget and stops the actor thread.
    /// Returns the final counters. Release every handle first.
    pub fn finish(mut self) -> StatsSnapshot {
        let (reply, receiver) = flume::bounded(1);
        self.stream.do_send(Shutdown { reply });
        let _ = receiver.recv();
        if let Some(thread) = self.system_thread.take() {
            let _ = thread.join();
        }
        self.stats.snapshot()
    }

    pub async fn finish_async(self) -> StatsSnapshot {
        let (reply, receiver) = flume::bounded(1);
        self.stream.do_send(Shutdown { reply });
        let _ = receiver.recv_async().await;
        self.stats.snapshot()
    }
}

/// Wakes a parked compute thread.
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on the calling (compute) thread, parking between polls.
/// Used only on the miss path, where the thread waits anyway.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

/// A miss is retried if the block was evicted again before the compute thread got it
/// (activation pressure); past this many tries something is wrong.
const MAX_MISS_ATTEMPTS: u32 = 64;
