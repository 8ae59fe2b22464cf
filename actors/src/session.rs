//! The compute thread's API: how an inference engine embeds stagehand.
//!
//! ```no_run
//! use std::sync::Arc;
//! use stagehand_actors::{
//!     BlockId, Device, DevicePtr, ModelLayout, NoObserver, Session, SessionConfig, SessionError,
//!     Storage,
//! };
//!
//! fn run(
//!     config: SessionConfig,
//!     layout: ModelLayout,
//!     device: Arc<dyn Device>,
//!     storage: Arc<dyn Storage>,
//!     steps: u64,
//!     compute: impl Fn(DevicePtr, u64),
//! ) -> Result<(), SessionError> {
//!     let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
//!     let mut session =
//!         Session::start(config, layout, order.clone(), device, storage, Arc::new(NoObserver))?;
//!     for _ in 0..steps {
//!         for &block in &order {
//!             let handle = session.acquire(block)?; // an atomic load when resident
//!             compute(handle.ptr, handle.bytes);
//!             session.release(handle);
//!         }
//!         session.step_done();
//!     }
//!     let stats = session.finish(); // dropping the session would release as much
//!     assert_eq!(stats.vram.used_bytes, 0);
//!     Ok(())
//! }
//! ```
//!
//! `acquire` of a ready block touches only the residency table. A miss sends one
//! message and waits for that block only. Releases of resident blocks send nothing;
//! releases of streamed blocks send one message, because they free a ring slot.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use tokio::time::Instant;

use crate::compute_stream::ComputeStream;
use crate::device::{Device, MemorySpace};
use crate::error::SessionError;
use crate::layout::{BlockId, ModelLayout};
use crate::lora_offloader::{Attach, DemandPack, Detach, LoraAttach, LoraOffloader, Usage};
use crate::lora_state::{LoraSlot, LoraState, LoraUsage};
use crate::messages::{Hint, Invalidate, ReleaseActivations, ReserveActivations, Shutdown};
use crate::observer::Observer;
use crate::residency::BlockHandle;
use crate::stats::StatsSnapshot;
use crate::storage::Storage;
use crate::vram_allocator::VramAllocator;

mod config;
mod core;
mod local;
mod prepare;
mod shared;

use self::core::{Core, MAX_MISS_ATTEMPTS};
pub use config::{ExpertConfig, SessionConfig, SessionPlan};
pub use local::LocalSession;
use prepare::Prepared;
pub use shared::BudgetHandle;

/// A held LoRA pack: its factors' place in VRAM. Move-only, released once by
/// [`Session::release_lora`]; a distinct type, so a pack can never be released into
/// the block table (or a block into the pack table).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a held pack stays held (its adapter cannot be detached) until released"]
pub struct LoraHandle(BlockHandle);

impl std::ops::Deref for LoraHandle {
    type Target = BlockHandle;

    fn deref(&self) -> &BlockHandle {
        &self.0
    }
}

/// A started pipeline, driven from its own (compute) thread: the actors run on a
/// thread of their own, and the methods that wait block the calling thread. Owned by
/// the compute thread (it is `Send`, not `Sync`). For a task on the actors' own
/// runtime (the simulator) use [`LocalSession`], whose waits are async.
pub struct Session {
    core: Core,
    /// Set by the owner to end every wait early (a signal asked the run to stop).
    stop: Option<Arc<AtomicBool>>,
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
        Self::start_inner(
            config,
            experts,
            None,
            (layout, order),
            device,
            storage,
            observer,
        )
    }

    /// Starts the actors; `capacity` is the arena of a shared budget (see `shared`).
    fn start_inner(
        config: SessionConfig,
        experts: Option<ExpertConfig>,
        capacity: Option<u64>,
        (layout, order): (ModelLayout, Vec<BlockId>),
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, SessionError> {
        let prepared = Prepared::new(&config, experts, &layout, order, capacity)?;
        let memory_space = device.memory_space();
        let (sender, receiver) = flume::bounded(1);
        let moved = prepared.clone();
        let thread = std::thread::Builder::new()
            .name("stagehand-actors".into())
            .spawn(move || {
                let system = System::new();
                let started = system.block_on(async move {
                    let wiring = moved
                        .start_actors(config, experts, layout, device, storage, observer, true);
                    let failed = wiring.is_err();
                    let _ = sender.send(wiring);
                    !failed
                });
                // A session that failed to start has no actor to stop the system.
                if started {
                    if let Err(error) = system.run() {
                        tracing::error!("actor system: {error}");
                    }
                }
            })
            .map_err(|error| {
                SessionError::Device(format!("could not start the actor thread: {error}"))
            })?;
        let wiring = match receiver.recv() {
            Ok(Ok(wiring)) => wiring,
            Ok(Err(error)) => {
                let _ = thread.join();
                return Err(error);
            }
            Err(_) => {
                let _ = thread.join();
                return Err(SessionError::Stopped);
            }
        };
        Ok(Self {
            core: prepared.into_core(wiring, memory_space),
            stop: None,
            system_thread: Some(thread),
        })
    }

    /// Every later wait (a miss, an attach, a reservation) ends with
    /// [`SessionError::Interrupted`] once `flag` is set, within [`STOP_POLL`].
    pub fn stop_on(&mut self, flag: Arc<AtomicBool>) {
        self.stop = Some(flag);
    }

    /// The address space of the blocks this session hands out.
    pub fn memory_space(&self) -> MemorySpace {
        self.core.memory_space
    }

    /// What the session decided at start, for summaries.
    pub fn plan(&self) -> &SessionPlan {
        &self.core.plan
    }

    /// The step order the session plans and prefetches for, as given at start.
    pub fn order(&self) -> &[BlockId] {
        self.core.order.blocks()
    }

    /// The counters so far; hits and misses arrive per step (at `step_done`).
    pub fn stats(&self) -> StatsSnapshot {
        self.core.stats()
    }

    /// The hot path: a hold on `block` if it is ready, without a message or a lock.
    #[inline]
    pub fn try_acquire(&mut self, block: BlockId) -> Option<BlockHandle> {
        self.core.try_acquire(block)
    }

    /// The held block's bytes, when this session's device keeps them in host memory
    /// (the CPU backend); `None` on a device whose memory the host cannot read. The
    /// slice borrows the handle, so it cannot outlive the hold.
    pub fn host_bytes<'h>(&self, handle: &'h BlockHandle) -> Option<&'h [u8]> {
        if self.core.memory_space != MemorySpace::Host || handle.bytes == 0 {
            return None;
        }
        let len = usize::try_from(handle.bytes).ok()?;
        // SAFETY: on a host-memory device a ready block's pointer is a host address
        // of `bytes` readable bytes in the session's arena; the handle holds the
        // block (it is neither evicted nor overwritten while held), and the slice
        // borrows the handle, which is released by value.
        Some(unsafe { std::slice::from_raw_parts(handle.ptr.0 as *const u8, len) })
    }

    /// Blocks the calling thread until `block` is resident, then holds it.
    pub fn acquire(&mut self, block: BlockId) -> Result<BlockHandle, SessionError> {
        if let Some(handle) = self.core.try_acquire(block) {
            return Ok(handle);
        }
        self.wait_for(block)
    }

    /// The miss path: asks for the block and waits for that block only.
    fn wait_for(&mut self, block: BlockId) -> Result<BlockHandle, SessionError> {
        self.core.check_block(block)?;
        let started = Instant::now();
        for _attempt in 0..MAX_MISS_ATTEMPTS {
            let (miss, receiver) = self.core.miss(block);
            self.send(&self.core.stream, miss)?;
            self.wait(receiver.recv_async())?
                .map_err(|_| SessionError::Stopped)??;
            if let Some(handle) = self.core.take_after_miss(block, started) {
                return Ok(handle);
            }
        }
        Err(SessionError::Starved {
            block,
            attempts: MAX_MISS_ATTEMPTS,
        })
    }

    /// Attaches a LoRA adapter: its packs go to the offloader's own pinned set and a
    /// VRAM region of a few pack slots is placed inside the budget (counted as LoRA
    /// bytes). From now on each block's factors travel with the block. Waits for the
    /// answer; a refused attach leaves nothing behind.
    pub fn attach_lora(&mut self, adapter: LoraAttach) -> Result<LoraSlot, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.send(&self.core.lora, Attach { adapter, reply })?;
        self.wait(receiver.recv_async())?
            .map_err(|_| SessionError::Stopped)?
    }

    /// Detaches an adapter and gives its pinned set and VRAM back once its copies in
    /// flight have landed; `false` if none had that name. Release every LoRA handle
    /// first.
    pub fn detach_lora(&mut self, name: &str) -> Result<bool, SessionError> {
        if self.core.lora_held > 0 {
            return Err(SessionError::Lora {
                name: name.to_string(),
                problem: format!(
                    "cannot be detached while {} of its packs are held; release them first",
                    self.core.lora_held
                ),
            });
        }
        let (reply, receiver) = flume::bounded(1);
        let detach = Detach {
            name: name.to_string(),
            reply,
        };
        self.send(&self.core.lora, detach)?;
        self.wait(receiver.recv_async())?
            .map_err(|_| SessionError::Stopped)
    }

    /// Holds `block`'s factors of adapter `slot` in VRAM: an atomic load when they
    /// came with the block, else one message and a wait for that pack only. Only for
    /// blocks the adapter patches (those it was given packs for).
    pub fn acquire_lora(
        &mut self,
        slot: LoraSlot,
        block: BlockId,
    ) -> Result<LoraHandle, SessionError> {
        self.core.check_block(block)?;
        let key = LoraState::key(self.core.table.len(), slot, block);
        for _attempt in 0..MAX_MISS_ATTEMPTS {
            if let Some(handle) = self.core.lora_table.try_acquire(key) {
                self.core.lora_held += 1;
                return Ok(LoraHandle(handle));
            }
            let (reply, receiver) = flume::bounded(1);
            self.send(&self.core.lora, DemandPack { slot, block, reply })?;
            self.wait(receiver.recv_async())?
                .map_err(|_| SessionError::Stopped)??;
        }
        Err(SessionError::Starved {
            block,
            attempts: MAX_MISS_ATTEMPTS,
        })
    }

    /// Drops the hold on a pack. Sends nothing: the offloader reuses unheld slots.
    pub fn release_lora(&mut self, handle: LoraHandle) {
        self.core.lora_table.release(handle.0);
        self.core.lora_held = self.core.lora_held.saturating_sub(1);
    }

    /// The LoRA offloader's own accounting.
    pub fn lora_usage(&self) -> Result<LoraUsage, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.send(&self.core.lora, Usage(reply))?;
        self.wait(receiver.recv_async())?
            .map_err(|_| SessionError::Stopped)
    }

    /// Drops the device copies of these blocks (ready and unheld ones) so their next use
    /// reloads pristine bytes — after patching resident copies with a LoRA set that has
    /// since changed. Waits until done; returns how many were dropped.
    pub fn invalidate(&mut self, blocks: &[BlockId]) -> Result<u64, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        let message = Invalidate {
            blocks: blocks.to_vec(),
            reply,
        };
        self.send(&self.core.allocator, message)?;
        self.wait(receiver.recv_async())?
            .map_err(|_| SessionError::Stopped)
    }

    /// Speculative prefetch of blocks outside the order (experts the router is expected
    /// to pick): loaded if that evicts nothing needed sooner. Does not wait; dropped
    /// when the allocator's mailbox is full (a late hint is worth nothing).
    pub fn hint(&mut self, blocks: &[BlockId]) {
        let blocks: Vec<BlockId> = blocks
            .iter()
            .copied()
            .filter(|block| block.index() < self.core.table.len())
            .collect();
        if !blocks.is_empty() {
            crate::mailbox::offer(&self.core.allocator, Hint { blocks });
        }
    }

    /// Drops the hold, consuming the handle (a hold is released exactly once). Only a
    /// streamed block's release sends a message, waiting for room if the mailbox is
    /// full.
    #[inline]
    pub fn release(&mut self, handle: BlockHandle) {
        if let Some(message) = self.core.release(handle) {
            let _ = self.send(&self.core.stream, message);
        }
    }

    /// Marks the end of a step: flushes the batched hit/miss counts and times the step.
    pub fn step_done(&mut self) {
        let message = self.core.step_done();
        let _ = self.send(&self.core.stream, message);
    }

    /// Says the step under way — or the next, when called between steps — is the
    /// last: the allocator prefetches nothing past its end, so no block is copied for
    /// a step that never comes. A later acquire past that end lifts it (the blocks are
    /// then loaded as they are asked for).
    pub fn last_step(&mut self) {
        let message = self.core.last_step();
        let _ = self.send(&self.core.stream, message);
    }

    /// Reserves VRAM for activations, evicting weights if needed (activations win).
    /// Returns the resident blocks that gave way: they stream from now on.
    pub fn reserve_activations(&mut self, bytes: u64) -> Result<Vec<BlockId>, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        self.send(&self.core.stream, ReserveActivations { bytes, reply })?;
        self.wait(receiver.recv_async())?
            .map_err(|_| SessionError::Stopped)?
    }

    /// Gives back `bytes` of earlier reservations. Does not wait. Blocks that gave way
    /// to them keep streaming: the freed room is not planned back into residency.
    pub fn release_activations(&mut self, bytes: u64) {
        let _ = self.send(&self.core.stream, ReleaseActivations { bytes });
    }

    /// Drains every actor, releases every budget and stops the actor thread.
    /// Returns the final counters. Release every handle first. Not interrupted by
    /// the stop flag: the drain is what gives every budget back. Dropping a session
    /// does the same (see [`Session`]'s `Drop`); `finish` also returns the counters.
    pub fn finish(mut self) -> StatsSnapshot {
        self.shut_down();
        self.core.stats()
    }

    /// The drain of [`Session::finish`]; does nothing once it has run.
    fn shut_down(&mut self) {
        let Some(thread) = self.system_thread.take() else {
            return;
        };
        let (reply, receiver) = flume::bounded(1);
        let stream = self.core.stream.clone();
        self.stop = None;
        let _ = self.send(&stream, Shutdown { reply });
        let _ = receiver.recv();
        let _ = thread.join();
    }

    /// Queues `message`, blocking this thread while the mailbox is full
    /// (back-pressure: a compute thread ahead of the actors waits for them, and the
    /// mailbox never holds more than its bound). A closed mailbox (the actors
    /// stopped) drops it: the wait for the answer then reports `Stopped`. The stop
    /// flag ends the wait with [`SessionError::Interrupted`].
    fn send<A, M>(&self, to: &Addr<A>, message: M) -> Result<(), SessionError>
    where
        A: Actor + Handler<M>,
        A::Context: ToEnvelope<A, M>,
        M: Message + Send + 'static,
        M::Result: Send,
    {
        crate::mailbox::send_blocking_when_room(to, message, self.stop.as_deref())
            .map_err(|_| SessionError::Interrupted)
    }

    /// Runs `future` on this thread until it completes or the stop flag is set.
    fn wait<F: Future>(&self, future: F) -> Result<F::Output, SessionError> {
        block_on(future, self.stop.as_deref()).ok_or(SessionError::Interrupted)
    }
}

/// A session that goes out of scope without [`Session::finish`] — an early `?`, a
/// panic in the compute closure unwinding through its owner — still drains its actors,
/// gives back every byte of both budgets and joins the actor thread. Holds still out
/// are dropped with the compute that took them: the drain waits only for copies in
/// flight, never for holders.
impl Drop for Session {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// How often a wait looks at the stop flag: the longest a stop request waits.
pub const STOP_POLL: Duration = Duration::from_millis(20);

/// Wakes a parked compute thread.
struct ThreadWaker(std::thread::Thread);

impl std::task::Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on the calling (compute) thread, parking between polls;
/// `None` if `stop` is set first. Used only where the thread waits anyway (a miss, a
/// reply, a full mailbox), never on the hot path.
fn block_on<F: Future>(future: F, stop: Option<&AtomicBool>) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let waker = std::task::Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut context = std::task::Context::from_waker(&waker);
    loop {
        if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return Some(output);
        }
        match stop {
            Some(flag) if flag.load(Ordering::Relaxed) => return None,
            Some(_) => std::thread::park_timeout(STOP_POLL),
            None => std::thread::park(),
        }
    }
}
