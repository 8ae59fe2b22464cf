//! The pin manager's decisions: which blocks keep a pinned copy, the staging ring, and
//! the pin work deferred to sync points. A plain state machine; the actor in
//! [`crate::pin_manager`] performs the reads and registrations it asks for.
//!
//! Registering or freeing pinned memory forces a device synchronisation, so doing it in
//! the middle of a block stalls copies in flight. Requests therefore never register:
//! a block planned for the pinned cache that has no buffer yet goes through a staging
//! buffer this time, and its registration is queued for the next sync point — a block
//! boundary where compute waits anyway.

use std::collections::VecDeque;

use crate::host_buffer::HostBuffer;
use crate::layout::BlockId;
use crate::plan::{PinPlan, StepOrder};

/// Where a pinned buffer handed out for a copy must go back to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferHome {
    Cache,
    Staging,
    /// A fast-disk ring buffer carrying bytes `offset..` of a block on to VRAM, for
    /// the block's stream number `stream` (a block can be streamed again while chunks
    /// of a failed earlier stream are still in flight; they must not be counted as the
    /// new one's).
    Chunk {
        offset: u64,
        stream: u64,
    },
    /// A staging buffer filled by disk read-ahead, before the allocator asked.
    Ahead,
}

/// What the actor must do for a request.
#[derive(Debug)]
pub enum PinAction {
    /// The bytes are already pinned: copy from this buffer.
    Ready {
        block: BlockId,
        buffer: HostBuffer,
        home: BufferHome,
    },
    /// Read the block from disk into this buffer, then hand it out.
    Read {
        block: BlockId,
        buffer: HostBuffer,
        home: BufferHome,
    },
    /// Fast disk: stream the block from disk through the chunk ring straight to VRAM.
    Stream { block: BlockId },
}

enum CacheSlot {
    Empty,
    /// Registered; `None` while lent out for a copy or a read.
    Held {
        buffer: Option<HostBuffer>,
        filled: bool,
    },
}

pub struct PinState {
    block_bytes: Vec<u64>,
    order: StepOrder,
    plan: PinPlan,
    ceiling_bytes: u64,
    cache: Vec<CacheSlot>,
    cache_bytes: u64,
    staging_free: Vec<HostBuffer>,
    staging_bytes: u64,
    waiting_for_staging: VecDeque<BlockId>,
    pending_register: Vec<BlockId>,
    /// Disk read-ahead into idle staging buffers (bounded by the ring): the reads in
    /// flight or landed, the allocator's latest list, and reads for requests in flight.
    ahead: Vec<read_ahead::Entry>,
    ahead_list: Vec<BlockId>,
    request_reads: usize,
    /// Read-aheads used, dropped and failed since the actor last reported them.
    ahead_outcomes: [u64; 3],
    /// Pinned bytes lent to the LoRA offloader for adapter factors (its own set).
    lora_bytes: u64,
    /// How many positions ahead of the cursor a sync point registers planned buffers.
    lookahead: usize,
    peak_used_bytes: u64,
}

impl PinState {
    pub fn new(
        block_bytes: Vec<u64>,
        order: StepOrder,
        plan: PinPlan,
        ceiling_bytes: u64,
        lookahead: usize,
    ) -> Self {
        let block_count = block_bytes.len();
        Self {
            block_bytes,
            order,
            plan,
            ceiling_bytes,
            cache: (0..block_count).map(|_| CacheSlot::Empty).collect(),
            cache_bytes: 0,
            staging_free: Vec::new(),
            staging_bytes: 0,
            waiting_for_staging: VecDeque::new(),
            pending_register: Vec::new(),
            ahead: Vec::new(),
            ahead_list: Vec::new(),
            request_reads: 0,
            ahead_outcomes: [0; 3],
            lora_bytes: 0,
            lookahead,
            peak_used_bytes: 0,
        }
    }

    #[cfg(test)]
    pub fn plan(&self) -> &PinPlan {
        &self.plan
    }

    pub fn ceiling_bytes(&self) -> u64 {
        self.ceiling_bytes
    }

    /// A free ring buffer for the next fast-disk chunk.
    pub fn take_chunk_buffer(&mut self) -> Option<HostBuffer> {
        self.staging_free.pop()
    }

    pub fn used_bytes(&self) -> u64 {
        self.cache_bytes + self.staging_bytes + self.lora_bytes
    }

    pub fn lora_bytes(&self) -> u64 {
        self.lora_bytes
    }

    /// Makes room for `bytes` of LoRA factors under the ceiling: the pinned cache of
    /// model blocks gives way (cache buffers not lent out, latest in the step order
    /// first; they stream through staging from now on, or come back at a sync point
    /// when room returns). Returns the cache buffers to unregister, or the room there
    /// is when even that is not enough.
    pub fn reserve_lora(&mut self, bytes: u64) -> Result<Vec<HostBuffer>, u64> {
        let freeable: u64 = self
            .cache
            .iter()
            .map(|slot| match slot {
                CacheSlot::Held {
                    buffer: Some(buffer),
                    ..
                } => buffer.len() as u64,
                _ => 0,
            })
            .sum();
        let floor = self.used_bytes() - freeable;
        if floor + bytes > self.ceiling_bytes {
            return Err(self.ceiling_bytes.saturating_sub(floor));
        }
        let mut freed = Vec::new();
        for position in (0..self.order.len()).rev() {
            if self.used_bytes() + bytes <= self.ceiling_bytes {
                break;
            }
            let slot = &mut self.cache[self.order.at(position).index()];
            if matches!(
                slot,
                CacheSlot::Held {
                    buffer: Some(_),
                    ..
                }
            ) {
                if let CacheSlot::Held {
                    buffer: Some(buffer),
                    ..
                } = std::mem::replace(slot, CacheSlot::Empty)
                {
                    self.cache_bytes -= buffer.len() as u64;
                    freed.push(buffer);
                }
            }
        }
        self.lora_bytes += bytes;
        self.record();
        Ok(freed)
    }

    pub fn release_lora(&mut self, bytes: u64) {
        self.lora_bytes = self.lora_bytes.saturating_sub(bytes);
    }

    pub fn cache_bytes(&self) -> u64 {
        self.cache_bytes
    }

    pub fn staging_bytes(&self) -> u64 {
        self.staging_bytes
    }

    pub fn cached_blocks(&self) -> u64 {
        self.cache
            .iter()
            .filter(|slot| matches!(slot, CacheSlot::Held { .. }))
            .count() as u64
    }

    fn record(&mut self) {
        let used = self.used_bytes();
        assert!(
            used <= self.ceiling_bytes,
            "pinned {used} bytes exceeds the pin ceiling {}",
            self.ceiling_bytes
        );
        self.peak_used_bytes = self.peak_used_bytes.max(used);
    }

    /// Adds a staging buffer the actor allocated at start.
    pub fn add_staging(&mut self, buffer: HostBuffer) {
        self.staging_bytes += buffer.len() as u64;
        self.staging_free.push(buffer);
        self.record();
    }

    /// The staging ring the plan asks for, not yet allocated.
    pub fn staging_wanted(&self) -> Option<u64> {
        let allocated = self.staging_bytes / self.plan.staging_buffer_bytes.max(1);
        (allocated < u64::from(self.plan.staging_buffers)).then_some(self.plan.staging_buffer_bytes)
    }

    /// The allocator needs the block's bytes pinned.
    pub fn request(&mut self, block: BlockId) -> Option<PinAction> {
        if let CacheSlot::Held { buffer, filled } = &mut self.cache[block.index()] {
            if let Some(buffer) = buffer.take() {
                let home = BufferHome::Cache;
                if *filled {
                    return Some(PinAction::Ready {
                        block,
                        buffer,
                        home,
                    });
                }
                self.request_reads += 1;
                return Some(PinAction::Read {
                    block,
                    buffer,
                    home,
                });
            }
        } else if self.plan.is_cached(block) && !self.pending_register.contains(&block) {
            self.pending_register.push(block);
        }
        // Fast disk streams every uncached block in chunks; whole-block staging does so
        // only for a block larger than its buffers (one kept resident, loaded once).
        if self.plan.chunked || self.block_bytes[block.index()] > self.plan.staging_buffer_bytes {
            return Some(PinAction::Stream { block });
        }
        if let Ok(action) = self.take_ahead(block) {
            return action;
        }
        match self.staging_free.pop() {
            Some(buffer) => {
                self.request_reads += 1;
                Some(PinAction::Read {
                    block,
                    buffer,
                    home: BufferHome::Staging,
                })
            }
            None => {
                self.waiting_for_staging.push_back(block);
                None
            }
        }
    }

    /// A read into a cache buffer finished: its bytes stay valid.
    pub fn filled(&mut self, block: BlockId) {
        if let CacheSlot::Held { filled, .. } = &mut self.cache[block.index()] {
            *filled = true;
        }
    }

    /// A buffer came back from a copy (or a failed read). Returns the action for a
    /// request that was waiting for a staging buffer, if any.
    pub fn give_back(
        &mut self,
        block: BlockId,
        buffer: HostBuffer,
        home: BufferHome,
        bytes_valid: bool,
    ) -> Option<PinAction> {
        match home {
            BufferHome::Cache => {
                if let CacheSlot::Held {
                    buffer: slot,
                    filled,
                } = &mut self.cache[block.index()]
                {
                    *slot = Some(buffer);
                    *filled &= bytes_valid;
                }
                None
            }
            // Chunk and whole-block staging share one ring: a waiting whole-block request
            // gets the buffer first; otherwise it goes back for the next chunk.
            BufferHome::Chunk { .. } | BufferHome::Staging | BufferHome::Ahead => {
                let waiting = self.waiting_for_staging.pop_front();
                match waiting {
                    Some(next) => {
                        self.request_reads += 1;
                        Some(PinAction::Read {
                            block: next,
                            buffer,
                            home: BufferHome::Staging,
                        })
                    }
                    None => {
                        self.staging_free.push(buffer);
                        None
                    }
                }
            }
        }
    }

    /// Sync point at `cursor`: which planned blocks to register now — those queued by
    /// requests and those coming up within the lookahead — within the ceiling.
    pub fn registrations_due(&mut self, cursor: usize) -> Vec<(BlockId, u64)> {
        let mut due: Vec<BlockId> = std::mem::take(&mut self.pending_register);
        for step in 0..self.lookahead.min(self.order.len()) {
            let block = self.order.at(cursor + step);
            if self.plan.is_cached(block) && !due.contains(&block) {
                due.push(block);
            }
        }
        let mut room = self.ceiling_bytes.saturating_sub(self.used_bytes());
        let mut granted = Vec::new();
        for block in due {
            let bytes = self.block_bytes[block.index()];
            if matches!(self.cache[block.index()], CacheSlot::Empty) && bytes <= room {
                room -= bytes;
                granted.push((block, bytes));
            }
        }
        granted
    }

    /// The actor registered a cache buffer for `block`.
    pub fn registered(&mut self, block: BlockId, buffer: HostBuffer) {
        self.cache_bytes += buffer.len() as u64;
        self.cache[block.index()] = CacheSlot::Held {
            buffer: Some(buffer),
            filled: false,
        };
        self.record();
    }

    /// Takes back every buffer not lent out, for unregistration at shutdown.
    /// Returns the buffers and how many of them were cache buffers.
    pub fn release_all(&mut self) -> (Vec<HostBuffer>, u64) {
        let mut buffers = Vec::new();
        for buffer in self.staging_free.drain(..) {
            self.staging_bytes -= buffer.len() as u64;
            buffers.push(buffer);
        }
        let mut cache_buffers = 0;
        for slot in &mut self.cache {
            let taken = match slot {
                CacheSlot::Held { buffer, .. } => buffer.take(),
                CacheSlot::Empty => None,
            };
            if let Some(buffer) = taken {
                self.cache_bytes -= buffer.len() as u64;
                buffers.push(buffer);
                cache_buffers += 1;
                *slot = CacheSlot::Empty;
            }
        }
        (buffers, cache_buffers)
    }

    /// Buffers lent out (reads or copies in flight).
    pub fn lent_out(&self) -> usize {
        let cache_out = self
            .cache
            .iter()
            .filter(|slot| matches!(slot, CacheSlot::Held { buffer: None, .. }))
            .count();
        let staging_total = (self.staging_bytes / self.plan.staging_buffer_bytes.max(1)) as usize;
        cache_out + staging_total.saturating_sub(self.staging_free.len())
    }
}

mod read_ahead;
mod resize;

pub use read_ahead::AheadDone;

#[cfg(test)]
#[path = "pin_state_tests.rs"]
mod tests;
