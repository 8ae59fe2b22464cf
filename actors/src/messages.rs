//! The message protocol between the compute thread and the actors.
//!
//! Mailbox bounds. The protocol bounds every queue: the compute thread has at most one
//! miss outstanding and at most `ring_slots` streamed releases in flight; the allocator
//! has at most `depth + 1` loads per scheduling pass and never more loads in flight
//! than arena places; every read, copy and completion carries one pinned buffer, and
//! the pin manager has at most `blocks + staging_buffers` of them; the disk reader runs
//! at most `max_reads_in_flight` reads and queues the rest (one per buffer at most).
//! Each mailbox's capacity is set from those figures at start (`session::prepare`),
//! and every send checks it (`mailbox`), in release builds too: between actors a full
//! mailbox is a broken protocol (the actor system stops rather than grow the queue),
//! from the compute thread it is back-pressure (the thread waits for room), and a
//! speculative hint is dropped.

use actix::prelude::*;

use crate::device::DevicePtr;
use crate::error::SessionError;
use crate::host_buffer::HostBuffer;
use crate::layout::{BlockId, Extent};
use crate::observer::AcquireBatch;
use crate::pin_state::BufferHome;

pub type Reply<T> = flume::Sender<T>;

// Compute thread → ComputeStream.

/// The compute thread needs `block` (at `position`, counted from the session's start
/// across steps) and it is not ready.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Miss {
    pub block: BlockId,
    pub position: usize,
    pub reply: Reply<Result<(), SessionError>>,
}

/// The compute thread released a streamed block: its ring slot may be reused.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseStreamed {
    pub block: BlockId,
    pub position: usize,
}

/// The step under way (or about to begin) is the run's last: no load starts for a
/// position at or past `end` (counted as [`Miss::position`]), so nothing is copied
/// for a step that never comes. A demand past it (the run went on after all) lifts it.
#[derive(Message, Debug, Clone, Copy)]
#[rtype(result = "()")]
pub struct LastStep {
    pub end: usize,
}

/// End of a step, with the hits and misses batched since the last one.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StepDone {
    pub batch: AcquireBatch,
    pub step_seconds: f64,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct ReserveActivations {
    pub bytes: u64,
    /// The resident blocks that gave way (they stream from now on).
    pub reply: Reply<Result<Vec<BlockId>, SessionError>>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseActivations {
    pub bytes: u64,
}

/// Drain every actor, release every budget, then stop.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown {
    pub reply: Reply<()>,
}

// ComputeStream → VramAllocator.

#[derive(Message)]
#[rtype(result = "()")]
pub struct Demand {
    pub block: BlockId,
    pub position: usize,
    pub reply: Reply<Result<(), SessionError>>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Released {
    pub block: BlockId,
    pub position: usize,
}

/// Finish what is in flight, free everything, then answer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain {
    pub reply: Reply<()>,
}

// VramAllocator ↔ PinManager.

#[derive(Message)]
#[rtype(result = "()")]
pub struct EnsurePinned {
    pub block: BlockId,
    /// Where the block goes in VRAM, for fast-disk streaming straight there.
    pub destination: DevicePtr,
}

/// The streamed blocks due after the prefetch window, nearest first: read them from
/// disk into idle staging buffers now, so the disk is not idle while the ring is full.
/// Replaces the previous list.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReadAhead {
    pub blocks: Vec<BlockId>,
}

/// Fast disk: the block has been streamed into its VRAM place chunk by chunk.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Streamed {
    pub block: BlockId,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Pinned {
    pub block: BlockId,
    pub buffer: HostBuffer,
    pub home: BufferHome,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct PinFailed {
    pub block: BlockId,
    pub error: SessionError,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct ReturnBuffer {
    pub block: BlockId,
    pub buffer: HostBuffer,
    pub home: BufferHome,
}

/// A block boundary where compute waits anyway: do the deferred pin work now.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SyncPoint {
    pub cursor: usize,
}

// PinManager ↔ DiskReader.

#[derive(Message)]
#[rtype(result = "()")]
pub struct ReadBlock {
    pub block: BlockId,
    pub extents: Vec<Extent>,
    pub buffer: HostBuffer,
    pub home: BufferHome,
    pub reply_to: Recipient<ReadDone>,
}

/// These extents now live in the pinned cache; their page-cache copy may go.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ForgetCached {
    pub extents: Vec<Extent>,
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct ReadDone {
    pub block: BlockId,
    pub home: BufferHome,
    pub buffer: HostBuffer,
    pub bytes: u64,
    pub seconds: f64,
    pub error: Option<crate::error::ReadFault>,
}

// LoraOffloader ↔ VramAllocator and PinManager, and the compute thread → VramAllocator.

/// Place a VRAM region of `bytes` for an adapter's factor slots, counted as LoRA bytes
/// apart from the model's (evicts resident weights if needed, like activations).
/// Answers the region's device address.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReserveLora {
    pub bytes: u64,
    pub reply: Reply<Result<DevicePtr, SessionError>>,
}

/// Free the LoRA region at `region`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ReleaseLora {
    pub region: DevicePtr,
}

/// VramAllocator → LoraOffloader: a load of `block` has started; its factors ride
/// along with it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LoraPrefetch {
    pub block: BlockId,
}

/// LoraOffloader → PinManager: pinned buffers of these sizes for an adapter's factors,
/// inside the pin ceiling (the pinned cache of model blocks gives way).
#[derive(Message)]
#[rtype(result = "()")]
pub struct AllocateLoraPins {
    pub sizes: Vec<u64>,
    pub reply: Reply<Result<Vec<HostBuffer>, SessionError>>,
}

/// LoraOffloader → PinManager: an adapter's pinned buffers, no longer used.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FreeLoraPins {
    pub buffers: Vec<HostBuffer>,
}

/// Drop these blocks' device copies (if ready and unheld) so their next use reloads
/// pristine bytes: their resident copies were patched and the patch changed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Invalidate {
    pub blocks: Vec<BlockId>,
    pub reply: Reply<u64>,
}

/// Speculative loads of blocks outside the step order (MoE experts): load each if it
/// can be done without evicting something needed sooner.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Hint {
    pub blocks: Vec<BlockId>,
}

/// Run time, from a shared budget's broker: make this session's budgets `lease` (give
/// way block by block, or take room). Answers the budgets now in force.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Resize {
    pub lease: crate::pool_state::Lease,
    pub reply: Reply<Result<crate::pool_state::Lease, SessionError>>,
}

/// VramAllocator → PinManager: the pinned part of a [`Resize`], with the blocks VRAM
/// streams now (the ones the pinned cache may hold) and the VRAM budget granted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResizePins {
    pub ceiling_bytes: u64,
    pub streamed: Vec<bool>,
    pub vram_bytes: u64,
    pub reply: Reply<Result<crate::pool_state::Lease, SessionError>>,
}
