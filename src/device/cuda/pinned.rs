//! Page-locking host memory stagehand allocated, with `cuMemHostRegister`.
//!
//! Registering our own page-aligned allocation (rather than `cuMemHostAlloc`) lets the
//! pinned tier use ordinary `HostBuffer`s that the O_DIRECT reader fills, and field
//! reports put malloc + register ahead of `cuMemHostAlloc` for large buffers.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use stagehand_actors::{HostBuffer, PinRegistration};

use super::error::CudaError;
use super::events::make_current;

/// A live `cuMemHostRegister` of one host range; unregisters on drop.
///
/// A `HostBuffer` holds this as its registration and drops it before freeing its
/// memory. The device hands a buffer back from `copy_to_device` only after the copy's
/// event has completed, so by the time anyone can drop the buffer no copy reads it:
/// unregistering never races a transfer.
pub struct HostRegistration {
    // Stored as an address so the type is `Send` without an unsafe impl: it is only
    // ever passed back to the driver, never dereferenced.
    address: usize,
    bytes: usize,
    context: Arc<CudaContext>,
}

impl HostRegistration {
    /// Page-locks `bytes` bytes starting at `pointer`.
    ///
    /// # Safety
    /// The caller guarantees that `pointer .. pointer + bytes` is one live host
    /// allocation that is not already registered, and that it stays allocated until
    /// the returned value is dropped (a `HostBuffer` guarantees this for its own
    /// registration by dropping it first).
    pub unsafe fn register(
        context: &Arc<CudaContext>,
        pointer: *mut u8,
        bytes: usize,
    ) -> Result<Self, CudaError> {
        if pointer.is_null() || bytes == 0 {
            return Err(CudaError::InvalidArgument(format!(
                "cannot pin {bytes} bytes at {pointer:?}: a real, non-empty host buffer is needed"
            )));
        }
        context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        // PORTABLE: the pages count as pinned for every context in the process, so a
        // second device or library sharing the buffer still gets full-speed copies.
        // SAFETY: the caller guarantees the range is live and unregistered.
        unsafe {
            sys::cuMemHostRegister_v2(
                pointer as *mut c_void,
                bytes,
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemHostRegister"))?;
        Ok(Self {
            address: pointer as usize,
            bytes,
            context: context.clone(),
        })
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl PinRegistration for HostRegistration {}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if let Err(error) = make_current(&self.context) {
            tracing::warn!(%error, "could not bind the CUDA context to unregister host memory");
            return;
        }
        // SAFETY: the range was registered by `register` and is still allocated (see
        // the type's documentation), and it is unregistered exactly once, here.
        let result = unsafe { sys::cuMemHostUnregister(self.address as *mut c_void) }.result();
        if let Err(error) = result {
            tracing::warn!(%error, bytes = self.bytes, "cuMemHostUnregister failed");
        }
    }
}

/// Allocates a page-aligned host buffer of `bytes` and registers all of it.
pub fn allocate_registered(
    context: &Arc<CudaContext>,
    bytes: usize,
) -> Result<HostBuffer, CudaError> {
    let mut buffer = HostBuffer::allocate(bytes)?;
    if bytes == 0 {
        return Ok(buffer);
    }
    register_buffer(context, &mut buffer)?;
    Ok(buffer)
}

/// Registers an existing real buffer in place (it keeps its bytes).
pub fn register_buffer(
    context: &Arc<CudaContext>,
    buffer: &mut HostBuffer,
) -> Result<(), CudaError> {
    if buffer.is_registered() {
        return Ok(());
    }
    let len = buffer.len();
    let pointer = buffer
        .as_mut_slice()
        .ok_or_else(|| {
            CudaError::InvalidArgument(
                "a virtual buffer has no memory to pin; the cuda device needs real host buffers"
                    .to_string(),
            )
        })?
        .as_mut_ptr();
    // SAFETY: the pointer and length describe the buffer's own live allocation, which
    // is not registered (checked above); the buffer drops the registration before it
    // frees the memory.
    let registration = unsafe { HostRegistration::register(context, pointer, len) }?;
    buffer.set_registration(Box::new(registration));
    Ok(())
}
