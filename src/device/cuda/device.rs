//! `CudaDevice`: the `Device` port on a real GPU.
//!
//! One context (the device's primary one), a copy stream for host→device transfers and
//! a compute stream for the workload, each with a waiter thread that turns completed
//! events into resolved futures.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::sys::{self, cudaError_enum};
use cudarc::driver::{result, CudaContext, CudaStream, DriverError};
use stagehand_actors::{
    Device, DeviceArena, DeviceError, DevicePtr, HostBuffer, MemoryInfo, MemorySpace, OpFuture,
};

use super::budget::{vram_budget, BudgetInputs, VramBudget};
use super::cast_buffer::CastBuffer;
use super::error::CudaError;
use super::events::{Event, EventWaiter};
use super::library::require_driver;
use super::pinned::allocate_registered;

/// How many CUDA devices this machine has; `Ok(0)` when the driver is installed but
/// sees none. Errors only when the driver library is missing or refuses to start.
pub fn device_count() -> Result<usize, CudaError> {
    require_driver()?;
    guard_loader("cuInit", || {
        match result::init() {
            Ok(()) => {}
            Err(DriverError(cudaError_enum::CUDA_ERROR_NO_DEVICE)) => return Ok(0),
            Err(error) => return Err(init_error(error)),
        }
        let count = result::device::get_count().map_err(CudaError::driver("cuDeviceGetCount"))?;
        Ok(usize::try_from(count).unwrap_or(0))
    })
}

fn init_error(error: DriverError) -> CudaError {
    let advice = match error.0 {
        cudaError_enum::CUDA_ERROR_STUB_LIBRARY => {
            "the libcuda found is the CUDA toolkit's stub, not the driver's: install the \
             NVIDIA driver (580 or newer) or fix LD_LIBRARY_PATH, or run with --device cpu"
        }
        cudaError_enum::CUDA_ERROR_SYSTEM_DRIVER_MISMATCH => {
            "the driver library and the kernel module differ in version: reboot or \
             reinstall the NVIDIA driver, or run with --device cpu"
        }
        cudaError_enum::CUDA_ERROR_NO_DEVICE => {
            "the driver sees no GPU: check nvidia-smi and CUDA_VISIBLE_DEVICES, or run with \
             --device cpu"
        }
        _ => "the driver could not start: check nvidia-smi, or run with --device cpu",
    };
    CudaError::NoDevice(format!("cuInit failed with {error}; {advice}"))
}

/// Runs driver calls that may hit cudarc's loader, which panics when a symbol is
/// missing from an older driver; that becomes an error here instead of a crash.
fn guard_loader<T>(
    call: &'static str,
    body: impl FnOnce() -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown loader failure");
        Err(CudaError::NoDevice(format!(
            "the CUDA driver library could not be used for {call} ({detail}); update the \
             NVIDIA driver, or run with --device cpu"
        )))
    })
}

/// The address space of a CUDA context: device pointers of one context are what the
/// compute adapter on the same context reads.
pub fn memory_space_of(context: &CudaContext) -> MemorySpace {
    MemorySpace::Accelerator {
        kind: "cuda",
        id: context.cu_ctx() as u64,
    }
}

pub struct CudaDevice {
    // Declared first so they drop first: the waiters finish every queued completion
    // (and release the buffers those hold) while the streams and context still exist.
    copy_waiter: EventWaiter,
    compute_waiter: EventWaiter,
    copy_stream: Arc<CudaStream>,
    compute_stream: Arc<CudaStream>,
    context: Arc<CudaContext>,
    ordinal: usize,
    device_name: String,
}

impl CudaDevice {
    /// Opens device `ordinal`. Checks the driver library and the device count first, so
    /// a machine without a GPU gets a clear error and never a panic.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        let count = device_count()?;
        if count == 0 {
            return Err(CudaError::NoDevice(
                "the NVIDIA driver is installed but sees no GPU: check nvidia-smi and \
                 CUDA_VISIBLE_DEVICES, or run with --device cpu"
                    .to_string(),
            ));
        }
        if ordinal >= count {
            return Err(CudaError::NoDevice(format!(
                "device {ordinal} was asked for but this machine has {count} \
                 (ordinals 0..{count}); pick one below {count} or check CUDA_VISIBLE_DEVICES"
            )));
        }
        guard_loader("opening the device", || Self::open_present(ordinal))
    }

    fn open_present(ordinal: usize) -> Result<Self, CudaError> {
        let context = CudaContext::new(ordinal).map_err(CudaError::driver("cuCtxCreate"))?;
        let device_name = context
            .name()
            .map_err(CudaError::driver("cuDeviceGetName"))?;
        let copy_stream = context
            .new_stream()
            .map_err(CudaError::driver("cuStreamCreate"))?;
        let compute_stream = context
            .new_stream()
            .map_err(CudaError::driver("cuStreamCreate"))?;
        Ok(Self {
            copy_waiter: EventWaiter::spawn(&format!("cuda{ordinal}-copy-done"))?,
            compute_waiter: EventWaiter::spawn(&format!("cuda{ordinal}-compute-done"))?,
            copy_stream,
            compute_stream,
            context,
            ordinal,
            device_name,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The GPU's marketing name, e.g. "NVIDIA H200".
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.copy_stream
    }

    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute_stream
    }

    pub(crate) fn bind(&self) -> Result<(), CudaError> {
        self.context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))
    }

    /// `cuMemGetInfo` as (free, total) bytes.
    pub fn memory(&self) -> Result<MemoryInfo, CudaError> {
        self.bind()?;
        let (free_bytes, total_bytes) =
            result::mem_get_info().map_err(CudaError::driver("cuMemGetInfo"))?;
        Ok(MemoryInfo {
            total_bytes: total_bytes as u64,
            free_bytes: free_bytes as u64,
        })
    }

    /// The weight budget for this device right now (DESIGN §2).
    pub fn vram_budget(
        &self,
        reserve_vram_bytes: u64,
        vram_headroom_bytes: u64,
        configured_budget_bytes: Option<u64>,
    ) -> Result<VramBudget, CudaError> {
        let memory = self.memory()?;
        Ok(vram_budget(BudgetInputs {
            total_bytes: memory.total_bytes,
            free_bytes: memory.free_bytes,
            reserve_vram_bytes,
            vram_headroom_bytes,
            configured_budget_bytes,
        })?)
    }

    /// A growable cast buffer reserving `max_bytes` of address space, mapped in chunks
    /// of about `chunk_bytes`.
    pub fn cast_buffer(&self, max_bytes: u64, chunk_bytes: u64) -> Result<CastBuffer, CudaError> {
        CastBuffer::new(&self.context, max_bytes, chunk_bytes)
    }

    /// Records "compute done" on the compute stream: an event the copy stream can be
    /// made to wait on before it overwrites a slot the compute still reads.
    pub fn record_compute_done(&self) -> Result<Event, CudaError> {
        Event::record(&self.compute_stream)
    }

    /// Orders every later copy after `event` on the device (no host wait).
    pub fn copies_wait_for(&self, event: &Event) -> Result<(), CudaError> {
        event.make_wait(&self.copy_stream)
    }

    /// Orders every later compute after the copies queued so far, on the device.
    pub fn compute_waits_for_copies(&self) -> Result<(), CudaError> {
        Event::record(&self.copy_stream)?.make_wait(&self.compute_stream)
    }

    /// A future that resolves when all compute queued so far has completed.
    pub fn compute_done(&self) -> OpFuture<(), DeviceError> {
        let event = match Event::record(&self.compute_stream) {
            Ok(event) => event,
            Err(error) => return Box::pin(std::future::ready(Err(error.into()))),
        };
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.compute_waiter.submit(event, move |result| {
            let _ = sender.send(result.map_err(DeviceError::from));
        });
        Box::pin(async move {
            receiver.await.unwrap_or_else(|_| {
                Err(DeviceError::Other(
                    "the compute completion thread stopped".to_string(),
                ))
            })
        })
    }

    /// Blocks until both streams are idle (tests, benchmarks, teardown).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        self.context
            .synchronize()
            .map_err(CudaError::driver("cuCtxSynchronize"))
    }

    /// Copies device memory back to the host, synchronously (verification only).
    pub fn copy_to_host(&self, source: DevicePtr, destination: &mut [u8]) -> Result<(), CudaError> {
        self.synchronize()?;
        // SAFETY: `destination` is a live, exclusively borrowed host slice of the given
        // length; the caller names a device range it allocated.
        unsafe {
            sys::cuMemcpyDtoH_v2(
                destination.as_mut_ptr() as *mut c_void,
                source.0,
                destination.len(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyDtoH"))
    }

    fn enqueue_copy(
        &self,
        source: &HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> Result<Event, CudaError> {
        let end = source_offset.checked_add(bytes);
        let Some(host) = source.as_slice() else {
            return Err(CudaError::InvalidArgument(
                "a virtual buffer has no bytes to copy; the cuda device needs real host buffers"
                    .to_string(),
            ));
        };
        let range = match end {
            Some(end) if end <= host.len() as u64 => source_offset as usize..end as usize,
            _ => {
                return Err(CudaError::InvalidArgument(format!(
                    "copy of {bytes} bytes at offset {source_offset} runs past the {}-byte \
                     source buffer",
                    host.len()
                )))
            }
        };
        if destination.0 == 0 {
            return Err(CudaError::InvalidArgument(
                "copy destination is a null device pointer".to_string(),
            ));
        }
        let host = &host[range];
        self.bind()?;
        // SAFETY: `host` is a live slice inside `source`; the caller keeps `source` alive
        // until the returned event completes (the completion owns it). The destination
        // is a device range the caller allocated.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                destination.0,
                host.as_ptr() as *const c_void,
                host.len(),
                self.copy_stream.cu_stream(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyHtoDAsync"))?;
        Event::record(&self.copy_stream).inspect_err(|_| {
            // The copy is queued but nothing will say when it is done, and the caller
            // gets the source back with the error: wait here so it is not freed under
            // the transfer.
            let _ = self.copy_stream.synchronize();
        })
    }
}

impl Device for CudaDevice {
    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn memory_space(&self) -> MemorySpace {
        memory_space_of(&self.context)
    }

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        Ok(self.memory()?)
    }

    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        if bytes == 0 {
            return Err(DeviceError::Other(
                "an arena of 0 bytes was asked for".to_string(),
            ));
        }
        self.bind()?;
        let mut pointer: sys::CUdeviceptr = 0;
        // SAFETY: `pointer` is a valid out-pointer and the context is current.
        let allocated = unsafe { sys::cuMemAlloc_v2(&mut pointer, bytes as usize) }.result();
        match allocated {
            Ok(()) => Ok(DeviceArena {
                base: DevicePtr(pointer),
                bytes,
            }),
            Err(DriverError(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY)) => {
                Err(DeviceError::OutOfMemory {
                    requested_bytes: bytes,
                    available_bytes: self.memory().map_or(0, |memory| memory.free_bytes),
                })
            }
            Err(error) => Err(CudaError::driver("cuMemAlloc")(error).into()),
        }
    }

    fn free_arena(&self, arena: DeviceArena) {
        // Work still queued may read or write the arena; freeing under it would be a
        // use-after-free on the device.
        if let Err(error) = self.synchronize() {
            tracing::warn!(%error, "could not synchronize before freeing a device arena");
        }
        // SAFETY: the arena came from `allocate_arena` (cuMemAlloc) and is freed once,
        // after all queued work on it has completed.
        let freed = unsafe { sys::cuMemFree_v2(arena.base.0) }.result();
        if let Err(error) = freed {
            tracing::warn!(%error, bytes = arena.bytes, "cuMemFree failed");
        }
    }

    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        let len = usize::try_from(bytes).map_err(|_| DeviceError::PinFailed {
            bytes,
            reason: "larger than the address space".to_string(),
        })?;
        allocate_registered(&self.context, len).map_err(|error| DeviceError::PinFailed {
            bytes,
            reason: error.to_string(),
        })
    }

    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        if bytes == 0 {
            return Box::pin(std::future::ready(Ok(source)));
        }
        let event = match self.enqueue_copy(&source, source_offset, bytes, destination) {
            Ok(event) => event,
            Err(error) => {
                let error = DeviceError::CopyFailed(error.to_string());
                return Box::pin(std::future::ready(Err((error, source))));
            }
        };
        let source_len = source.len();
        let (sender, receiver) = tokio::sync::oneshot::channel();
        // The completion owns the source until the copy's event has completed, so the
        // buffer stays alive (and registered) under the transfer even if the caller
        // drops the future.
        self.copy_waiter.submit(event, move |result| {
            let outcome = match result {
                Ok(()) => Ok(source),
                Err(error) => Err((DeviceError::CopyFailed(error.to_string()), source)),
            };
            let _ = sender.send(outcome);
        });
        Box::pin(async move {
            receiver.await.unwrap_or_else(|_| {
                // Only reachable if a completion panicked; the buffer was dropped after
                // its event, so a stand-in of the same length is handed back.
                Err((
                    DeviceError::CopyFailed("the copy completion thread stopped".to_string()),
                    HostBuffer::virtual_buffer(source_len),
                ))
            })
        })
    }
}
