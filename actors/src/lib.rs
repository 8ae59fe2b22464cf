//! The stagehand actors: disk reader, pin manager, VRAM allocator, LoRA offloader and
//! compute stream, the messages between them, and the ports (`Device`, `Storage`,
//! `Observer`) their adapters plug into. Knows nothing of CUDA, files or the CLI.

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

pub use expert_cache::{
    replay, replay_optimal, CacheFigures, ExpertCache, ExpertPolicy, SkewedRouting,
};
pub use plan::{
    keep_by_priority, max_scatter_priority, PinPlan, PlanError, ResidencyPolicy, Staging,
    StepOrder, VramPlan,
};
pub use residency::{BlockHandle, BlockState, ResidencyTable};
pub use stats::{LinkSnapshot, Stats, StatsSnapshot, TierSnapshot, STEP_HISTORY};
pub use vram_state::{ActivationError, Decisions, Load, VramState};

mod compute_stream;
mod disk_reader;
mod error;
mod lora_offloader;
mod lora_state;
mod mailbox;
mod messages;
mod pin_manager;
mod pin_state;
mod session;
mod vram_allocator;

pub use error::SessionError;
pub use lora_offloader::{LoraAttach, LoraOffloader, LoraPack};
pub use lora_state::{AdapterSummary, LoraSlot, LoraState, LoraUsage, MAX_ADAPTERS};
pub use pin_state::{BufferHome, Consolidation, PinState};
pub use session::{
    ExpertConfig, LocalSession, LoraHandle, Session, SessionConfig, SessionPlan, STOP_POLL,
};
