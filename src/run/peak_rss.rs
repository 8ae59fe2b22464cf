//! The process's peak resident set, counted from where the run starts: what the
//! summary holds against the memory the budgets account for.
//!
//! A run on the CPU backend that measures the roofline first (a fresh cache, an
//! unoptimised build) holds that measurement's buffers for a moment — a 256 MiB scan,
//! the copy's 128 MiB — which are not the run's: counted, they made "peak RSS 283 MiB
//! (ABOVE the 78 MiB the budgets account for)" on a run whose identical rerun held
//! 31 MiB. So the roofline is taken before the run, and the kernel's high-water mark
//! is reset after it (`/proc/self/clear_refs`, Linux 4.0+); where it cannot be reset,
//! the bytes the measurement added to the peak are counted beside the budgets.

use std::path::Path;

use super::roofline::{Obtained, Roofline};

/// The roofline a run is bounded by, taken before the run starts.
pub struct RooflineBeforeRun {
    pub obtained: Obtained,
    /// Bytes the measurement added to the process's peak resident set that could not
    /// be reset away (0 when the peak was reset, or nothing was measured).
    pub peak_rss_bytes_left: u64,
}

/// Takes the roofline from `cache_dir` or measures it, then resets the peak resident
/// set if the measurement raised it.
pub fn roofline_before_run(cache_dir: &Path) -> RooflineBeforeRun {
    let before = resident_bytes();
    let obtained = Roofline::of_this_machine(cache_dir);
    let peak_rss_bytes_left = if obtained.measured_now && !reset_peak_rss() {
        peak_rss_bytes()
            .zip(before)
            .map_or(0, |(peak, before)| peak.saturating_sub(before))
    } else {
        0
    };
    RooflineBeforeRun {
        obtained,
        peak_rss_bytes_left,
    }
}

/// The process's peak resident set since it started or since the last reset
/// (`VmHWM`), where the system reports it (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// The process's resident set now (`VmRSS`).
pub fn resident_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

/// Makes the peak resident set start again from the resident set now (writing 5 to
/// `/proc/self/clear_refs`); whether it was reset.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// A `/proc/self/status` line's size (in kB there), in bytes.
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
