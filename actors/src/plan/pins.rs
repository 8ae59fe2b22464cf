//! The pinned tier's plan: which of the blocks VRAM streams keep a pinned copy, and
//! the staging ring the others are read through. It follows the VRAM plan (only
//! streamed blocks need a pinned copy) and ranks blocks by the same max-scatter
//! priority.

use super::{keep_by_priority, Bytes, PlanError, StepOrder, VramPlan};
use crate::layout::{BlockId, ModelLayout};

/// How blocks without a pinned copy reach VRAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// Each is read whole into one of `buffers` block-sized pinned buffers, then copied.
    /// The ring counts against the pin ceiling.
    WholeBlocks {
        /// Staging buffers in the ring (2 at least), each the size of a ring slot.
        buffers: u32,
    },
    /// `--fast-disk`: read in `buffer_bytes` chunks through a ring of `buffers` pinned
    /// buffers and copied on to VRAM chunk by chunk, so a block never needs a full
    /// pinned copy. The ring is allocated beside the pin ceiling, which the cache keeps.
    Chunks {
        /// Staging buffers in the ring (2 at least).
        buffers: u32,
        /// The size of each buffer: one chunk of a read (`staging_buffer_size`).
        buffer_bytes: u64,
    },
}

/// The pinned tier's split: which streamed blocks keep a pinned copy, and the staging ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinPlan {
    /// Per block: keeps a pinned copy, so it is not read from disk every step. Only
    /// blocks VRAM streams are cached; resident ones need no pinned copy.
    pub cached: Vec<bool>,
    /// The cached blocks' bytes, together (unaligned).
    pub cached_bytes: u64,
    /// Buffers in the staging ring.
    pub staging_buffers: u32,
    /// The size of each: a VRAM ring slot for whole-block staging, the chunk size with
    /// `--fast-disk`.
    pub staging_buffer_bytes: u64,
    /// Chunked fast-disk streaming (the ring sits beside the ceiling, not under it).
    pub chunked: bool,
    /// Bytes read from disk every steady-state step.
    pub disk_bytes_per_step: u64,
}

impl PinPlan {
    /// The staging ring's pinned bytes: `staging_buffers × staging_buffer_bytes`.
    pub fn staging_bytes(&self) -> u64 {
        u64::from(self.staging_buffers) * self.staging_buffer_bytes
    }

    /// Whether the plan keeps a pinned copy of `block`; false for an unknown block.
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.cached.get(block.index()).copied().unwrap_or(false)
    }

    /// Among the blocks VRAM streams, keeps pinned copies of as many as the ceiling
    /// allows after the staging ring, by the same max-scatter priority.
    pub fn new(
        layout: &ModelLayout,
        order: &StepOrder,
        vram: &VramPlan,
        pin_ceiling_bytes: u64,
        staging: Staging,
    ) -> Result<Self, PlanError> {
        let block_bytes: Vec<u64> = layout.blocks.iter().map(|block| block.bytes).collect();
        // Whole-block staging buffers hold the largest streamed block; a resident block
        // too large for them is loaded once in chunks through the same buffers.
        let largest = vram.slot_bytes;
        let (staging_buffers, staging_buffer_bytes, chunked) = match staging {
            Staging::WholeBlocks { buffers } => (buffers, largest, false),
            Staging::Chunks {
                buffers,
                buffer_bytes,
            } => (buffers, buffer_bytes, true),
        };
        let staging_bytes = staging_buffer_bytes * u64::from(staging_buffers);
        let cache_room = if chunked {
            pin_ceiling_bytes
        } else {
            pin_ceiling_bytes.saturating_sub(staging_bytes)
        };
        if (!chunked && pin_ceiling_bytes < staging_bytes)
            || staging_buffers < 2
            || staging_buffer_bytes == 0
        {
            return Err(PlanError::PinCeilingTooSmall {
                ceiling: Bytes(pin_ceiling_bytes),
                needed: Bytes(staging_bytes.max(2 * staging_buffer_bytes)),
                largest: Bytes(staging_buffer_bytes),
                buffers: staging_buffers.max(2),
            });
        }
        let streamed = |block: BlockId| !vram.is_resident(block);
        let kept = keep_by_priority(order, &block_bytes, cache_room, streamed);
        let mut cached = vec![false; block_bytes.len()];
        let mut cached_bytes = 0;
        for block in kept {
            cached[block.index()] = true;
            cached_bytes += block_bytes[block.index()];
        }
        // Blocks acquired on demand (MoE experts) are not in the order, so its
        // priority never reaches them. With room left after every ordered block, keep
        // them too, in index order: otherwise each expert miss reads the disk again
        // (measured before: a Mixtral bench read all 66 MiB it copied per token from
        // disk with a 20 GiB ceiling over a 424 MiB model).
        for (index, &bytes) in block_bytes.iter().enumerate() {
            let block = BlockId(index as u32);
            if !cached[index]
                && streamed(block)
                && !order.contains(block)
                && cached_bytes + bytes <= cache_room
            {
                cached[index] = true;
                cached_bytes += bytes;
            }
        }
        let disk_bytes_per_step = order
            .blocks()
            .iter()
            .filter(|block| streamed(**block) && !cached[block.index()])
            .map(|block| block_bytes[block.index()])
            .sum();
        Ok(Self {
            cached,
            cached_bytes,
            staging_buffers,
            staging_buffer_bytes,
            chunked,
            disk_bytes_per_step,
        })
    }
}
