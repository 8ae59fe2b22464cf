//! Host buffers: the pinned tier's unit of memory.
//!
//! A `HostBuffer` is page-aligned (so the O_DIRECT reader can fill it) and owned by
//! exactly one party at a time: the pin manager, a disk read in flight, or a copy in
//! flight. Passing it by value through `Storage::read` and `Device::copy_to_device`
//! is how a buffer is kept alive until the last operation that uses it has finished.
//!
//! The simulator moves no bytes, so a buffer can also be *virtual*: it has a length
//! and no memory behind it.

use std::alloc::{self, Layout};
use std::ptr::NonNull;

/// Alignment of every real host buffer: the page size and the common O_DIRECT block size.
pub const HOST_BUFFER_ALIGN: usize = 4096;

/// Buffers of at least this size are aligned to it (a huge page's): each whole 2 MiB
/// of them can then be backed by one huge page where the owner asks for it, instead of
/// 512 small ones faulted in one by one.
const HUGE_PAGE_BYTES: usize = 2 << 20;

/// The alignment of a real buffer of `len` bytes: [`HOST_BUFFER_ALIGN`], or
/// [`HUGE_PAGE_BYTES`] for a buffer that spans one.
fn alignment(len: usize) -> usize {
    if len >= HUGE_PAGE_BYTES {
        HUGE_PAGE_BYTES
    } else {
        HOST_BUFFER_ALIGN
    }
}

/// Undoes a device-specific registration (e.g. `cuMemHostUnregister`) when dropped.
pub trait PinRegistration: Send {}

/// The host could not give us the memory.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("could not allocate {bytes} bytes of host memory")]
pub struct HostAllocError {
    /// The size asked for.
    pub bytes: usize,
}

/// A page-aligned host buffer, or a virtual one (a length, no memory) for the
/// simulator. Move-only: one owner at a time, and dropping it undoes its pin
/// registration (if any) before its memory is freed.
pub struct HostBuffer {
    memory: Option<NonNull<u8>>,
    len: usize,
    registration: Option<Box<dyn PinRegistration>>,
    /// A virtual buffer's name, so a simulator can tell its buffers apart (a real
    /// buffer has its address); 0 when none was given.
    tag: u64,
}

// SAFETY: the buffer owns its allocation exclusively; moving it between threads moves
// that ownership. Nobody else holds the pointer while the value is alive.
unsafe impl Send for HostBuffer {}

// SAFETY: a shared reference only reads: the bytes (`as_slice`), the length, the
// address, and whether a registration exists. The registration itself is reachable only
// through `&mut self`, so it is never touched from two threads at once.
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates `len` zeroed, page-aligned bytes. `len == 0` yields an empty buffer.
    pub fn allocate(len: usize) -> Result<Self, HostAllocError> {
        Self::allocate_advised(len, |_, _| {})
    }

    /// Allocates as [`Self::allocate`] does, handing the memory's address and length
    /// to `advise` before anything touches it (the zeroing is its first touch): where
    /// the owner asks the kernel how to back it, with huge pages say.
    pub fn allocate_advised(
        len: usize,
        advise: impl FnOnce(*mut u8, usize),
    ) -> Result<Self, HostAllocError> {
        if len == 0 {
            return Ok(Self::virtual_buffer(0));
        }
        let layout = Layout::from_size_align(len, alignment(len))
            .map_err(|_| HostAllocError { bytes: len })?;
        // SAFETY: layout has non-zero size.
        let pointer = unsafe { alloc::alloc(layout) };
        let memory = NonNull::new(pointer).ok_or(HostAllocError { bytes: len })?;
        advise(pointer, len);
        // SAFETY: `pointer` was just allocated with `len` bytes, owned here alone.
        // (std's `alloc_zeroed` zeroes a page-aligned allocation the same way.)
        unsafe { pointer.write_bytes(0, len) };
        Ok(Self {
            memory: Some(memory),
            len,
            registration: None,
            tag: 0,
        })
    }

    /// A buffer with a length and no memory, for the simulator.
    pub fn virtual_buffer(len: usize) -> Self {
        Self {
            memory: None,
            len,
            registration: None,
            tag: 0,
        }
    }

    /// A virtual buffer named `tag`: the simulator's pinned buffers, whose first-touch
    /// cost depends on which bytes of which buffer a read fills.
    pub fn virtual_tagged(len: usize, tag: u64) -> Self {
        let mut buffer = Self::virtual_buffer(len);
        buffer.tag = tag;
        buffer
    }

    /// The tag given by [`Self::virtual_tagged`]; 0 for every other buffer.
    pub fn tag(&self) -> u64 {
        self.tag
    }

    /// Its size in bytes, virtual or not.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes at all (`len() == 0`).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether it has no memory behind it (a simulator's buffer, or an empty one).
    pub fn is_virtual(&self) -> bool {
        self.memory.is_none()
    }

    /// The bytes, or `None` for a virtual buffer.
    pub fn as_slice(&self) -> Option<&[u8]> {
        // SAFETY: memory is a live allocation of len bytes owned by self.
        self.memory
            .map(|memory| unsafe { std::slice::from_raw_parts(memory.as_ptr(), self.len) })
    }

    /// The bytes to fill, or `None` for a virtual buffer.
    pub fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        self.memory
            .map(|memory| unsafe { std::slice::from_raw_parts_mut(memory.as_ptr(), self.len) })
    }

    /// Raw address for device APIs; null for a virtual buffer.
    pub fn as_ptr(&self) -> *const u8 {
        self.memory
            .map_or(std::ptr::null(), |memory| memory.as_ptr() as *const u8)
    }

    /// Records the device's pin registration, so dropping the buffer (or
    /// [`Self::clear_registration`]) undoes it. Replaces (and so drops) any earlier one.
    pub fn set_registration(&mut self, registration: Box<dyn PinRegistration>) {
        self.registration = Some(registration);
    }

    /// Whether a device registration is held, i.e. a device pinned the buffer through
    /// its own API (CUDA, the simulator); the CPU adapter's buffers have none.
    pub fn is_registered(&self) -> bool {
        self.registration.is_some()
    }

    /// Drops the registration now (unregisters) and keeps the memory.
    pub fn clear_registration(&mut self) {
        self.registration = None;
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        // Unregister before the memory goes away.
        self.registration = None;
        if let Some(memory) = self.memory {
            let layout = Layout::from_size_align(self.len, alignment(self.len))
                .expect("layout was valid at allocation");
            // SAFETY: allocated in `allocate` with this exact layout.
            unsafe { alloc::dealloc(memory.as_ptr(), layout) };
        }
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostBuffer")
            .field("len", &self.len)
            .field("virtual", &self.is_virtual())
            .field("registered", &self.is_registered())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_buffers_are_aligned_zeroed_and_writable() {
        let mut buffer = HostBuffer::allocate(10_000).unwrap();
        assert_eq!(buffer.as_ptr() as usize % HOST_BUFFER_ALIGN, 0);
        assert!(buffer.as_slice().unwrap().iter().all(|&byte| byte == 0));
        buffer.as_mut_slice().unwrap()[9_999] = 7;
        assert_eq!(buffer.as_slice().unwrap()[9_999], 7);
    }

    #[test]
    fn virtual_buffers_have_no_bytes() {
        let buffer = HostBuffer::virtual_buffer(1 << 40);
        assert!(buffer.is_virtual());
        assert!(buffer.as_slice().is_none());
        assert_eq!(buffer.len(), 1 << 40);
    }
}
