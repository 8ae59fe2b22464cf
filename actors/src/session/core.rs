//! What both session types share: the tables, the position in the order, the batched
//! counts, and the messages the compute side sends. No waiting happens here; the
//! blocking [`super::Session`] and the async [`super::LocalSession`] each wait their
//! own way.

use std::sync::Arc;

use actix::dev::ToEnvelope;
use actix::prelude::*;
use tokio::time::Instant;

use crate::compute_stream::ComputeStream;
use crate::error::SessionError;
use crate::layout::BlockId;
use crate::lora_offloader::LoraOffloader;
use crate::messages::{LastStep, Miss, ReleaseStreamed, StepDone};
use crate::observer::AcquireBatch;
use crate::plan::StepOrder;
use crate::residency::{BlockHandle, ResidencyTable};
use crate::stats::{Stats, StatsSnapshot};
use crate::vram_allocator::VramAllocator;

use super::SessionPlan;

pub(super) struct Core {
    /// The device's address space: what a held block's `DevicePtr` means.
    pub memory_space: crate::device::MemorySpace,
    pub table: Arc<ResidencyTable>,
    /// Packs of LoRA factors in VRAM, one entry per (adapter slot, block).
    pub lora_table: Arc<ResidencyTable>,
    /// LoRA packs the compute thread holds now (a detach waits for none).
    pub lora_held: u32,
    pub stream: Addr<ComputeStream>,
    pub lora: Addr<LoraOffloader>,
    pub allocator: Addr<VramAllocator>,
    pub order: StepOrder,
    /// The next position the compute thread uses, counted from the session's start
    /// (not wrapped at the end of a step): position / order length is the step.
    pub position: usize,
    pub batch: AcquireBatch,
    pub step_started: Instant,
    pub stats: Arc<Stats>,
    pub plan: SessionPlan,
}

impl Core {
    /// The hot path: a hold on `block` if it is ready, without a message or a lock.
    #[inline]
    pub fn try_acquire(&mut self, block: BlockId) -> Option<BlockHandle> {
        let handle = self.table.try_acquire(block)?;
        self.batch.hits += 1;
        self.advance_to(block);
        Some(handle)
    }

    /// After a miss was answered: the hold, if the block is still ready.
    pub fn take_after_miss(&mut self, block: BlockId, started: Instant) -> Option<BlockHandle> {
        let handle = self.table.try_acquire(block)?;
        self.batch.misses += 1;
        self.batch.stall_seconds += started.elapsed().as_secs_f64();
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
        self.position += 1;
    }

    fn current_position(&self, block: BlockId) -> usize {
        let distance = self
            .order
            .distance_to_next_use(self.position, block)
            .unwrap_or(0);
        self.position + distance
    }

    /// The message that ends prefetching at the end of the step under way (or about
    /// to begin, when the last one ended): no load starts for a later step.
    pub fn last_step(&self) -> LastStep {
        let len = self.order.len();
        LastStep {
            end: (self.position / len + 1) * len,
        }
    }

    pub fn check_block(&self, block: BlockId) -> Result<(), SessionError> {
        if block.index() >= self.table.len() {
            return Err(SessionError::UnknownBlock {
                block,
                block_count: self.table.len(),
            });
        }
        Ok(())
    }

    /// The message that asks for a missing block, and where its answer comes.
    pub fn miss(&self, block: BlockId) -> (Miss, flume::Receiver<Result<(), SessionError>>) {
        let (reply, receiver) = flume::bounded(1);
        let message = Miss {
            block,
            position: self.current_position(block),
            reply,
        };
        (message, receiver)
    }

    /// Drops the hold; the message to send if it freed a streaming slot.
    #[inline]
    pub fn release(&mut self, handle: BlockHandle) -> Option<ReleaseStreamed> {
        let block = handle.block;
        let streamed = handle.streamed;
        let left = self.table.release(handle);
        if !streamed || left != 0 {
            return None;
        }
        let position = self.position.saturating_sub(1);
        Some(ReleaseStreamed { block, position })
    }

    /// The end of a step: the batched counts and the step's time.
    pub fn step_done(&mut self) -> StepDone {
        let now = Instant::now();
        let step_seconds = now.duration_since(self.step_started).as_secs_f64();
        self.step_started = now;
        StepDone {
            batch: std::mem::take(&mut self.batch),
            step_seconds,
        }
    }

    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }
}

/// Sends `message` from the compute side, waiting (without blocking a runtime) until
/// the mailbox has room: back-pressure, the mailbox never past its bound. A closed
/// mailbox (the actors stopped) drops it: the wait for the answer then reports
/// `Stopped`.
pub(super) async fn queue_when_room<A, M>(to: &Addr<A>, message: M)
where
    A: Actor + Handler<M>,
    A::Context: ToEnvelope<A, M>,
    M: Message + Send + 'static,
    M::Result: Send,
{
    let _ = crate::mailbox::send_when_room(to, message).await;
}

/// A miss is retried if the block was evicted again before the compute thread got it
/// (activation pressure); past this many tries something is wrong.
pub(super) const MAX_MISS_ATTEMPTS: u32 = 64;
