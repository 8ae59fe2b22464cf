//! The stagehand actors: disk reader, pin manager, VRAM allocator, LoRA offloader and
//! compute stream, the messages between them, and the ports (`Device`, `Storage`,
//! `Observer`) their adapters plug into. Knows nothing of CUDA, files or the CLI.

mod device;
mod host_buffer;
mod layout;
mod observer;
mod storage;

pub use device::{Device, DeviceArena, DeviceError, DevicePtr, MemoryInfo, OpFuture};
pub use host_buffer::{HostAllocError, HostBuffer, PinRegistration, HOST_BUFFER_ALIGN};
pub use layout::{BlockId, BlockLayout, Extent, FileId, ModelLayout};
pub use observer::{
    AcquireBatch, ErrorKind, Link, NoObserver, Observer, Owner, Tee, Tier, TierUsage,
};
pub use storage::{Storage, StorageError};
