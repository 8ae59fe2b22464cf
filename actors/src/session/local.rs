//! A session whose actors run on the caller's own actix system: the simulator's
//! paused, single-thread runtime. Every method that may wait is `async`, so a task can
//! never block the only thread that runs the actors it waits for — the deadlock the
//! blocking [`super::Session`] would cause here is not expressible.

use std::sync::Arc;

use tokio::time::Instant;

use crate::device::Device;
use crate::error::SessionError;
use crate::layout::{BlockId, ModelLayout};
use crate::messages::{ReleaseActivations, ReserveActivations, Shutdown};
use crate::observer::Observer;
use crate::residency::BlockHandle;
use crate::stats::StatsSnapshot;
use crate::storage::Storage;

use super::core::{queue_when_room, Core, MAX_MISS_ATTEMPTS};
use super::prepare::Prepared;
use super::{SessionConfig, SessionPlan};

/// A started pipeline on the current actix system, driven by a task on that system.
pub struct LocalSession {
    core: Core,
}

impl LocalSession {
    /// Starts the actors on the current actix system (the simulator's paused runtime).
    pub fn start(
        config: SessionConfig,
        layout: ModelLayout,
        order: Vec<BlockId>,
        device: Arc<dyn Device>,
        storage: Arc<dyn Storage>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, SessionError> {
        let prepared = Prepared::new(&config, None, &layout, order, None)?;
        let memory_space = device.memory_space();
        let wiring = prepared
            .clone()
            .start_actors(config, None, layout, device, storage, observer, false)?;
        Ok(Self {
            core: prepared.into_core(wiring, memory_space),
        })
    }

    /// The address space of the blocks this session hands out.
    pub fn memory_space(&self) -> crate::device::MemorySpace {
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

    /// Holds `block`: at once when it is ready, else after the actors loaded it.
    pub async fn acquire(&mut self, block: BlockId) -> Result<BlockHandle, SessionError> {
        if let Some(handle) = self.core.try_acquire(block) {
            return Ok(handle);
        }
        self.core.check_block(block)?;
        let started = Instant::now();
        for _attempt in 0..MAX_MISS_ATTEMPTS {
            let (miss, receiver) = self.core.miss(block);
            queue_when_room(&self.core.stream, miss).await;
            receiver
                .recv_async()
                .await
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

    /// Drops the hold, consuming the handle; a streamed block's release frees its slot.
    pub async fn release(&mut self, handle: BlockHandle) {
        if let Some(message) = self.core.release(handle) {
            queue_when_room(&self.core.stream, message).await;
        }
    }

    /// Marks the end of a step: flushes the batched counts and times the step.
    pub async fn step_done(&mut self) {
        let message = self.core.step_done();
        queue_when_room(&self.core.stream, message).await;
    }

    /// As [`super::Session::last_step`]: nothing is prefetched past the end of the step
    /// under way (or the next, between steps).
    pub async fn last_step(&mut self) {
        let message = self.core.last_step();
        queue_when_room(&self.core.stream, message).await;
    }

    /// Reserves VRAM for activations, evicting weights if needed (activations win).
    /// Returns the resident blocks that gave way: they stream from now on.
    pub async fn reserve_activations(&mut self, bytes: u64) -> Result<Vec<BlockId>, SessionError> {
        let (reply, receiver) = flume::bounded(1);
        queue_when_room(&self.core.stream, ReserveActivations { bytes, reply }).await;
        receiver
            .recv_async()
            .await
            .map_err(|_| SessionError::Stopped)?
    }

    /// Gives back `bytes` of earlier reservations; waits only for mailbox room. Blocks
    /// that gave way to them keep streaming.
    pub async fn release_activations(&mut self, bytes: u64) {
        queue_when_room(&self.core.stream, ReleaseActivations { bytes }).await;
    }

    /// Drains every actor and releases every budget; the final counters.
    pub async fn finish(self) -> StatsSnapshot {
        let (reply, receiver) = flume::bounded(1);
        queue_when_room(&self.core.stream, Shutdown { reply }).await;
        let _ = receiver.recv_async().await;
        self.core.stats()
    }
}
