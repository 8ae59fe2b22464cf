//! Disk read-ahead: the VRAM allocator can start a streamed block's load only once a
//! ring slot is free, `depth` blocks ahead, so on a disk-bound step the disk would idle
//! whenever the ring is full of blocks waiting for compute. The allocator names the
//! streamed blocks due next after its window; their reads start here into staging
//! buffers that are idle, keeping one free for a request that cannot wait. When the
//! allocator asks for such a block, the bytes are already pinned (or on their way).
//! Bounded by the staging ring: read-ahead never pins a byte more.

use crate::host_buffer::HostBuffer;
use crate::layout::BlockId;
use crate::observer::ReadAheadOutcome;

use super::{BufferHome, PinAction, PinState};

#[derive(Debug)]
pub(super) struct Entry {
    block: BlockId,
    /// `None` while the read is in flight.
    buffer: Option<HostBuffer>,
    /// The allocator asked for the block while its read was in flight.
    wanted: bool,
    /// Dropped from the list (or drain) while its read was in flight.
    cancelled: bool,
    /// The read failed: not retried ahead (a failing disk must not spin); the
    /// allocator's own request reads it again and reports a failure.
    failed: bool,
}

impl Entry {
    fn in_flight(&self) -> bool {
        self.buffer.is_none() && !self.failed
    }
}

/// What a finished read-ahead read means for the actor.
#[derive(Debug)]
pub enum AheadDone {
    /// The allocator is waiting for this block: hand it the buffer.
    Wanted(PinAction),
    /// The allocator is waiting and the read failed: report the failure. The buffer
    /// went back to the ring, perhaps to a request that was waiting for one.
    Failed(Option<PinAction>),
    /// Kept for when the allocator asks, or the buffer went back to the ring (and
    /// perhaps to a request that was waiting for one).
    Kept(Option<PinAction>),
}

impl PinState {
    /// Replaces the read-ahead list: cancels entries no longer named, then starts the
    /// next read if the disk is idle.
    pub fn read_ahead(&mut self, blocks: &[BlockId]) -> Vec<PinAction> {
        let mut actions = Vec::new();
        if self.plan.chunked {
            return actions;
        }
        self.ahead_list = blocks.to_vec();
        let mut index = 0;
        while index < self.ahead.len() {
            let entry = &mut self.ahead[index];
            if entry.wanted || blocks.contains(&entry.block) {
                index += 1;
                continue;
            }
            if entry.failed {
                self.ahead.remove(index);
                continue;
            }
            if entry.cancelled {
                index += 1;
                continue;
            }
            match entry.buffer.take() {
                Some(buffer) => {
                    let block = self.ahead.remove(index).block;
                    actions.extend(self.give_back(block, buffer, BufferHome::Staging, false));
                }
                None => {
                    entry.cancelled = true;
                    index += 1;
                }
            }
            self.count(ReadAheadOutcome::Dropped);
        }
        actions.extend(self.next_read_ahead());
        actions
    }

    /// Starts one read-ahead read, nearest block first, when the disk is idle: no read
    /// for a request and no other read-ahead in flight (a read-ahead must never slow a
    /// block the allocator waits for), no request waiting for a buffer, and a second
    /// staging buffer still idle for the next request.
    pub fn next_read_ahead(&mut self) -> Option<PinAction> {
        let busy = self.request_reads > 0
            || self.ahead.iter().any(Entry::in_flight)
            || !self.waiting_for_staging.is_empty()
            || self.staging_free.len() < 2;
        if busy || self.plan.chunked {
            return None;
        }
        let block = self.ahead_list.iter().copied().find(|&block| {
            self.block_bytes[block.index()] <= self.plan.staging_buffer_bytes
                && !self.plan.is_cached(block)
                && !self.ahead.iter().any(|entry| entry.block == block)
        })?;
        let buffer = self.staging_free.pop()?;
        self.ahead.push(Entry {
            block,
            buffer: None,
            wanted: false,
            cancelled: false,
            failed: false,
        });
        Some(PinAction::Read {
            block,
            buffer,
            home: BufferHome::Ahead,
        })
    }

    /// A read for a request (not a read-ahead) landed or failed.
    pub fn request_read_done(&mut self) {
        self.request_reads = self.request_reads.saturating_sub(1);
    }

    /// The allocator asks for `block`: `Some(Ready)` if its read-ahead landed, `None`
    /// with the request remembered if the read is in flight, or `Err(())` when no
    /// read-ahead holds it.
    pub(super) fn take_ahead(&mut self, block: BlockId) -> Result<Option<PinAction>, ()> {
        let index = self
            .ahead
            .iter()
            .position(|entry| entry.block == block && !entry.cancelled)
            .ok_or(())?;
        if self.ahead[index].failed {
            self.ahead.remove(index);
            return Err(());
        }
        if self.ahead[index].buffer.is_none() {
            self.ahead[index].wanted = true;
            return Ok(None);
        }
        let entry = self.ahead.remove(index);
        self.count(ReadAheadOutcome::Used);
        Ok(entry.buffer.map(|buffer| PinAction::Ready {
            block,
            buffer,
            home: BufferHome::Staging,
        }))
    }

    /// A read-ahead read finished (`succeeded`) or failed.
    pub fn ahead_done(&mut self, block: BlockId, buffer: HostBuffer, succeeded: bool) -> AheadDone {
        let Some(index) = self
            .ahead
            .iter()
            .position(|entry| entry.block == block && entry.in_flight())
        else {
            return AheadDone::Kept(self.give_back(block, buffer, BufferHome::Staging, false));
        };
        let entry = &mut self.ahead[index];
        if entry.wanted {
            self.ahead.remove(index);
            if succeeded {
                self.count(ReadAheadOutcome::Used);
                return AheadDone::Wanted(PinAction::Ready {
                    block,
                    buffer,
                    home: BufferHome::Staging,
                });
            }
            self.count(ReadAheadOutcome::Failed);
            return AheadDone::Failed(self.give_back(block, buffer, BufferHome::Staging, false));
        }
        if entry.cancelled {
            self.ahead.remove(index);
            return AheadDone::Kept(self.give_back(block, buffer, BufferHome::Staging, false));
        }
        if !succeeded {
            entry.failed = true;
            self.count(ReadAheadOutcome::Failed);
            return AheadDone::Kept(self.give_back(block, buffer, BufferHome::Staging, false));
        }
        entry.buffer = Some(buffer);
        AheadDone::Kept(None)
    }

    /// Drain: buffers of landed read-aheads go back to the ring; reads in flight are
    /// cancelled and come back through [`PinState::ahead_done`].
    pub fn cancel_read_ahead(&mut self) -> Vec<PinAction> {
        let mut actions = Vec::new();
        let entries = std::mem::take(&mut self.ahead);
        for mut entry in entries.into_iter().filter(|entry| !entry.failed) {
            if !entry.cancelled {
                self.count(ReadAheadOutcome::Dropped);
            }
            match entry.buffer.take() {
                Some(buffer) => {
                    actions.extend(self.give_back(entry.block, buffer, BufferHome::Staging, false))
                }
                None => {
                    entry.cancelled = true;
                    self.ahead.push(entry);
                }
            }
        }
        actions
    }

    fn count(&mut self, outcome: ReadAheadOutcome) {
        self.ahead_outcomes[outcome.index()] += 1;
    }

    /// Read-aheads per outcome (in [`ReadAheadOutcome::ALL`] order) since the last call.
    pub fn take_read_ahead_outcomes(&mut self) -> [u64; 3] {
        std::mem::take(&mut self.ahead_outcomes)
    }

    #[cfg(test)]
    /// Read-ahead reads in flight or landed and not yet asked for.
    pub fn read_ahead_blocks(&self) -> usize {
        self.ahead.len()
    }
}
