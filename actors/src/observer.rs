//! What the pipeline reports as it runs: the port the telemetry adapter plugs into.
//!
//! Actors call an [`Observer`] once per transfer, eviction, step or batch — never per
//! hot-path acquire. The session's own [`crate::Stats`] is an observer too, so the run
//! summary and the Prometheus counters are fed by the very same calls.

use serde::Serialize;

use crate::layout::BlockId;

/// A link bytes travel over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Link {
    DiskToPinned,
    PinnedToVram,
    /// `--fast-disk`: read through the staging ring straight on to the device.
    DiskToVram,
}

impl Link {
    pub const ALL: [Link; 3] = [Link::DiskToPinned, Link::PinnedToVram, Link::DiskToVram];

    pub fn from_label(self) -> &'static str {
        match self {
            Link::DiskToPinned | Link::DiskToVram => "disk",
            Link::PinnedToVram => "pinned",
        }
    }

    pub fn to_label(self) -> &'static str {
        match self {
            Link::DiskToPinned => "pinned",
            Link::PinnedToVram | Link::DiskToVram => "vram",
        }
    }
}

/// A memory tier with a budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Tier {
    Vram,
    Pinned,
}

impl Tier {
    pub const ALL: [Tier; 2] = [Tier::Vram, Tier::Pinned];

    pub fn label(self) -> &'static str {
        match self {
            Tier::Vram => "vram",
            Tier::Pinned => "pinned",
        }
    }
}

/// Whose bytes: the model's, or LoRA adapters' (counted apart so "loaded" never
/// exceeds the model size).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Owner {
    Model,
    Lora,
}

impl Owner {
    pub fn label(self) -> &'static str {
        match self {
            Owner::Model => "model",
            Owner::Lora => "lora",
        }
    }
}

/// Kinds of failure, as a low-cardinality label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ErrorKind {
    Read,
    Copy,
    Pin,
    Budget,
    Protocol,
}

impl ErrorKind {
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::Read,
        ErrorKind::Copy,
        ErrorKind::Pin,
        ErrorKind::Budget,
        ErrorKind::Protocol,
    ];

    pub fn label(self) -> &'static str {
        match self {
            ErrorKind::Read => "read",
            ErrorKind::Copy => "copy",
            ErrorKind::Pin => "pin",
            ErrorKind::Budget => "budget",
            ErrorKind::Protocol => "protocol",
        }
    }
}

/// What became of a disk read-ahead, as a low-cardinality label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ReadAheadOutcome {
    /// A request found the block already read (or on its way).
    Used,
    /// Dropped unused: the block left the list (it became resident) or the run ended.
    Dropped,
    /// The read failed; the request reads the block itself.
    Failed,
}

impl ReadAheadOutcome {
    pub const ALL: [ReadAheadOutcome; 3] = [
        ReadAheadOutcome::Used,
        ReadAheadOutcome::Dropped,
        ReadAheadOutcome::Failed,
    ];

    /// Its place in [`ReadAheadOutcome::ALL`], for per-outcome counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn label(self) -> &'static str {
        match self {
            ReadAheadOutcome::Used => "used",
            ReadAheadOutcome::Dropped => "dropped",
            ReadAheadOutcome::Failed => "failed",
        }
    }
}

/// Occupancy of one tier, reported whenever it changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct TierUsage {
    pub model_bytes: u64,
    pub lora_bytes: u64,
    /// VRAM: activations reserved by the compute side; pinned: the staging ring.
    pub other_bytes: u64,
    pub budget_bytes: u64,
    pub blocks: u64,
}

impl TierUsage {
    pub fn used_bytes(&self) -> u64 {
        self.model_bytes + self.lora_bytes + self.other_bytes
    }
}

/// Hits and misses of the compute thread, flushed once per step or batch.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct AcquireBatch {
    pub hits: u64,
    pub misses: u64,
    /// Time the compute thread spent waiting for blocks that were not ready.
    pub stall_seconds: f64,
}

/// A MoE step's expert acquires, by what the compute thread found: the expert ready
/// (a hit), on its way because a hint asked for it (late), or not asked for (a miss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ExpertAcquires {
    pub hits: u64,
    pub late: u64,
    pub misses: u64,
}

/// Receives pipeline events. Every method has a no-op default.
pub trait Observer: Send + Sync + 'static {
    fn transfer(&self, _link: Link, _owner: Owner, _bytes: u64, _seconds: f64) {}
    /// The same transfer, with the block it carried (for traces). Called right after
    /// `transfer`; `seconds` ended now.
    fn block_transfer(&self, _link: Link, _block: BlockId, _bytes: u64, _seconds: f64) {}
    fn tier_usage(&self, _tier: Tier, _usage: TierUsage) {}
    fn eviction(&self, _tier: Tier, _blocks: u64) {}
    fn pin_consolidation(&self, _operations: u64) {}
    fn speculative_declined(&self) {}
    /// Disk read-aheads that ended with `outcome` since the last report.
    fn read_ahead(&self, _outcome: ReadAheadOutcome, _blocks: u64) {}
    fn acquires(&self, _batch: AcquireBatch) {}
    fn prefetch_lead(&self, _blocks_ahead: u64) {}
    fn step(&self, _seconds: f64) {}
    fn error(&self, _kind: ErrorKind) {}
    /// The bytes the plan copies to VRAM per step now: at the start, and again each
    /// time resident blocks give way (to activations, or to LoRA regions).
    fn plan_streamed(&self, _bytes_per_step: u64) {}
    /// Resident blocks that gave way to an activation reservation (a growing KV cache).
    fn activations_displaced(&self, _blocks: u64) {}
    /// Reported by the run loop after each MoE step.
    fn expert_acquires(&self, _acquires: ExpertAcquires) {}
}

/// An observer that forwards to two others.
pub struct Tee<A, B>(pub A, pub B);

impl<A: Observer, B: Observer> Observer for Tee<A, B> {
    fn transfer(&self, link: Link, owner: Owner, bytes: u64, seconds: f64) {
        self.0.transfer(link, owner, bytes, seconds);
        self.1.transfer(link, owner, bytes, seconds);
    }
    fn block_transfer(&self, link: Link, block: BlockId, bytes: u64, seconds: f64) {
        self.0.block_transfer(link, block, bytes, seconds);
        self.1.block_transfer(link, block, bytes, seconds);
    }
    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        self.0.tier_usage(tier, usage);
        self.1.tier_usage(tier, usage);
    }
    fn eviction(&self, tier: Tier, blocks: u64) {
        self.0.eviction(tier, blocks);
        self.1.eviction(tier, blocks);
    }
    fn pin_consolidation(&self, operations: u64) {
        self.0.pin_consolidation(operations);
        self.1.pin_consolidation(operations);
    }
    fn speculative_declined(&self) {
        self.0.speculative_declined();
        self.1.speculative_declined();
    }
    fn read_ahead(&self, outcome: ReadAheadOutcome, blocks: u64) {
        self.0.read_ahead(outcome, blocks);
        self.1.read_ahead(outcome, blocks);
    }
    fn acquires(&self, batch: AcquireBatch) {
        self.0.acquires(batch);
        self.1.acquires(batch);
    }
    fn prefetch_lead(&self, blocks_ahead: u64) {
        self.0.prefetch_lead(blocks_ahead);
        self.1.prefetch_lead(blocks_ahead);
    }
    fn step(&self, seconds: f64) {
        self.0.step(seconds);
        self.1.step(seconds);
    }
    fn error(&self, kind: ErrorKind) {
        self.0.error(kind);
        self.1.error(kind);
    }
    fn plan_streamed(&self, bytes_per_step: u64) {
        self.0.plan_streamed(bytes_per_step);
        self.1.plan_streamed(bytes_per_step);
    }
    fn activations_displaced(&self, blocks: u64) {
        self.0.activations_displaced(blocks);
        self.1.activations_displaced(blocks);
    }
    fn expert_acquires(&self, acquires: ExpertAcquires) {
        self.0.expert_acquires(acquires);
        self.1.expert_acquires(acquires);
    }
}

/// Ignores everything.
pub struct NoObserver;

impl Observer for NoObserver {}

impl<T: Observer + ?Sized> Observer for std::sync::Arc<T> {
    fn transfer(&self, link: Link, owner: Owner, bytes: u64, seconds: f64) {
        (**self).transfer(link, owner, bytes, seconds)
    }
    fn block_transfer(&self, link: Link, block: BlockId, bytes: u64, seconds: f64) {
        (**self).block_transfer(link, block, bytes, seconds)
    }
    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        (**self).tier_usage(tier, usage)
    }
    fn eviction(&self, tier: Tier, blocks: u64) {
        (**self).eviction(tier, blocks)
    }
    fn pin_consolidation(&self, operations: u64) {
        (**self).pin_consolidation(operations)
    }
    fn speculative_declined(&self) {
        (**self).speculative_declined()
    }
    fn read_ahead(&self, outcome: ReadAheadOutcome, blocks: u64) {
        (**self).read_ahead(outcome, blocks)
    }
    fn acquires(&self, batch: AcquireBatch) {
        (**self).acquires(batch)
    }
    fn prefetch_lead(&self, blocks_ahead: u64) {
        (**self).prefetch_lead(blocks_ahead)
    }
    fn step(&self, seconds: f64) {
        (**self).step(seconds)
    }
    fn error(&self, kind: ErrorKind) {
        (**self).error(kind)
    }
    fn plan_streamed(&self, bytes_per_step: u64) {
        (**self).plan_streamed(bytes_per_step)
    }
    fn activations_displaced(&self, blocks: u64) {
        (**self).activations_displaced(blocks)
    }
    fn expert_acquires(&self, acquires: ExpertAcquires) {
        (**self).expert_acquires(acquires)
    }
}
