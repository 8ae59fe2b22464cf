//! Reads from the filesystem the model lives on, through the storage adapters a run
//! uses: buffered `pread` after the file's pages were dropped (`posix_fadvise
//! DONTNEED`, checked with `mincore`, as `bench disk` does), the same reads with the
//! page cache warm, O_DIRECT (`--fast-disk`), and the latency of one small request.
//!
//! It reads an existing file when given one (nothing is written: a read-only
//! filesystem is fine), else writes a scratch file in the directory and removes it.
//! A filesystem that refuses a step (read-only, full, no O_DIRECT) skips that
//! measurement with the reason; the others still run.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use stagehand_actors::{Extent, FileId, HostBuffer, Storage};

use super::{median, Measured, Skipped};
use crate::storage::{
    advise_dont_need, cached_bytes, DirectStorage, PreadStorage, StorageFile, StorageOptions,
};

/// Bytes written per `write` call of the scratch file.
const WRITE_CHUNK_BYTES: usize = 4 << 20;
/// Size of one small request in the latency probe.
const PROBE_BYTES: u64 = 4096;
/// Small requests per latency measurement.
const PROBES: usize = 48;

/// Where and how much to read.
#[derive(Debug, Clone)]
pub struct DiskOptions {
    /// The scratch file is written here (the model's directory).
    pub dir: PathBuf,
    /// Read this existing file instead of writing a scratch file.
    pub file: Option<PathBuf>,
    /// Bytes to read per pass (the scratch file's size).
    pub bytes: u64,
    /// Bytes of each read (a block or a staging buffer).
    pub read_bytes: u64,
    /// Passes of each kind; each figure is the median pass.
    pub rounds: usize,
    pub storage: StorageOptions,
}

impl DiskOptions {
    pub fn new(dir: PathBuf, bytes: u64) -> Self {
        Self {
            dir,
            file: None,
            bytes,
            read_bytes: 64 << 20,
            rounds: 3,
            storage: StorageOptions::default(),
        }
    }
}

/// What the disk measurements found; each figure is `None` when it was skipped.
#[derive(Debug, Clone, Serialize)]
pub struct DiskFigures {
    /// The file read.
    pub path: String,
    pub buffered_cold: Option<Measured>,
    pub page_cache: Option<Measured>,
    pub direct: Option<Measured>,
    /// Seconds of one 4 KiB read at a random offset, through the adapter (median).
    pub request_latency_seconds: Option<f64>,
    pub request_latency_how: String,
    pub skipped: Vec<Skipped>,
    /// Caveats (pages the kernel would not drop, ...).
    pub notes: Vec<String>,
}

impl DiskFigures {
    pub fn measured_anything(&self) -> bool {
        self.buffered_cold.is_some() || self.page_cache.is_some() || self.direct.is_some()
    }
}

/// Runs the disk measurements; never fails as a whole (skips say what did not run).
pub fn measure_disk(options: &DiskOptions) -> DiskFigures {
    let mut figures = DiskFigures {
        path: String::new(),
        buffered_cold: None,
        page_cache: None,
        direct: None,
        request_latency_seconds: None,
        request_latency_how: String::new(),
        skipped: Vec::new(),
        notes: Vec::new(),
    };
    let target = match &options.file {
        Some(path) => match existing_file(path, options.bytes) {
            Ok(target) => target,
            Err(reason) => {
                skip_all(&mut figures, &reason);
                return figures;
            }
        },
        None => match ScratchFile::write(&options.dir, options.bytes) {
            Ok(scratch) => Target::Scratch(scratch),
            Err(reason) => {
                skip_all(&mut figures, &reason);
                return figures;
            }
        },
    };
    figures.path = target.path().display().to_string();
    let bytes = target.bytes();
    let files = [StorageFile {
        path: target.path().to_path_buf(),
        expected_bytes: target.file_bytes(),
    }];
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            skip_all(&mut figures, &format!("no runtime: {error}"));
            return figures;
        }
    };
    let buffered: Arc<dyn Storage> = match PreadStorage::open(&files, &options.storage) {
        Ok(storage) => Arc::new(storage),
        Err(error) => {
            skip_all(&mut figures, &error.to_string());
            return figures;
        }
    };
    let read_bytes = options.read_bytes.min(bytes).max(PROBE_BYTES);
    let mut buffer = match HostBuffer::allocate(read_bytes as usize) {
        Ok(buffer) => buffer,
        Err(error) => {
            skip_all(&mut figures, &format!("a read buffer: {error}"));
            return figures;
        }
    };
    let pass = |storage: &Arc<dyn Storage>,
                buffer: HostBuffer|
     -> Result<(HostBuffer, f64), (String, HostBuffer)> {
        let started = Instant::now();
        let mut buffer = buffer;
        let mut offset = 0;
        while offset < bytes {
            let length = read_bytes.min(bytes - offset);
            let extent = Extent {
                file: FileId(0),
                offset,
                length,
            };
            buffer = runtime
                .block_on(storage.read(vec![extent], buffer, 0))
                .map_err(|(error, buffer)| (error.to_string(), buffer))?;
            offset += length;
        }
        Ok((buffer, started.elapsed().as_secs_f64()))
    };
    let describe = |what: &str| {
        format!(
            "{} of {} read {what} in {} reads of {} through the storage adapter ({} reader threads, {} requests), {} passes; median pass",
            stagehand_actors::Bytes(bytes),
            figures.path,
            bytes.div_ceil(read_bytes),
            stagehand_actors::Bytes(read_bytes),
            options.storage.reader_threads,
            stagehand_actors::Bytes(options.storage.read_request_bytes),
            options.rounds
        )
    };

    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut still_cached = 0u64;
    for _ in 0..options.rounds.max(1) {
        match drop_pages(target.path()) {
            Ok(left) => still_cached = still_cached.max(left),
            Err(reason) => {
                figures.skipped.push(Skipped {
                    measurement: "disk.buffered_cold".to_string(),
                    reason,
                });
                break;
            }
        }
        match pass(&buffered, buffer) {
            Ok((returned, seconds)) => {
                buffer = returned;
                cold.push(seconds);
            }
            Err((reason, returned)) => {
                buffer = returned;
                figures.skipped.push(Skipped {
                    measurement: "disk.buffered_cold".to_string(),
                    reason,
                });
                break;
            }
        }
        match pass(&buffered, buffer) {
            Ok((returned, seconds)) => {
                buffer = returned;
                warm.push(seconds);
            }
            Err((_, returned)) => buffer = returned,
        }
    }
    if still_cached > bytes / 10 {
        figures.notes.push(format!(
            "the kernel kept {} of the file cached after posix_fadvise(DONTNEED): the cold figure is partly the page cache's",
            stagehand_actors::Bytes(still_cached)
        ));
    }
    if !cold.is_empty() {
        figures.buffered_cold = Some(Measured::rate(
            bytes as f64,
            &cold,
            describe("with buffered pread after posix_fadvise(DONTNEED) dropped its pages"),
        ));
    }
    if !warm.is_empty() {
        figures.page_cache = Some(Measured::rate(
            bytes as f64,
            &warm,
            describe("with buffered pread right after a cold pass (the page cache holds it)"),
        ));
    }

    match DirectStorage::open(&files, &options.storage) {
        Ok(direct) if direct.is_direct() => {
            let direct: Arc<dyn Storage> = Arc::new(direct);
            let mut seconds = Vec::new();
            for _ in 0..options.rounds.max(1) {
                match pass(&direct, buffer) {
                    Ok((returned, elapsed)) => {
                        buffer = returned;
                        seconds.push(elapsed);
                    }
                    Err((reason, returned)) => {
                        buffer = returned;
                        figures.skipped.push(Skipped {
                            measurement: "disk.direct".to_string(),
                            reason: format!("an O_DIRECT read failed: {reason}"),
                        });
                        break;
                    }
                }
            }
            if !seconds.is_empty() {
                figures.direct = Some(Measured::rate(
                    bytes as f64,
                    &seconds,
                    describe("with O_DIRECT (the --fast-disk path, no page cache)"),
                ));
            }
            let (latency, how) = request_latency(&runtime, &direct, bytes, buffer, "O_DIRECT");
            figures.request_latency_seconds = latency;
            figures.request_latency_how = how;
        }
        Ok(_) => {
            figures.skipped.push(Skipped {
                measurement: "disk.direct".to_string(),
                reason: format!(
                    "the filesystem of {} refuses O_DIRECT (tmpfs or a network filesystem?)",
                    figures.path
                ),
            });
            if drop_pages(target.path()).is_ok() {
                let (latency, how) = request_latency(
                    &runtime,
                    &buffered,
                    bytes,
                    buffer,
                    "buffered, pages dropped",
                );
                figures.request_latency_seconds = latency;
                figures.request_latency_how = how;
            }
        }
        Err(error) => figures.skipped.push(Skipped {
            measurement: "disk.direct".to_string(),
            reason: format!("cannot open with O_DIRECT: {error}"),
        }),
    }
    figures
}

/// Median time of small reads at scattered offsets (each pays a request's latency).
fn request_latency(
    runtime: &tokio::runtime::Runtime,
    storage: &Arc<dyn Storage>,
    bytes: u64,
    mut buffer: HostBuffer,
    how: &str,
) -> (Option<f64>, String) {
    let pages = (bytes / PROBE_BYTES).max(1);
    let mut random = crate::sim::SplitMix64::new(0x9e37_79b9_7f4a_7c15);
    let mut seconds = Vec::with_capacity(PROBES);
    for _ in 0..PROBES {
        let offset = (random.next_u64() % pages) * PROBE_BYTES;
        let extent = Extent {
            file: FileId(0),
            offset,
            length: PROBE_BYTES,
        };
        let started = Instant::now();
        match runtime.block_on(storage.read(vec![extent], buffer, 0)) {
            Ok(returned) => buffer = returned,
            Err((_, returned)) => {
                buffer = returned;
                continue;
            }
        }
        seconds.push(started.elapsed().as_secs_f64());
    }
    if seconds.is_empty() {
        return (None, "every small read failed".to_string());
    }
    (
        Some(median(&seconds)),
        format!(
            "{} reads of 4 KiB at scattered offsets ({how}) through the storage adapter; median",
            seconds.len()
        ),
    )
}

/// Drops the file's pages and returns how many bytes the kernel still keeps cached.
fn drop_pages(path: &Path) -> Result<u64, String> {
    let file =
        File::open(path).map_err(|error| format!("cannot open {}: {error}", path.display()))?;
    // Dirty pages are not dropped: write them back first (a fresh scratch file).
    let _ = file.sync_data();
    advise_dont_need(&file, 0, 0)
        .map_err(|error| format!("posix_fadvise(DONTNEED) on {}: {error}", path.display()))?;
    Ok(cached_bytes(path).unwrap_or(0))
}

fn skip_all(figures: &mut DiskFigures, reason: &str) {
    for measurement in [
        "disk.buffered_cold",
        "disk.page_cache",
        "disk.direct",
        "disk.request_latency",
    ] {
        figures.skipped.push(Skipped {
            measurement: measurement.to_string(),
            reason: reason.to_string(),
        });
    }
}

/// The file read: the user's, or a scratch file removed on drop.
enum Target {
    Existing {
        path: PathBuf,
        bytes: u64,
        file_bytes: u64,
    },
    Scratch(ScratchFile),
}

impl Target {
    fn path(&self) -> &Path {
        match self {
            Target::Existing { path, .. } => path,
            Target::Scratch(scratch) => &scratch.path,
        }
    }

    /// Bytes each pass reads.
    fn bytes(&self) -> u64 {
        match self {
            Target::Existing { bytes, .. } => *bytes,
            Target::Scratch(scratch) => scratch.bytes,
        }
    }

    fn file_bytes(&self) -> u64 {
        match self {
            Target::Existing { file_bytes, .. } => *file_bytes,
            Target::Scratch(scratch) => scratch.bytes,
        }
    }
}

fn existing_file(path: &Path, wanted: u64) -> Result<Target, String> {
    let metadata = std::fs::metadata(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let file_bytes = metadata.len();
    // Whole 4 KiB pages only, so O_DIRECT passes read aligned lengths.
    let bytes = wanted.min(file_bytes) / PROBE_BYTES * PROBE_BYTES;
    if bytes < PROBE_BYTES {
        return Err(format!(
            "{} has {file_bytes} bytes: too small to time reads on",
            path.display()
        ));
    }
    Ok(Target::Existing {
        path: path.to_path_buf(),
        bytes,
        file_bytes,
    })
}

/// A file of seeded bytes written for the measurement and removed afterwards.
struct ScratchFile {
    path: PathBuf,
    bytes: u64,
}

impl ScratchFile {
    fn write(dir: &Path, bytes: u64) -> Result<Self, String> {
        let bytes = bytes.max(PROBE_BYTES) / PROBE_BYTES * PROBE_BYTES;
        let path = dir.join(format!(".stagehand-calibrate-{}.bin", std::process::id()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|error| why_not_written(dir, &error))?;
        let scratch = Self { path, bytes };
        let mut chunk = vec![0u8; WRITE_CHUNK_BYTES];
        let mut random = crate::sim::SplitMix64::new(bytes);
        let mut written = 0u64;
        while written < bytes {
            let length = (bytes - written).min(WRITE_CHUNK_BYTES as u64) as usize;
            for word in chunk[..length].chunks_mut(8) {
                let value = random.next_u64().to_le_bytes();
                word.copy_from_slice(&value[..word.len()]);
            }
            file.write_all(&chunk[..length])
                .map_err(|error| why_not_written(dir, &error))?;
            written += length as u64;
        }
        file.sync_all()
            .map_err(|error| why_not_written(dir, &error))?;
        Ok(scratch)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The reason a scratch file could not be written, in words a user can act on.
fn why_not_written(dir: &Path, error: &io::Error) -> String {
    let dir = dir.display();
    match error.raw_os_error() {
        Some(libc::EROFS) => format!(
            "{dir} is on a read-only filesystem; give an existing file there with --file to measure reads without writing"
        ),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => format!(
            "the filesystem of {dir} is full (or over quota): free some space, lower --disk-bytes, or give an existing file with --file"
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "no permission to write in {dir}; give an existing file there with --file"
        ),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => format!("{dir} is not a directory"),
        _ => format!("cannot write a scratch file in {dir}: {error}"),
    }
}
