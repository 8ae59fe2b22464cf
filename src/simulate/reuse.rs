//! Which uses of a block were served by the copy that served its previous use.
//!
//! A simulated run counts the bytes each block receives in VRAM (from the actors' own
//! `block_transfer` reports) and, at every acquire, whether any arrived since the
//! block's previous acquire. None arrived: the block stayed in VRAM for a whole cycle
//! and this use cost no copy. That is what a resident block does every step; a
//! streamed block does it only when the ring happens to keep it (the cold step fills
//! empty slots, so its first streamed block can still be there when step 1 begins).
//! Without this, "bytes to VRAM over a run" cannot be checked exactly against the
//! plan: the plan describes a steady step, and the cold step's hand-over is not one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stagehand_actors::{BlockId, Link, Observer};

/// VRAM bytes received per block, fed by the pipeline's observer calls.
pub(super) struct VramBytesPerBlock {
    bytes: Vec<AtomicU64>,
}

impl VramBytesPerBlock {
    pub(super) fn new(blocks: usize) -> Arc<Self> {
        Arc::new(Self {
            bytes: (0..blocks).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn received(&self, block: BlockId) -> u64 {
        self.bytes
            .get(block.index())
            .map_or(0, |bytes| bytes.load(Ordering::Relaxed))
    }
}

impl Observer for VramBytesPerBlock {
    fn block_transfer(&self, link: Link, block: BlockId, bytes: u64, _seconds: f64) {
        if !matches!(link, Link::PinnedToVram | Link::DiskToVram) {
            return;
        }
        if let Some(counter) = self.bytes.get(block.index()) {
            counter.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

/// Per step: the bytes of blocks whose use needed no copy since their previous use.
pub(super) struct ReuseLedger {
    received: Arc<VramBytesPerBlock>,
    block_bytes: Vec<u64>,
    /// Per block: what it had received at its previous acquire (`None`: never used).
    at_previous_use: Vec<Option<u64>>,
    per_step: Vec<u64>,
}

impl ReuseLedger {
    pub(super) fn new(received: Arc<VramBytesPerBlock>, block_bytes: Vec<u64>) -> Self {
        Self {
            received,
            at_previous_use: vec![None; block_bytes.len()],
            block_bytes,
            per_step: Vec::new(),
        }
    }

    /// The compute side acquired `block` in `step`: its bytes are in VRAM.
    pub(super) fn used(&mut self, step: u64, block: BlockId) {
        let step = step as usize;
        if self.per_step.len() <= step {
            self.per_step.resize(step + 1, 0);
        }
        let received = self.received.received(block);
        let Some(previous) = self.at_previous_use.get_mut(block.index()) else {
            return;
        };
        if *previous == Some(received) {
            self.per_step[step] += self.block_bytes[block.index()];
        }
        *previous = Some(received);
    }

    pub(super) fn into_per_step(self) -> Vec<u64> {
        self.per_step
    }
}
