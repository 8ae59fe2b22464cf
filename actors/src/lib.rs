//! The stagehand actors: disk reader, pin manager, VRAM allocator, LoRA offloader and
//! compute stream, the messages between them, and the ports (`Device`, `Storage`,
//! `Observer`) their adapters plug into. Knows nothing of CUDA, files or the CLI.
//!
//! An engine embeds it through [`Session`]: give the budgets ([`SessionConfig`]), the
//! model's blocks ([`ModelLayout`]) and their order in a step, a [`Device`] and a
//! [`Storage`]; then `acquire` each block before its compute and `release` it after.
//! The decision logic (the plan, the VRAM and pin state machines, the expert cache)
//! is private: the session is the way in, its [`StatsSnapshot`] and the [`Observer`]
//! calls the way to watch.

// The internals are private, so an embedder knows the crate only by its docs: every
// public item must say what it is or means.
#![warn(missing_docs)]

mod bytes;
mod device;
mod host_buffer;
mod layout;
mod observer;
mod storage;

pub use bytes::Bytes;
pub use device::{Device, DeviceArena, DeviceError, DevicePtr, MemoryInfo, MemorySpace, OpFuture};
pub use host_buffer::{HostAllocError, HostBuffer, PinRegistration, HOST_BUFFER_ALIGN};
pub use layout::{slice_extents, BlockId, BlockLayout, Extent, FileId, ModelLayout};
pub use observer::{
    AcquireBatch, ErrorKind, ExpertAcquires, Link, NoObserver, Observer, Owner, ReadAheadOutcome,
    Tee, Tier, TierUsage,
};
pub use storage::{Storage, StorageError};

mod arena;
mod expert_cache;
mod plan;
mod residency;
mod stats;
mod vram_state;

pub use arena::{align_up as arena_bytes, SLOT_ALIGN};
pub use expert_cache::{replay, replay_optimal, CacheFigures, ExpertPolicy, SkewedRouting};
pub use plan::{PinPlan, PlanError, ResidencyPolicy, Staging, StepOrder, VramPlan};
pub use residency::{BlockHandle, ResidencyTable};
pub use stats::{LinkSnapshot, Stats, StatsSnapshot, StepLoad, TierSnapshot, STEP_HISTORY};

mod compute_stream;
mod disk_reader;
mod error;
mod lora_offloader;
mod lora_state;
mod mailbox;
mod messages;
mod pin_manager;
mod pin_state;
mod pool_state;
mod session;
mod shared_budget;
mod vram_allocator;

pub use error::{ReadFault, SessionError};
pub use lora_offloader::{LoraAttach, LoraPack};
pub use lora_state::{AdapterSummary, LoraSlot, LoraUsage, MAX_ADAPTERS};
pub use pool_state::{Lease, MemberSnapshot, PoolAsk, PoolError, PoolState};
pub use session::{
    BudgetHandle, ExpertConfig, LocalSession, LoraHandle, Session, SessionConfig, SessionPlan,
    STOP_POLL,
};
pub use shared_budget::SharedBudget;
