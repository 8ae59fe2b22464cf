//! Device memory the compute adapter owns (activations, loaded blocks, small upload
//! buffers), and the copies to and from it, all ordered on the compute stream.
//!
//! A [`DeviceBuffer`] is `cuMemAlloc`'d and freed on drop only after the compute
//! stream has passed everything queued so far: a kernel queued earlier may still read
//! it. Its bytes count in a shared [`Footprint`], so the run can tell the driver's
//! used figure apart into weights and everything else.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::CudaStream;
use stagehand_actors::DevicePtr;

use super::error::CudaError;
use super::events::make_current;

/// Device bytes the compute adapter holds beside the weights: live buffers and the
/// mapped part of the cast buffer. Shared so a step callback can read it.
///
/// A buffer counts in whole driver pages (2 MiB), the most the driver's used figure
/// can grow for it, so taking the footprint off that figure never credits the
/// adapter's memory to the weights.
#[derive(Debug, Default)]
pub struct Footprint {
    bytes: AtomicU64,
}

impl Footprint {
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub(super) fn add(&self, bytes: u64) {
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, bytes: u64) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The driver backs allocations with pages of this size.
const DRIVER_PAGE_BYTES: u64 = 2 << 20;

fn driver_pages(bytes: u64) -> u64 {
    bytes.div_ceil(DRIVER_PAGE_BYTES) * DRIVER_PAGE_BYTES
}

/// One `cuMemAlloc` of the compute adapter; empty (a null pointer) for 0 bytes.
pub struct DeviceBuffer {
    ptr: DevicePtr,
    bytes: u64,
    stream: Arc<CudaStream>,
    footprint: Arc<Footprint>,
}

impl DeviceBuffer {
    /// `bytes` of uninitialised device memory.
    pub fn allocate(
        stream: &Arc<CudaStream>,
        footprint: &Arc<Footprint>,
        bytes: u64,
    ) -> Result<Self, CudaError> {
        let mut pointer: sys::CUdeviceptr = 0;
        if bytes > 0 {
            let len = usize::try_from(bytes).map_err(|_| {
                CudaError::InvalidArgument(format!("{bytes} bytes do not fit in memory"))
            })?;
            make_current(stream.context())?;
            // SAFETY: `pointer` is a valid out-pointer and the context is current.
            unsafe { sys::cuMemAlloc_v2(&mut pointer, len) }
                .result()
                .map_err(CudaError::driver("cuMemAlloc"))?;
            footprint.add(driver_pages(bytes));
        }
        Ok(Self {
            ptr: DevicePtr(pointer),
            bytes,
            stream: stream.clone(),
            footprint: footprint.clone(),
        })
    }

    /// `bytes` of device memory, zeroed on the compute stream.
    pub fn zeroed(
        stream: &Arc<CudaStream>,
        footprint: &Arc<Footprint>,
        bytes: u64,
    ) -> Result<Self, CudaError> {
        let buffer = Self::allocate(stream, footprint, bytes)?;
        buffer.zero()?;
        Ok(buffer)
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Queues a zero fill of the whole buffer on the compute stream.
    pub fn zero(&self) -> Result<(), CudaError> {
        if self.bytes == 0 {
            return Ok(());
        }
        make_current(self.stream.context())?;
        // SAFETY: the range is this buffer's own allocation, alive until a drop that
        // waits for the stream first.
        unsafe { sys::cuMemsetD8Async(self.ptr.0, 0, self.bytes as usize, self.stream.cu_stream()) }
            .result()
            .map_err(CudaError::driver("cuMemsetD8Async"))
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        if make_current(self.stream.context()).is_err() {
            tracing::warn!(
                bytes = self.bytes,
                "could not bind the context to free a buffer"
            );
            return;
        }
        // Work queued earlier may still use the buffer: freeing under it would be a
        // use-after-free on the device.
        // SAFETY: the stream handle is live for as long as `self.stream` is.
        let synchronized = unsafe { sys::cuStreamSynchronize(self.stream.cu_stream()) }.result();
        if let Err(error) = synchronized {
            tracing::warn!(%error, "could not wait for the compute stream before a free");
        }
        // SAFETY: allocated by `allocate`, freed once, after the stream passed it.
        if let Err(error) = unsafe { sys::cuMemFree_v2(self.ptr.0) }.result() {
            tracing::warn!(%error, bytes = self.bytes, "cuMemFree failed");
        }
        self.footprint.sub(driver_pages(self.bytes));
    }
}

/// Queues a copy of host `bytes` to `destination` on `stream`.
///
/// # Safety
/// `destination .. + bytes.len()` must be device memory that stays allocated until the
/// stream passes the copy, and `bytes` must be pageable memory (a `Vec` or a slice of
/// one): the driver stages a pageable source before the call returns, so the caller
/// may reuse it at once. A page-locked source would be read later, asynchronously.
pub unsafe fn upload_pageable(
    stream: &CudaStream,
    destination: DevicePtr,
    bytes: &[u8],
) -> Result<(), CudaError> {
    if bytes.is_empty() {
        return Ok(());
    }
    make_current(stream.context())?;
    // SAFETY: see the function's contract.
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            destination.0,
            bytes.as_ptr() as *const c_void,
            bytes.len(),
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(CudaError::driver("cuMemcpyHtoDAsync"))
}

/// Copies host `bytes` to `destination` after everything queued on `stream`, and waits
/// until the copy is done, so the source may be any host memory.
///
/// # Safety
/// `destination .. + bytes.len()` must be device memory of the stream's context.
pub unsafe fn upload_and_wait(
    stream: &CudaStream,
    destination: DevicePtr,
    bytes: &[u8],
) -> Result<(), CudaError> {
    // SAFETY: the caller names the destination; the wait below ends the source's use,
    // whatever kind of host memory it is.
    unsafe { upload_pageable(stream, destination, bytes) }?;
    synchronize(stream)
}

/// Copies `destination.len()` bytes at `source` to the host after everything queued on
/// `stream`, and waits for them.
///
/// # Safety
/// `source .. + destination.len()` must be device memory of the stream's context.
pub unsafe fn download(
    stream: &CudaStream,
    source: DevicePtr,
    destination: &mut [u8],
) -> Result<(), CudaError> {
    if destination.is_empty() {
        return Ok(());
    }
    make_current(stream.context())?;
    // SAFETY: the destination is an exclusively borrowed host slice, kept until the
    // synchronize below; the caller names the source.
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(
            destination.as_mut_ptr() as *mut c_void,
            source.0,
            destination.len(),
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
    synchronize(stream)
}

/// Queues a device-to-device copy on `stream`.
///
/// # Safety
/// Both ranges must be device memory of the stream's context that stays allocated until
/// the stream passes the copy, and they must not overlap.
pub unsafe fn copy_on_device(
    stream: &CudaStream,
    source: DevicePtr,
    destination: DevicePtr,
    bytes: u64,
) -> Result<(), CudaError> {
    if bytes == 0 {
        return Ok(());
    }
    make_current(stream.context())?;
    // SAFETY: see the function's contract.
    unsafe {
        sys::cuMemcpyDtoDAsync_v2(destination.0, source.0, bytes as usize, stream.cu_stream())
    }
    .result()
    .map_err(CudaError::driver("cuMemcpyDtoDAsync"))
}

/// Queues a zero fill of `bytes` at `destination` on `stream`.
///
/// # Safety
/// The range must be device memory of the stream's context that stays allocated until
/// the stream passes the fill.
pub unsafe fn zero_on_device(
    stream: &CudaStream,
    destination: DevicePtr,
    bytes: u64,
) -> Result<(), CudaError> {
    if bytes == 0 {
        return Ok(());
    }
    make_current(stream.context())?;
    // SAFETY: see the function's contract.
    unsafe { sys::cuMemsetD8Async(destination.0, 0, bytes as usize, stream.cu_stream()) }
        .result()
        .map_err(CudaError::driver("cuMemsetD8Async"))
}

/// Waits until everything queued on `stream` has run.
pub fn synchronize(stream: &CudaStream) -> Result<(), CudaError> {
    make_current(stream.context())?;
    // SAFETY: the stream handle is live for as long as `stream` is.
    unsafe { sys::cuStreamSynchronize(stream.cu_stream()) }
        .result()
        .map_err(CudaError::driver("cuStreamSynchronize"))
}

/// A device buffer that grows to the largest size asked of it and is reused: the
/// per-call uploads (token ids, row scales, sequence lengths) and the checksum's sum.
pub struct Scratch {
    buffer: Option<DeviceBuffer>,
}

impl Scratch {
    pub fn new() -> Self {
        Self { buffer: None }
    }

    /// A buffer of at least `bytes`. Growing frees the old one after the stream passed
    /// it (see [`DeviceBuffer`]'s drop), so nothing queued reads freed memory.
    pub fn at_least(
        &mut self,
        stream: &Arc<CudaStream>,
        footprint: &Arc<Footprint>,
        bytes: u64,
    ) -> Result<DevicePtr, CudaError> {
        let fits = self
            .buffer
            .as_ref()
            .is_some_and(|buffer| buffer.bytes() >= bytes);
        if !fits {
            self.buffer = None;
            let rounded = bytes.max(256).next_power_of_two();
            self.buffer = Some(DeviceBuffer::allocate(stream, footprint, rounded)?);
        }
        Ok(self
            .buffer
            .as_ref()
            .map_or(DevicePtr(0), |buffer| buffer.ptr()))
    }
}
