//! Host memory for the CPU backend's "VRAM": reserved, not committed.
//!
//! The VRAM allocator takes its whole budget as one arena at session start. On the CPU
//! backend that arena is host memory, and allocating it with `alloc_zeroed` touches
//! every page: `--vram-budget 8GiB` on a 256 MiB model cost 8 GiB of RSS and seconds
//! of zeroing before the first step. An anonymous `MAP_NORESERVE` mapping instead
//! costs nothing until a page is first written (the kernel hands out zeroed pages on
//! demand), so RSS follows what the plan places in the arena, not the budget.

use std::ptr::NonNull;

pub use crate::os::{available_ram_bytes, total_ram_bytes};

/// An anonymous private mapping of `len` bytes, readable and writable, whose pages
/// are committed as they are first touched. Unmapped on drop.
pub struct ReservedMemory {
    pointer: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned exclusively by this value; moving it between threads
// moves that ownership. Concurrent access to its bytes is arbitrated by the VRAM
// allocator (one load per range at a time), as for any device memory.
unsafe impl Send for ReservedMemory {}
// SAFETY: `&ReservedMemory` only exposes the address and the length.
unsafe impl Sync for ReservedMemory {}

impl ReservedMemory {
    /// Reserves `len` bytes (at least one page). Fails only when the address space or
    /// the kernel's overcommit policy refuses the mapping.
    pub fn reserve(len: usize) -> std::io::Result<Self> {
        let len = len.max(1);
        // SAFETY: a fresh anonymous mapping at an address the kernel picks; no file
        // descriptor, no existing memory is affected.
        let pointer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if pointer == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let pointer = NonNull::new(pointer.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null mapping"))?;
        Ok(Self { pointer, len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.pointer.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for ReservedMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping was created in `reserve` with this address and length,
        // and is unmapped once, here.
        unsafe {
            libc::munmap(self.pointer.as_ptr().cast(), self.len);
        }
    }
}

/// Resident set size of this process (`VmRSS`), if known.
pub fn resident_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = text.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
