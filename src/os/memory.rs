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
