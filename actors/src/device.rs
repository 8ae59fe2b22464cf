//! The `Device` port: the memory, pinning and copy engine of an accelerator.
//!
//! Adapters live in the `stagehand` crate: `cpu` (VRAM is capped host memory, copies
//! are real memcpy on a copy thread), `sim` (virtual time, no bytes) and `cuda`.
//! Completion is a future: the CPU adapter resolves it from its copy thread, the
//! simulator from a timer on the paused tokio clock, CUDA from an event. Actors await
//! these futures on their own runtime and never block their thread on a device.

use std::future::Future;
use std::pin::Pin;

use crate::bytes::Bytes;
use crate::host_buffer::HostBuffer;

/// A future a device or storage adapter resolves when its operation completes.
pub type OpFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send + 'static>>;

/// An address in device memory. Meaningful only to the device that issued it
/// (the CPU adapter uses host addresses, CUDA uses `CUdeviceptr`, the simulator
/// uses offsets into nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The address `bytes` past this one, in the same allocation: how a slot's
    /// address is found from its arena's base. Not checked against the arena's end.
    pub fn offset(self, bytes: u64) -> DevicePtr {
        DevicePtr(self.0 + bytes)
    }
}

/// Whose address space a device's `DevicePtr`s are in, so a compute adapter can
/// check that it can read the blocks a session hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemorySpace {
    /// Plain host addresses (the CPU backend).
    Host,
    /// An accelerator's address space: `kind` names the adapter, `id` the context.
    Accelerator {
        /// The adapter that issued the pointers ("cuda").
        kind: &'static str,
        /// The context within that adapter (CUDA: the `CUcontext` handle), since
        /// pointers of one context mean nothing in another.
        id: u64,
    },
    /// Addresses nobody can read (the simulator's virtual memory, test doubles).
    Opaque,
}

/// Device memory as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    /// All the memory the device has, used or not.
    pub total_bytes: u64,
    /// Free right now, counting other processes (CUDA: `cuMemGetInfo`).
    pub free_bytes: u64,
}

/// Why a device operation failed, with the adapter's own account of it.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// An allocation (the weight arena) asked for more device memory than is free.
    #[error(
        "device out of memory: asked for {}, {} free",
        Bytes(*requested_bytes),
        Bytes(*available_bytes)
    )]
    OutOfMemory {
        /// The size of the allocation that failed.
        requested_bytes: u64,
        /// What the device had free when it failed, as its driver counts it.
        available_bytes: u64,
    },
    /// A host buffer could not be allocated or registered as pinned.
    #[error("could not pin {} of host memory: {reason}", Bytes(*bytes))]
    PinFailed {
        /// The size of the buffer that could not be pinned.
        bytes: u64,
        /// The host's or driver's own account of why.
        reason: String,
    },
    /// A host-to-device copy failed or its completion was lost; the reason is the
    /// adapter's.
    #[error("copy failed: {0}")]
    CopyFailed(String),
    /// The device cannot be used at all (no driver library, no device, its copy
    /// thread gone): retrying will not help.
    #[error("device unavailable: {0}")]
    Unavailable(String),
    /// Any other failure, in the adapter's words.
    #[error("{0}")]
    Other(String),
}

/// One contiguous device allocation, freed by [`Device::free_arena`].
#[derive(Debug)]
pub struct DeviceArena {
    /// The first address of the allocation; slots are offsets from it.
    pub base: DevicePtr,
    /// The size asked for (the VRAM budget, for a session's weight arena).
    pub bytes: u64,
}

/// The port an accelerator adapter implements: device memory, pinned host buffers and
/// the copy stream. Shared behind an `Arc` by the actors that touch the device, with
/// `&self` methods, so an implementation guards its own state.
pub trait Device: Send + Sync + 'static {
    /// Short adapter name for logs and summaries: "cpu", "sim", "cuda:0".
    fn name(&self) -> String;

    /// The device's memory now, as its driver reports it (other processes' use
    /// included), for sizing budgets before a session starts.
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError>;

    /// The address space of this device's `DevicePtr`s.
    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Opaque
    }

    /// Allocates the weight arena the VRAM allocator sub-allocates slots from.
    /// Allocated once at session start, never on the hot path.
    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError>;

    /// Gives back an arena from [`Device::allocate_arena`]. Called once, after the
    /// last copy into it has completed (the allocator's drain, or a failed start).
    fn free_arena(&self, arena: DeviceArena);

    /// A host buffer of `bytes` the device can copy from at full speed (page-locked on
    /// CUDA). The simulator returns a virtual buffer.
    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError>;

    /// Copies `source[source_offset .. source_offset + bytes]` to `destination` on the
    /// copy stream. The source buffer is held until the copy has completed and handed
    /// back with the result, so it can never be freed or refilled under the copy.
    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)>;
}
