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
