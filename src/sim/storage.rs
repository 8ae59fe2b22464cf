//! The simulated disk: reads take time and move nothing.
//!
//! One disk serves one read at a time at its sequential bandwidth, so reads queue on
//! its timeline in the order they were issued. A read pays the request latency
//! (an NVMe command, an HDD seek) for every extent that does not continue where the
//! disk's previous extent ended: streaming a file front to back costs bandwidth only,
//! jumping around costs latency too.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use stagehand_actors::{Extent, FileId, HostBuffer, ModelLayout, OpFuture, Storage, StorageError};

use super::clock::{transfer_duration, SerialLane, SimClock};
use super::faults::{FaultPlan, Outcome, Perturber};
use super::first_touch::FirstTouch;
use super::shared::{Demand, SharedBus};
use crate::telemetry::trace::{Lane, TraceRecorder};

/// Sequential read rate and per-request latency of one disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DiskRates {
    pub bytes_per_second: u64,
    pub request_latency: Duration,
}

/// Counters of what the disk did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ReadStats {
    pub reads: u64,
    pub bytes: u64,
    pub failed: u64,
}

/// Perturbation stream of the disk (see [`FaultPlan::perturber`]).
const DISK_STREAM: u64 = 1;

pub struct SimStorage {
    disk: DiskRates,
    clock: Arc<SimClock>,
    lane: SerialLane,
    trace: Option<Arc<TraceRecorder>>,
    /// Where each block starts, to label reads and to check extents.
    /// Every block extent by (file, start): its end and the block's name.
    blocks: BTreeMap<(u32, u64), (u64, String)>,
    file_ends: HashMap<FileId, u64>,
    seed: u64,
    /// A shared-bus machine: reads run on the bus beside copies and compute.
    bus: Option<(Arc<SharedBus>, ReadCost)>,
    /// A read into a fresh pinned buffer also pays its page faults (CPU backend).
    first_touch: Option<Arc<FirstTouch>>,
    /// The disk reads from the page cache, and bytes whose pages were dropped
    /// (`forget_cached`) are read again at these rates, which caches them again.
    uncached: Option<DiskRates>,
    state: Mutex<DiskState>,
}

/// What a read asks of a shared bus while it runs at its solo rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadCost {
    /// Threads each of its requests keeps busy: 1 for a buffered read (the kernel
    /// copies the page cache into the buffer on the reader's thread), 0 for O_DIRECT
    /// (the disk's DMA).
    pub threads: f64,
    /// Bytes of memory traffic per byte read: 2 for a page-cache copy (a read and a
    /// write), 1 for DMA into the buffer.
    pub traffic_per_byte: f64,
    /// The storage splits a read into requests of this many bytes, served by up to
    /// `reader_threads` threads at once: a buffered read of 8 MiB in 4 MiB requests
    /// keeps two reader threads busy.
    pub request_bytes: u64,
    pub reader_threads: u64,
    /// How fast the reader threads copy the page cache into the buffer, bytes per
    /// second (a calibrated profile's `page_cache_gb_per_s`), when known. A buffered
    /// read keeps its threads busy only for that copy: the rest of its time they
    /// sleep on the disk. Unknown: busy for the whole read.
    pub copy_bytes_per_second: Option<f64>,
}

impl ReadCost {
    pub const BUFFERED: ReadCost = ReadCost {
        threads: 1.0,
        traffic_per_byte: 2.0,
        request_bytes: u64::MAX,
        reader_threads: 1,
        copy_bytes_per_second: None,
    };
    pub const DIRECT: ReadCost = ReadCost {
        threads: 0.0,
        traffic_per_byte: 1.0,
        request_bytes: u64::MAX,
        reader_threads: 1,
        copy_bytes_per_second: None,
    };

    /// O_DIRECT with `fast_disk`, else buffered.
    pub fn of(fast_disk: bool) -> Self {
        if fast_disk {
            Self::DIRECT
        } else {
            Self::BUFFERED
        }
    }

    /// Each read split into `request_bytes` requests over `reader_threads` threads.
    pub fn in_requests(self, request_bytes: u64, reader_threads: u64) -> Self {
        Self {
            request_bytes: request_bytes.max(1),
            reader_threads: reader_threads.max(1),
            ..self
        }
    }

    /// The same, its buffered reads' copies running at `bytes_per_second` (the page
    /// cache's rate; a non-positive or unknown rate leaves the threads busy for the
    /// whole read).
    pub fn copying_at(self, bytes_per_second: Option<f64>) -> Self {
        Self {
            copy_bytes_per_second: bytes_per_second.filter(|rate| rate.is_finite() && *rate > 0.0),
            ..self
        }
    }

    /// Threads a read of `bytes` taking `seconds` keeps busy, on average over the
    /// read: its requests' threads, for the share of the read their copy takes (a
    /// read from the page cache is all copy; a cold one mostly waits on the disk,
    /// which leaves the cores to the compute and the copy threads).
    pub fn threads_for(&self, bytes: u64, seconds: f64) -> f64 {
        let requests = bytes
            .div_ceil(self.request_bytes)
            .clamp(1, self.reader_threads);
        let busy = match self.copy_bytes_per_second {
            Some(rate) if seconds > 0.0 => (bytes as f64 / rate / seconds).min(1.0),
            _ => 1.0,
        };
        self.threads * requests as f64 * busy
    }
}

struct DiskState {
    /// Where the previous extent ended: a read continuing there pays no latency.
    position: Option<(FileId, u64)>,
    perturber: Perturber,
    stats: ReadStats,
    /// With `uncached`: the ranges whose pages were dropped, (file, start) → end,
    /// disjoint.
    dropped: BTreeMap<(u32, u64), u64>,
}

impl SimStorage {
    pub fn new(disk: DiskRates, clock: Arc<SimClock>, faults: &FaultPlan) -> Self {
        Self {
            disk,
            clock,
            lane: SerialLane::default(),
            trace: None,
            blocks: BTreeMap::new(),
            file_ends: HashMap::new(),
            seed: faults.seed,
            bus: None,
            first_touch: None,
            uncached: None,
            state: Mutex::new(DiskState {
                position: None,
                perturber: faults.perturber(DISK_STREAM),
                stats: ReadStats::default(),
                dropped: BTreeMap::new(),
            }),
        }
    }

    /// Knows the model: reads are labelled with the block they start in, and an
    /// extent outside every block's file range is an error, as a short file would be.
    pub fn with_layout(mut self, layout: &ModelLayout) -> Self {
        for block in &layout.blocks {
            for extent in &block.extents {
                self.blocks.insert(
                    (extent.file.0, extent.offset),
                    (extent.offset + extent.length, block.name.clone()),
                );
            }
            for extent in &block.extents {
                let end = self.file_ends.entry(extent.file).or_insert(0);
                *end = (*end).max(extent.offset + extent.length);
            }
        }
        self
    }

    /// Reads pay the page faults of the pinned bytes they fill first (the device
    /// records the buffers it allocates in the same `first_touch`).
    pub fn with_first_touch(mut self, first_touch: Arc<FirstTouch>) -> Self {
        self.first_touch = Some(first_touch);
        self
    }

    pub fn with_trace(mut self, trace: Arc<TraceRecorder>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The disk's rates are the page cache's: a run that drops the pages of what it
    /// pinned (as the pread adapter does) reads those bytes again at `rates`.
    pub fn with_uncached(mut self, rates: DiskRates) -> Self {
        self.uncached = Some(rates);
        self
    }

    /// With [`Self::with_uncached`]: the ranges the page cache did not hold when the
    /// simulation began, `(file, start, end)`, read at the uncached rate the first time.
    pub fn with_uncached_at_start(self, ranges: &[super::UncachedRange]) -> Self {
        let extents: Vec<Extent> = ranges
            .iter()
            .map(|&(file, start, end)| Extent {
                file: FileId(file),
                offset: start,
                length: end.saturating_sub(start),
            })
            .collect();
        self.forget_cached(&extents);
        self
    }

    /// Reads share `bus` with copies and compute, each asking `cost` of it.
    pub fn with_bus(mut self, bus: Arc<SharedBus>, cost: ReadCost) -> Self {
        self.bus = Some((bus, cost));
        self
    }

    pub fn disk(&self) -> DiskRates {
        self.disk
    }

    pub fn read_stats(&self) -> ReadStats {
        self.lock().stats
    }

    /// When the disk's last queued read ends (exact virtual time).
    pub fn busy_until(&self) -> Duration {
        self.lane.busy_until()
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        // The state is a position, counters and an RNG updated together: consistent
        // even if a panic poisoned the lock.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_extents(&self, extents: &[Extent]) -> Result<(), StorageError> {
        if self.file_ends.is_empty() {
            return Ok(());
        }
        for extent in extents {
            let Some(&file_end) = self.file_ends.get(&extent.file) else {
                return Err(StorageError::UnknownFile(extent.file));
            };
            if extent.offset + extent.length > file_end {
                return Err(StorageError::Io {
                    path: format!("sim file {}", extent.file.0),
                    reason: format!(
                        "read of {} bytes at {} runs past the end ({file_end})",
                        extent.length, extent.offset
                    ),
                });
            }
        }
        Ok(())
    }

    /// Latency for every extent that does not continue the previous one, plus the
    /// bytes at the disk's rate (dropped bytes at the uncached rate; reading them
    /// caches them again).
    fn nominal_duration(&self, state: &mut DiskState, extents: &[Extent]) -> Duration {
        let mut duration = Duration::ZERO;
        for extent in extents {
            if state.position != Some((extent.file, extent.offset)) {
                duration += self.disk.request_latency;
            }
            let mut cached = extent.length;
            if let Some(uncached) = self.uncached {
                let dropped = take_dropped(&mut state.dropped, extent);
                cached -= dropped;
                duration += transfer_duration(dropped, uncached.bytes_per_second);
            }
            duration += transfer_duration(cached, self.disk.bytes_per_second);
            state.position = Some((extent.file, extent.offset + extent.length));
        }
        duration
    }

    fn label(&self, extents: &[Extent], bytes: u64) -> String {
        // A chunk of a block (fast disk, or a block larger than the staging buffers)
        // starts inside one of its extents, not at it.
        extents
            .first()
            .and_then(|first| {
                let ((file, _), (end, name)) = self
                    .blocks
                    .range(..=(first.file.0, first.offset))
                    .next_back()?;
                (*file == first.file.0 && first.offset < *end).then(|| name.clone())
            })
            .unwrap_or_else(|| format!("read {bytes} B"))
    }
}

impl Storage for SimStorage {
    fn name(&self) -> String {
        "sim".to_string()
    }

    fn read(
        &self,
        extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        let bytes: u64 = extents.iter().map(|extent| extent.length).sum();
        let buffer_bytes = into.len() as u64;
        if into_offset.saturating_add(bytes) > buffer_bytes {
            let error = StorageError::BufferTooSmall {
                requested_bytes: bytes,
                buffer_bytes: buffer_bytes.saturating_sub(into_offset),
            };
            return Box::pin(async move { Err((error, into)) });
        }
        if let Err(error) = self.check_extents(&extents) {
            return Box::pin(async move { Err((error, into)) });
        }
        let outcome = {
            let mut state = self.lock();
            let nominal = self.nominal_duration(&mut state, &extents);
            let outcome = state.perturber.read(nominal);
            match outcome {
                Outcome::Completes(_) => {
                    state.stats.reads += 1;
                    state.stats.bytes += bytes;
                }
                Outcome::Fails { .. } => state.stats.failed += 1,
            }
            outcome
        };
        let duration = match outcome {
            Outcome::Completes(duration) => {
                duration
                    + self
                        .first_touch
                        .as_ref()
                        .map_or(Duration::ZERO, |first_touch| {
                            first_touch.pinned_write(into.tag(), into_offset, bytes)
                        })
            }
            Outcome::Fails { operation } => {
                let error = StorageError::Injected(format!(
                    "read #{operation} of {bytes} bytes failed (fail_read_after, seed {})",
                    self.seed
                ));
                return Box::pin(async move { Err((error, into)) });
            }
        };
        if let Some((bus, cost)) = &self.bus {
            let seconds = duration.as_secs_f64().max(1e-12);
            let demand = Demand {
                threads: cost.threads_for(bytes, seconds),
                memory_bytes_per_second: cost.traffic_per_byte * bytes as f64 / seconds,
            };
            let label = self.label(&extents, bytes);
            let done = bus.submit(Lane::Disk, duration, demand, label, Some(bytes));
            return Box::pin(async move {
                done.await;
                Ok(into)
            });
        }
        let (start, end) = self.lane.book(self.clock.now(), duration);
        if let Some(trace) = &self.trace {
            trace.record(
                Lane::Disk,
                self.label(&extents, bytes),
                start,
                end,
                Some(bytes),
            );
        }
        let clock = Arc::clone(&self.clock);
        Box::pin(async move {
            clock.wait_until(end).await;
            Ok(into)
        })
    }

    fn forget_cached(&self, extents: &[Extent]) {
        if self.uncached.is_none() {
            return;
        }
        let mut state = self.lock();
        for extent in extents {
            // Disjoint: take what overlaps first, then add the whole range.
            take_dropped(&mut state.dropped, extent);
            state.dropped.insert(
                (extent.file.0, extent.offset),
                extent.offset + extent.length,
            );
        }
    }
}

/// Removes the part of `dropped` that `extent` covers; returns its bytes.
fn take_dropped(dropped: &mut BTreeMap<(u32, u64), u64>, extent: &Extent) -> u64 {
    let (file, start, end) = (extent.file.0, extent.offset, extent.offset + extent.length);
    let overlapping: Vec<(u64, u64)> = dropped
        .range(..(file, end))
        .rev()
        .take_while(|((range_file, _), _)| *range_file == file)
        .filter(|(_, &range_end)| range_end > start)
        .map(|(&(_, range_start), &range_end)| (range_start, range_end))
        .collect();
    let mut bytes = 0;
    for (range_start, range_end) in overlapping {
        dropped.remove(&(file, range_start));
        bytes += range_end.min(end) - range_start.max(start);
        if range_start < start {
            dropped.insert((file, range_start), start);
        }
        if range_end > end {
            dropped.insert((file, end), range_end);
        }
    }
    bytes
}

impl std::fmt::Debug for SimStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimStorage")
            .field("disk", &self.disk)
            .field("stats", &self.read_stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::ReadCost;

    #[test]
    fn a_buffered_read_keeps_one_reader_thread_busy_per_request() {
        let cost = ReadCost::BUFFERED.in_requests(4 << 20, 4);
        assert_eq!(cost.threads_for(1, 0.01), 1.0);
        assert_eq!(cost.threads_for(8 << 20, 0.01), 2.0);
        assert_eq!(cost.threads_for(64 << 20, 0.01), 4.0, "at most the pool");
        // O_DIRECT is the disk's DMA: no thread, however many requests.
        assert_eq!(
            ReadCost::DIRECT
                .in_requests(4 << 20, 4)
                .threads_for(64 << 20, 0.01),
            0.0
        );
        // Unsplit (no request size given): one thread per read.
        assert_eq!(ReadCost::BUFFERED.threads_for(64 << 20, 0.01), 1.0);
    }

    #[test]
    fn a_buffered_read_keeps_its_threads_busy_only_for_its_copy() {
        // Proves a read at the page cache's rate is all copy (its threads busy), one
        // at a fifth of it busy a fifth of the time, and a rate faster than the
        // copy's (a bad profile) never more than busy.
        let copy = 8e9;
        let cost = ReadCost::BUFFERED
            .in_requests(4 << 20, 4)
            .copying_at(Some(copy));
        let bytes = 16u64 << 20;
        let at = |rate: f64| cost.threads_for(bytes, bytes as f64 / rate);
        assert!((at(copy) - 4.0).abs() < 1e-9);
        assert!((at(copy / 5.0) - 0.8).abs() < 1e-9);
        assert!((at(copy * 2.0) - 4.0).abs() < 1e-9);
        // An unknown or unusable rate: busy for the whole read, as before.
        for rate in [None, Some(0.0), Some(f64::NAN)] {
            let unknown = ReadCost::BUFFERED.in_requests(4 << 20, 4).copying_at(rate);
            assert_eq!(unknown.threads_for(bytes, 1.0), 4.0);
        }
    }
}
