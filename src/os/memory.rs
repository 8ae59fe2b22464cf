//! Host memory as the kernel reports it (`/proc/meminfo`).

/// Free host memory the kernel could give us now (`MemAvailable`), if known.
pub fn available_ram_bytes() -> Option<u64> {
    meminfo_bytes("MemAvailable:")
}

/// The host's physical memory (`MemTotal`), if known.
pub fn total_ram_bytes() -> Option<u64> {
    meminfo_bytes("MemTotal:")
}

/// The `/proc/meminfo` line starting with `key`, in bytes (the file gives KiB).
fn meminfo_bytes(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Asks the kernel to back `length` bytes from `start` with transparent huge pages
/// where it can (their 2 MiB-aligned parts; Linux's default `madvise` mode grants them
/// only on request). Call it on a large buffer of the caller's own before its first
/// touch: filling a fresh 7 MiB reference block faulted in 1 700 small pages, more
/// time than copying its bytes. Advice only: it changes how memory is backed, never
/// its contents, and is a no-op where there are no huge pages.
pub fn advise_huge_pages(start: *mut u8, length: usize) {
    const HUGE_PAGE_BYTES: usize = 2 << 20;
    let first = (start as usize).next_multiple_of(HUGE_PAGE_BYTES);
    let end = (start as usize + length) & !(HUGE_PAGE_BYTES - 1);
    if first < end {
        // SAFETY: madvise reads and writes no memory; MADV_HUGEPAGE on a range the
        // caller owns changes only how the kernel backs it.
        let _ =
            unsafe { libc::madvise(first as *mut libc::c_void, end - first, libc::MADV_HUGEPAGE) };
    }
}

/// Writes back and drops every cache line of `bytes` from the CPU's caches, so the
/// next read of them comes from memory: what a calibration does to time a kernel or a
/// copy on data as cold as a run meets it (a weight copied in with non-temporal
/// stores, a pinned block last touched a step ago). A no-op off x86-64.
pub fn flush_from_caches(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_clflush, _mm_mfence};
        const LINE_BYTES: usize = 64;
        for line in bytes.chunks(LINE_BYTES) {
            // SAFETY: `line` points into `bytes`, which is readable; clflush (SSE2, in
            // every x86-64 CPU) only drops the line from the caches.
            unsafe { _mm_clflush(line.as_ptr()) };
        }
        // SAFETY: a fence has no preconditions; it orders the flushes before what follows.
        unsafe { _mm_mfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Gives the allocator's freed memory back to the kernel: glibc's malloc keeps what a
/// job freed in its per-thread arenas (each stage's session starts threads that
/// allocate there), so a server making one image or video after another grew by
/// ~19 KiB a job in a soak (images alone: 69 → 84 MiB in 800 jobs) though nothing
/// leaked — `malloc_trim(0)` then took it from 90 to 67 MiB. Costs about a
/// millisecond; a no-op where the allocator is not glibc's.
pub fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and only returns free pages of the
    // allocator's own heaps to the kernel; it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}
