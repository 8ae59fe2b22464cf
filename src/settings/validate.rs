//! Rules a merged configuration must satisfy, with messages that name the key.

use bytesize::ByteSize;
use regex::Regex;
use stagehand_actors::Bytes;

use super::error::SettingsError;
use super::Settings;

/// Free RAM never drops below this, whatever the configuration says: the OS, the page
/// cache and the rest of the process need it, and a swapping host is slower than any
/// offload.
pub const MIN_RAM_FLOOR: ByteSize = ByteSize::gib(2);

/// Direct I/O needs sizes aligned to the logical block size; 4 KiB covers NVMe and SATA.
pub const IO_ALIGN_BYTES: u64 = 4096;

const MAX_PREFETCH_DEPTH: u32 = 64;
const MAX_STAGING_BUFFERS: u32 = 64;
const MAX_READER_THREADS: u32 = 64;

/// One rule broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Invalid {
    pub key: &'static str,
    pub value: String,
    pub reason: String,
}

/// Raises values that have a hard minimum; returns (key, note) for each change.
pub(crate) fn clamp(settings: &mut Settings) -> Vec<(&'static str, String)> {
    let mut notes = Vec::new();
    if settings.ram_floor < MIN_RAM_FLOOR {
        notes.push((
            "ram_floor",
            format!(
                "raised from {} to the {} minimum",
                Bytes(settings.ram_floor.as_u64()),
                Bytes(MIN_RAM_FLOOR.as_u64())
            ),
        ));
        settings.ram_floor = MIN_RAM_FLOOR;
    }
    notes
}

impl Settings {
    /// Checks every rule; the error names the key, its value and what is allowed.
    /// (`ram_floor` below 2 GiB is not an error: loading raises it.)
    pub fn validate(&self) -> Result<(), SettingsError> {
        self.check().map_err(|invalid| SettingsError::Invalid {
            key: invalid.key.to_string(),
            value: invalid.value,
            reason: invalid.reason,
        })
    }

    pub(crate) fn check(&self) -> Result<(), Invalid> {
        let fail =
            |key: &'static str, value: String, reason: String| Err(Invalid { key, value, reason });
        if self.vram_budget.is_some_and(|size| size.as_u64() == 0) {
            return fail(
                "vram_budget",
                "0".to_string(),
                "must be more than 0; leave it unset to use the device total minus reserve_vram \
                 and vram_headroom"
                    .to_string(),
            );
        }
        if self.pin_ceiling.is_some_and(|size| size.as_u64() == 0) {
            return fail(
                "pin_ceiling",
                "0".to_string(),
                "must be more than 0; leave it unset to derive it from free RAM minus ram_floor"
                    .to_string(),
            );
        }
        // 0 is no prefetch (one ring slot): best when the step is disk-bound with
        // nothing to overlap, as `stagehand simulate` finds.
        check_range("prefetch_depth", self.prefetch_depth, 0, MAX_PREFETCH_DEPTH)?;
        check_range(
            "staging_buffers",
            self.staging_buffers,
            2,
            MAX_STAGING_BUFFERS,
        )?;
        check_range("reader_threads", self.reader_threads, 1, MAX_READER_THREADS)?;
        if let Some(threads) = self.compute_threads {
            let cores = super::machine_cores() as u32;
            check_range("compute_threads", threads, 1, cores).map_err(|invalid| Invalid {
                reason: format!(
                    "{} (this machine has {cores} cores); leave it unset for every core",
                    invalid.reason
                ),
                ..invalid
            })?;
        }
        check_aligned("staging_buffer_size", self.staging_buffer_size)?;
        check_aligned("read_request_size", self.read_request_size)?;
        if self.read_request_size > self.staging_buffer_size {
            return fail(
                "read_request_size",
                Bytes(self.read_request_size.as_u64()).to_string(),
                format!(
                    "must not exceed staging_buffer_size ({}): one read fills at most one buffer",
                    Bytes(self.staging_buffer_size.as_u64())
                ),
            );
        }
        if let Some(pattern) = &self.block_pattern {
            check_block_pattern(pattern).map_err(|reason| Invalid {
                key: "block_pattern",
                value: pattern.clone(),
                reason,
            })?;
        }
        if let Some(path) = &self.trace {
            check_trace_path(path).map_err(|reason| Invalid {
                key: "trace",
                value: path.display().to_string(),
                reason,
            })?;
        }
        if !is_log_filter(&self.log) {
            return fail(
                "log",
                self.log.clone(),
                "not a log filter; use e.g. info, warn, or stagehand=debug".to_string(),
            );
        }
        Ok(())
    }
}

/// Whether `filter` is a log filter `tracing-subscriber` accepts. Only printable ASCII
/// is handed to its parser: tracing-subscriber 0.3.23 trims the filter, then slices
/// the untrimmed text at the trimmed text's offsets, which panics when leading
/// whitespace shifts a cut into a multi-byte character (found by the settings fuzz
/// target; `tests/settings.rs` keeps the input). Filters are Rust paths, levels and
/// field names: ASCII. The library alone (without the `cli` feature, so without a
/// subscriber of its own) checks only that much: the filter is its embedder's to parse.
pub fn is_log_filter(filter: &str) -> bool {
    let plain = filter
        .bytes()
        .all(|byte| byte.is_ascii_graphic() || byte == b' ')
        && filter.trim() == filter;
    #[cfg(feature = "cli")]
    let plain = plain && tracing_subscriber::EnvFilter::try_new(filter).is_ok();
    plain
}

fn check_range(key: &'static str, value: u32, min: u32, max: u32) -> Result<(), Invalid> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    Err(Invalid {
        key,
        value: value.to_string(),
        reason: format!("must be between {min} and {max}"),
    })
}

fn check_aligned(key: &'static str, size: ByteSize) -> Result<(), Invalid> {
    let bytes = size.as_u64();
    if bytes > 0 && bytes % IO_ALIGN_BYTES == 0 {
        return Ok(());
    }
    Err(Invalid {
        key,
        value: Bytes(bytes).to_string(),
        reason: format!(
            "must be a non-zero multiple of 4 KiB ({bytes} bytes is not); direct I/O needs \
             aligned sizes, so write e.g. 4MiB rather than 4MB"
        ),
    })
}

/// The trace is written when the run ends: a path it cannot be written to is refused
/// before the run, not after it.
fn check_trace_path(path: &std::path::Path) -> Result<(), String> {
    if path.is_dir() {
        return Err("is a folder; give the trace file's path, e.g. trace.json".to_string());
    }
    let parent = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty());
    match parent {
        Some(parent) if !parent.is_dir() => Err(format!(
            "its folder {} does not exist; create it or write the trace elsewhere",
            parent.display()
        )),
        _ => Ok(()),
    }
}

/// A block pattern must compile and have a capture group (its text is the block key).
pub fn check_block_pattern(pattern: &str) -> Result<(), String> {
    let regex = Regex::new(pattern).map_err(|error| {
        format!(
            "not a valid regex ({})",
            error.to_string().lines().last().unwrap_or("").trim()
        )
    })?;
    if regex.captures_len() < 2 {
        return Err(
            "needs a capture group; its text is the block key, e.g. layers\\.(\\d+)\\.".to_string(),
        );
    }
    Ok(())
}
