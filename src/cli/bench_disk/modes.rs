//! How each mode reads the file: dd as the reference, the staging ring over an
//! O_DIRECT or pread storage, and mmap-and-touch; each with the memory it grew by.

use std::convert::Infallible;
use std::fs::File;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::Context;
use stagehand_actors::Bytes;

use super::report::ModeResult;
use super::BenchDiskArgs;
use stagehand::actors::{Extent, FileId, HostBuffer, Storage};
use stagehand::storage::{cached_bytes, drop_page_cache, stream_block, StagingRing};

/// The page cache counts as dropped when at most this share of the file is still cached.
const COLD_CACHE_TOLERANCE: f64 = 0.01;

/// Flushes and drops the file's page cache; says so when some of it stayed cached.
pub(super) fn make_cold(path: &Path, file_bytes: u64) -> Option<String> {
    // Dirty pages cannot be dropped: write them back first (a no-op for an old file).
    if let Ok(file) = File::open(path) {
        let _ = file.sync_data();
    }
    if let Err(error) = drop_page_cache(path, 0, 0) {
        return Some(format!(
            "could not drop the page cache ({error}): warm read"
        ));
    }
    match cached_bytes(path) {
        Ok(still_cached) if (still_cached as f64) > COLD_CACHE_TOLERANCE * file_bytes as f64 => {
            Some(format!(
                "could not drop the page cache: {} of the file still cached",
                Bytes(still_cached)
            ))
        }
        Ok(_) => None,
        Err(error) => Some(format!("cache state unknown: {error}")),
    }
}

/// Reads `bytes` from the start of the file through a staging ring (no copy out).
pub(super) fn measure_ring(
    runtime: &tokio::runtime::Runtime,
    storage: &dyn Storage,
    mode: &'static str,
    bytes: u64,
    args: &BenchDiskArgs,
) -> anyhow::Result<ModeResult> {
    let before = MemorySnapshot::now();
    let buffers = (0..args.staging_buffers)
        .map(|_| HostBuffer::allocate(args.staging_buffer_size.as_u64() as usize))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ring = StagingRing::new(buffers)?;
    let extents = vec![Extent {
        file: FileId(0),
        offset: 0,
        length: bytes,
    }];
    let started = Instant::now();
    runtime
        .block_on(stream_block(
            storage,
            extents,
            &mut ring,
            |slot: HostBuffer, _offset: u64, _bytes: u64| async move {
                Ok::<_, (Infallible, HostBuffer)>(slot)
            },
        ))
        .with_context(|| format!("{mode} read failed"))?;
    let seconds = started.elapsed().as_secs_f64();
    let after = MemorySnapshot::now();
    drop(ring);
    Ok(mode_result(mode, bytes, seconds, &before, &after))
}

/// Maps the file and reads one byte per page, the way a naive mmap loader faults it in.
pub(super) fn measure_mmap(path: &Path, bytes: u64) -> anyhow::Result<ModeResult> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let before = MemorySnapshot::now();
    let started = Instant::now();
    // SAFETY: a read-only private mapping of a file we do not write; if another process
    // truncated it during the bench the touch could fault (SIGBUS) — acceptable for a
    // benchmark tool, and why the read paths stagehand runs on never use mmap.
    let mapping = unsafe { memmap2::Mmap::map(&file) }
        .with_context(|| format!("cannot mmap {}", path.display()))?;
    let touched = &mapping[..bytes as usize];
    let mut checksum = 0u64;
    for offset in (0..touched.len()).step_by(4096) {
        checksum = checksum.wrapping_add(u64::from(touched[offset]));
    }
    std::hint::black_box(checksum);
    let seconds = started.elapsed().as_secs_f64();
    let after = MemorySnapshot::now();
    drop(mapping);
    Ok(mode_result("mmap_touch", bytes, seconds, &before, &after))
}

/// Runs `dd ... iflag=direct` on the same range and times it from here. Without the
/// reference there is nothing to compare with: a dd that cannot run or fails is an
/// error, in one line (dd's own message, flattened).
pub(super) fn run_dd(path: &Path, bytes: u64, file_bytes: u64) -> Result<ModeResult, String> {
    let before = MemorySnapshot::now();
    let mut command = Command::new("dd");
    command
        .arg(format!("if={}", path.display()))
        .arg("of=/dev/null")
        .arg("bs=8M");
    if bytes < file_bytes {
        command
            .arg("iflag=direct,count_bytes")
            .arg(format!("count={bytes}"));
    } else {
        command.arg("iflag=direct");
    }
    let started = Instant::now();
    let output = command.output();
    let seconds = started.elapsed().as_secs_f64();
    let after = MemorySnapshot::now();
    let output = output.map_err(|error| {
        format!("could not run dd, the reference read ({error}); install coreutils' dd")
    })?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        let said: Vec<&str> = stderr
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty())
            .collect();
        return Err(format!(
            "dd, the reference read, failed ({}): {}; O_DIRECT needs a filesystem that supports it (not tmpfs): bench a file on the disk to measure",
            output.status,
            said.join(" / ")
        ));
    }
    // dd's last line: "1073741824 bytes (1.1 GB, 1.0 GiB) copied, 0.52 s, 2.1 GB/s".
    let copied_bytes = stderr
        .lines()
        .find(|line| line.contains("copied"))
        .and_then(|line| line.split_whitespace().next())
        .and_then(|count| count.parse::<u64>().ok());
    match copied_bytes {
        Some(copied) => {
            let mut result = mode_result("dd_direct", copied, seconds, &before, &after);
            result.rss_growth_bytes = None;
            Ok(result)
        }
        None => Err(format!(
            "could not read dd's byte count from its output: {}",
            stderr.trim().replace('\n', " / ")
        )),
    }
}

fn mode_result(
    mode: &'static str,
    bytes: u64,
    seconds: f64,
    before: &MemorySnapshot,
    after: &MemorySnapshot,
) -> ModeResult {
    let gb_per_second = if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    };
    ModeResult {
        mode,
        bytes,
        seconds,
        gb_per_second,
        ratio_to_dd: None,
        rounds_gb_per_second: Vec::new(),
        rss_growth_bytes: Some(after.rss_bytes as i64 - before.rss_bytes as i64),
        page_cache_growth_bytes: after.cached_bytes as i64 - before.cached_bytes as i64,
        notes: Vec::new(),
    }
}

/// Our resident set and the system's page cache, from /proc (0 where unreadable).
struct MemorySnapshot {
    rss_bytes: u64,
    cached_bytes: u64,
}

impl MemorySnapshot {
    fn now() -> Self {
        Self {
            rss_bytes: proc_kib_field("/proc/self/status", "VmRSS:") * 1024,
            cached_bytes: proc_kib_field("/proc/meminfo", "Cached:") * 1024,
        }
    }
}

/// The value of a "Name:   1234 kB" line.
fn proc_kib_field(path: &str, field: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with(field))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|value| value.parse().ok())
        })
        .unwrap_or(0)
}
