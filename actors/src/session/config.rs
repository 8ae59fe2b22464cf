//! What a session is asked to do with its budgets, and what it decided at start.

use crate::expert_cache::ExpertPolicy;
use crate::plan::{PinPlan, ResidencyPolicy, VramPlan};

/// How a session uses its budgets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionConfig {
    /// All the device memory the session may use: weights, the streaming ring, the
    /// expert cache, LoRA regions and activations. Allocated as one arena at start.
    pub vram_budget_bytes: u64,
    /// The most pinned host memory the session may hold: the pinned cache, LoRA
    /// pinned sets and (without `--fast-disk`) the staging ring.
    pub pin_ceiling_bytes: u64,
    /// Streamed blocks the allocator loads ahead of the compute position; the ring
    /// has `prefetch_depth + 1` slots. 0 loads each block only when it is asked for.
    pub prefetch_depth: u32,
    /// Pinned buffers in the staging ring uncached blocks are read through (2 at least).
    pub staging_buffers: u32,
    /// `--fast-disk`: stream blocks without a pinned copy through a ring of
    /// `staging_buffers` chunks of this size straight to VRAM. `None`: whole-block staging.
    pub fast_disk_chunk_bytes: Option<u64>,
    /// How both tiers choose what to keep: the planned resident set, or the LRU baseline.
    pub policy: ResidencyPolicy,
    /// Disk reads the disk reader runs at once (1 at least); the rest wait in its queue.
    pub max_reads_in_flight: usize,
    /// VRAM the compute side reserves for activations as the run starts (a decoder's
    /// first KV pages), inside `vram_budget_bytes`. The plan is made without it, so
    /// that first reservation finds room even where no resident block could give way
    /// (blocks too large for a ring slot stay resident); later growth evicts.
    pub activation_reserve_bytes: u64,
}

/// An expert cache for blocks outside the step order (MoE experts): `slots` slots of
/// `slot_bytes` each, carved out of the VRAM budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExpertConfig {
    /// Experts the cache holds at once.
    pub slots: u32,
    /// Bytes of one slot, aligned up in the area. Must be at least the largest expert
    /// block: nothing checks an expert against it.
    pub slot_bytes: u64,
    /// Which expert gives way when a slot is needed.
    pub policy: ExpertPolicy,
}

impl ExpertConfig {
    /// The cache's share of the VRAM budget: `slots` aligned slots.
    pub fn area_bytes(&self) -> u64 {
        u64::from(self.slots) * crate::arena::align_up(self.slot_bytes)
    }
}

/// What the session decided at start, for summaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionPlan {
    /// The VRAM split as planned at start (activation pressure may turn resident
    /// blocks into streamed ones later; the observer's `plan_streamed` says when).
    pub vram: VramPlan,
    /// The pinned split: which streamed blocks keep a pinned copy, and the ring.
    pub pins: PinPlan,
}
