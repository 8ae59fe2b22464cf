//! Reads from the filesystem the model lives on, through the storage adapters a run
//! uses: buffered `pread` after the file's pages were dropped (`posix_fadvise
//! DONTNEED`, checked with `mincore`, as `bench disk` does), the same reads with the
//! page cache warm, O_DIRECT (`--fast-disk`), and the latency of one small request.
//!
//! It reads an existing file when given one (nothing is written: a read-only
//! filesystem is fine), else writes a scratch file in the directory and removes it.
//! A filesystem that refuses a step (read-only, full, no O_DIRECT) skips that
//! measurement with the reason; the others still run.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use stagehand_actors::{Extent, FileId, HostBuffer, Storage};

use super::{median, Measured, Skipped};
use crate::storage::{
    advise_dont_need, cached_bytes, DirectStorage, PreadStorage, StorageFile, StorageOptions,
};

mod target;
use target::{existing_file, ScratchFile, Target};

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
    let target = match open_target(options) {
        Ok(target) => target,
        Err(reason) => {
            skip_all(&mut figures, &reason);
            return figures;
        }
    };
    figures.path = target.path().display().to_string();
    let (reader, buffer) = match Reader::open(&target, &figures.path, options) {
        Ok(opened) => opened,
        Err(reason) => {
            skip_all(&mut figures, &reason);
            return figures;
        }
    };
    let buffer = measure_buffered(&reader, &target, buffer, &mut figures);
    measure_direct(&reader, &target, buffer, &mut figures);
    figures
}

/// The user's file when given one, else a scratch file written in the directory.
fn open_target(options: &DiskOptions) -> Result<Target, String> {
    match &options.file {
        Some(path) => existing_file(path, options.bytes),
        None => ScratchFile::write(&options.dir, options.bytes).map(Target::Scratch),
    }
}

/// What every timed pass shares: the runtime the adapters' futures run on, the file
/// as the adapters see it, the buffered adapter, and how a pass cuts the file.
struct Reader<'a> {
    options: &'a DiskOptions,
    /// The file read, as the figures show it.
    path: String,
    // Fields drop in order: the adapter before the runtime its reads ran on.
    buffered: Arc<dyn Storage>,
    runtime: tokio::runtime::Runtime,
    files: [StorageFile; 1],
    /// Bytes each pass reads.
    bytes: u64,
    /// Bytes of each read.
    read_bytes: u64,
}

impl<'a> Reader<'a> {
    /// The runtime, the buffered adapter and a read buffer, in that order: the first
    /// that fails is the reason every measurement is skipped.
    fn open(
        target: &Target,
        path: &str,
        options: &'a DiskOptions,
    ) -> Result<(Self, HostBuffer), String> {
        let bytes = target.bytes();
        let files = [StorageFile {
            path: target.path().to_path_buf(),
            expected_bytes: target.file_bytes(),
        }];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| format!("no runtime: {error}"))?;
        let buffered: Arc<dyn Storage> = PreadStorage::open(&files, &options.storage)
            .map(|storage| Arc::new(storage) as Arc<dyn Storage>)
            .map_err(|error| error.to_string())?;
        let read_bytes = options.read_bytes.min(bytes).max(PROBE_BYTES);
        let buffer = HostBuffer::allocate(read_bytes as usize)
            .map_err(|error| format!("a read buffer: {error}"))?;
        let reader = Self {
            options,
            path: path.to_string(),
            buffered,
            runtime,
            files,
            bytes,
            read_bytes,
        };
        Ok((reader, buffer))
    }

    /// One timed pass over the file; the buffer comes back either way.
    fn pass(
        &self,
        storage: &Arc<dyn Storage>,
        mut buffer: HostBuffer,
    ) -> Result<(HostBuffer, f64), (String, HostBuffer)> {
        let started = Instant::now();
        let mut offset = 0;
        while offset < self.bytes {
            let length = self.read_bytes.min(self.bytes - offset);
            let extent = Extent {
                file: FileId(0),
                offset,
                length,
            };
            buffer = self
                .runtime
                .block_on(storage.read(vec![extent], buffer, 0))
                .map_err(|(error, buffer)| (error.to_string(), buffer))?;
            offset += length;
        }
        Ok((buffer, started.elapsed().as_secs_f64()))
    }

    /// How a figure was measured, `what` saying which way the file was read.
    fn describe(&self, what: &str) -> String {
        format!(
            "{} of {} read {what} in {} reads of {} through the storage adapter ({} reader threads, {} requests), {} passes; median pass",
            stagehand_actors::Bytes(self.bytes),
            self.path,
            self.bytes.div_ceil(self.read_bytes),
            stagehand_actors::Bytes(self.read_bytes),
            self.options.storage.reader_threads,
            stagehand_actors::Bytes(self.options.storage.read_request_bytes),
            self.options.rounds
        )
    }
}

/// Buffered passes, each cold one (pages dropped) followed by a warm one (the page
/// cache holds what the cold pass read); returns the buffer for the next phase.
fn measure_buffered(
    reader: &Reader,
    target: &Target,
    mut buffer: HostBuffer,
    figures: &mut DiskFigures,
) -> HostBuffer {
    let mut cold = Vec::new();
    let mut warm = Vec::new();
    let mut still_cached = 0u64;
    for _ in 0..reader.options.rounds.max(1) {
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
        match reader.pass(&reader.buffered, buffer) {
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
        match reader.pass(&reader.buffered, buffer) {
            Ok((returned, seconds)) => {
                buffer = returned;
                warm.push(seconds);
            }
            Err((_, returned)) => buffer = returned,
        }
    }
    record_buffered(reader, &cold, &warm, still_cached, figures);
    buffer
}

fn record_buffered(
    reader: &Reader,
    cold: &[f64],
    warm: &[f64],
    still_cached: u64,
    figures: &mut DiskFigures,
) {
    let bytes = reader.bytes;
    if still_cached > bytes / 10 {
        figures.notes.push(format!(
            "the kernel kept {} of the file cached after posix_fadvise(DONTNEED): the cold figure is partly the page cache's",
            stagehand_actors::Bytes(still_cached)
        ));
    }
    if !cold.is_empty() {
        figures.buffered_cold = Some(Measured::rate(
            bytes as f64,
            cold,
            reader.describe("with buffered pread after posix_fadvise(DONTNEED) dropped its pages"),
        ));
    }
    if !warm.is_empty() {
        figures.page_cache = Some(Measured::rate(
            bytes as f64,
            warm,
            reader
                .describe("with buffered pread right after a cold pass (the page cache holds it)"),
        ));
    }
}

/// O_DIRECT passes and the request latency through it; where the filesystem refuses
/// O_DIRECT, the latency is taken buffered with the pages dropped instead.
fn measure_direct(reader: &Reader, target: &Target, buffer: HostBuffer, figures: &mut DiskFigures) {
    match DirectStorage::open(&reader.files, &reader.options.storage) {
        Ok(direct) if direct.is_direct() => {
            let direct: Arc<dyn Storage> = Arc::new(direct);
            let buffer = time_direct(reader, &direct, buffer, figures);
            let (latency, how) =
                request_latency(&reader.runtime, &direct, reader.bytes, buffer, "O_DIRECT");
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
                    &reader.runtime,
                    &reader.buffered,
                    reader.bytes,
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
}

/// The O_DIRECT passes; returns the buffer for the latency probe.
fn time_direct(
    reader: &Reader,
    direct: &Arc<dyn Storage>,
    mut buffer: HostBuffer,
    figures: &mut DiskFigures,
) -> HostBuffer {
    let mut seconds = Vec::new();
    for _ in 0..reader.options.rounds.max(1) {
        match reader.pass(direct, buffer) {
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
            reader.bytes as f64,
            &seconds,
            reader.describe("with O_DIRECT (the --fast-disk path, no page cache)"),
        ));
    }
    buffer
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
