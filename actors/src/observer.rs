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
    /// A read from a model file into a pinned buffer (a cache buffer or the staging
    /// ring); LoRA factors the loader read count here too.
    DiskToPinned,
    /// A copy from a pinned buffer to device memory on the copy stream.
    PinnedToVram,
    /// `--fast-disk`: read through the staging ring straight on to the device.
    DiskToVram,
}

impl Link {
    /// Every link, so a telemetry adapter can register one series per link up front.
    pub const ALL: [Link; 3] = [Link::DiskToPinned, Link::PinnedToVram, Link::DiskToVram];

    /// The `from` metric label: the tier the bytes leave.
    pub fn from_label(self) -> &'static str {
        match self {
            Link::DiskToPinned | Link::DiskToVram => "disk",
            Link::PinnedToVram => "pinned",
        }
    }

    /// The `to` metric label: the tier the bytes arrive in.
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
    /// Device memory, under the VRAM budget.
    Vram,
    /// Page-locked host memory, under the pin ceiling.
    Pinned,
}

impl Tier {
    /// Every tier, so a telemetry adapter can register one series per tier up front.
    pub const ALL: [Tier; 2] = [Tier::Vram, Tier::Pinned];

    /// The `tier` metric label.
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
    /// The model's own weights: the blocks of the layout.
    Model,
    /// LoRA adapters' factors, in the offloader's own accounting.
    Lora,
}

impl Owner {
    /// The `owner` metric label.
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
    /// A disk read failed (a request's or a read-ahead's).
    Read,
    /// A host-to-device copy failed (a block's, a chunk's or a LoRA pack's).
    Copy,
    /// Host memory could not be pinned (the staging ring, a cache buffer at a sync
    /// point, a LoRA pinned set). A cache buffer that fails is not fatal: the block
    /// keeps streaming through the ring.
    Pin,
    /// A reservation was refused for lack of room: activations or a LoRA region in
    /// VRAM, a LoRA pinned set under the ceiling.
    Budget,
    /// An actor got a message the protocol does not allow (a LoRA region released
    /// that was never reserved): a bug, counted instead of a panic.
    Protocol,
}

impl ErrorKind {
    /// Every kind, so a telemetry adapter can register one series per kind up front.
    pub const ALL: [ErrorKind; 5] = [
        ErrorKind::Read,
        ErrorKind::Copy,
        ErrorKind::Pin,
        ErrorKind::Budget,
        ErrorKind::Protocol,
    ];

    /// The `kind` metric label.
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
    /// Every outcome, in the order [`ReadAheadOutcome::index`] counts them.
    pub const ALL: [ReadAheadOutcome; 3] = [
        ReadAheadOutcome::Used,
        ReadAheadOutcome::Dropped,
        ReadAheadOutcome::Failed,
    ];

    /// Its place in [`ReadAheadOutcome::ALL`], for per-outcome counter arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `outcome` metric label.
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
    /// The model's blocks in the tier, at their unaligned sizes: VRAM, the blocks
    /// placed in the arena (ready or loading); pinned, the cache buffers registered
    /// for blocks (filled or not).
    pub model_bytes: u64,
    /// LoRA adapters' share: VRAM, their regions; pinned, their pinned sets.
    pub lora_bytes: u64,
    /// VRAM: activations reserved by the compute side; pinned: the staging ring.
    pub other_bytes: u64,
    /// The tier's budget: the whole VRAM budget; the pin ceiling (plus the staging
    /// ring beside it, with `--fast-disk`).
    pub budget_bytes: u64,
    /// The model's blocks counted in `model_bytes`.
    pub blocks: u64,
}

impl TierUsage {
    /// Everything the tier holds now: model, LoRA and other bytes.
    pub fn used_bytes(&self) -> u64 {
        self.model_bytes + self.lora_bytes + self.other_bytes
    }
}

/// Hits and misses of the compute thread, flushed once per step or batch.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct AcquireBatch {
    /// Acquires that found the block ready: no message, no wait.
    pub hits: u64,
    /// Acquires that had to ask for the block and wait for it.
    pub misses: u64,
    /// Time the compute thread spent waiting for blocks that were not ready.
    pub stall_seconds: f64,
}

/// A MoE step's expert acquires, by what the compute thread found: the expert ready
/// (a hit), on its way because a hint asked for it (late), or not asked for (a miss).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ExpertAcquires {
    /// Experts that were ready when the compute thread acquired them.
    pub hits: u64,
    /// Experts a hint had already asked for that were still not ready when acquired
    /// (the hint was right, but late): the compute thread waited for them.
    pub late: u64,
    /// Experts that were not ready and no hint had asked for: loaded on demand.
    pub misses: u64,
}

/// Receives pipeline events. Every method has a no-op default.
pub trait Observer: Send + Sync + 'static {
    /// One completed transfer of `bytes` over `link`, which took `seconds` from its
    /// start to its completion (0 for LoRA factors the loader read before attach).
    fn transfer(&self, _link: Link, _owner: Owner, _bytes: u64, _seconds: f64) {}
    /// The same transfer, with the block it carried (for traces). Called right after
    /// `transfer`; `seconds` ended now.
    fn block_transfer(&self, _link: Link, _block: BlockId, _bytes: u64, _seconds: f64) {}
    /// A block's `bytes` of the model landed in VRAM over `link` for `step` (counted
    /// from the session's start): the step that uses them, whenever the copy ran — a
    /// prefetch during step 3 for step 4 counts for step 4. Called after `transfer`.
    fn step_load(&self, _link: Link, _step: u64, _bytes: u64) {}
    /// A tier's occupancy after it changed (a load, an eviction, a reservation).
    fn tier_usage(&self, _tier: Tier, _usage: TierUsage) {}
    /// `blocks` left `tier` at once: evicted for room, given way to activations or
    /// LoRA, invalidated, or released at the drain.
    fn eviction(&self, _tier: Tier, _blocks: u64) {}
    /// One sync point at which the pin manager did `operations` pin registrations
    /// together (or the staging ring was pinned at start), instead of one stall each.
    fn pin_consolidation(&self, _operations: u64) {}
    /// The allocator declined a speculative load (prefetch or hint) because it would
    /// have evicted a block needed sooner: exhaustion prediction at work.
    fn speculative_declined(&self) {}
    /// Disk read-aheads that ended with `outcome` since the last report.
    fn read_ahead(&self, _outcome: ReadAheadOutcome, _blocks: u64) {}
    /// The compute thread's hits, misses and stall time since the last batch, once
    /// per step.
    fn acquires(&self, _batch: AcquireBatch) {}
    /// After each allocator decision: how many blocks of the order, from the compute
    /// position the allocator last heard of, are ready before the first that is not.
    fn prefetch_lead(&self, _blocks_ahead: u64) {}
    /// One step ended; `seconds` since the previous step ended (or the session
    /// started), as the compute thread measured it.
    fn step(&self, _seconds: f64) {}
    /// One failure of `kind`; the error itself goes to whoever waited on it.
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
    fn step_load(&self, link: Link, step: u64, bytes: u64) {
        self.0.step_load(link, step, bytes);
        self.1.step_load(link, step, bytes);
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
    fn step_load(&self, link: Link, step: u64, bytes: u64) {
        (**self).step_load(link, step, bytes)
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
