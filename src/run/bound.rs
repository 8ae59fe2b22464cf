//! The physical bound of a step, `max(compute, bytes to VRAM / copy rate, bytes from
//! disk / read rate)`, with the rates measured on this machine in the same process.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use stagehand_actors::{Device, DeviceArena, DevicePtr, HostBuffer, ModelLayout, Storage};

/// Link rates measured with plain copy and read loops through the same adapters.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LinkRates {
    pub copy_bytes_per_second: f64,
    pub read_bytes_per_second: f64,
}

/// Bytes each calibration loop moves (or the largest block, if larger).
const CALIBRATION_BYTES: u64 = 128 << 20;
/// The copy loop rotates over at least this many bytes: more than a last-level cache.
pub(super) const CALIBRATION_SPAN: u64 = 64 << 20;
/// Copies or reads each calibration loop makes at most: a model of tiny blocks would
/// otherwise need millions of them to move `CALIBRATION_BYTES` (one-byte blocks: 134
/// million cross-thread copies, hours).
const CALIBRATION_OPERATIONS: u64 = 256;

/// Times copies of the largest block into an arena ([`measure_copy_rate`]), and reads
/// of the blocks the run reads from disk every step ([`measure_read_rate`]).
pub fn measure_rates(
    device: &Arc<dyn Device>,
    storage: &Arc<dyn Storage>,
    layout: &ModelLayout,
    read_from_disk: impl Fn(usize) -> bool,
) -> Result<LinkRates, String> {
    Ok(LinkRates {
        copy_bytes_per_second: measure_copy_rate(device, layout.largest_block_bytes())?,
        read_bytes_per_second: measure_read_rate(device, storage, layout, read_from_disk)?,
    })
}

/// Bytes per second `device` copies blocks of `block_bytes` from pinned memory into its
/// own, each to one of rotating places of a span larger than the last-level cache,
/// source and destination alike: one block copied over itself would be served from
/// the cache, as no step of a streamed run is. The span fits what the device has free
/// (the CPU device's "VRAM" is the budget).
pub fn measure_copy_rate(device: &Arc<dyn Device>, block_bytes: u64) -> Result<f64, String> {
    let largest = block_bytes.max(1);
    let free = device
        .memory_info()
        .map_or(CALIBRATION_SPAN, |memory| memory.free_bytes);
    let places = (CALIBRATION_SPAN.min(free) / largest).clamp(1, CALIBRATION_OPERATIONS);
    let span = places * largest;
    let loops = Loops::new(device, largest)?;
    let arena = device
        .allocate_arena(span)
        .map_err(|error| format!("calibration arena: {error}"))?;
    let copied = match device.allocate_pinned(span) {
        Ok(buffer) => loops.time_copies(&arena, places, buffer),
        Err(error) => Err(format!("calibration buffer: {error}")),
    };
    device.free_arena(arena);
    copied
}

/// Bytes per second the storage adapter reads the blocks the run reads from disk every
/// step (`read_from_disk`; as warm as the run left the page cache). Blocks with a
/// pinned copy are not read again: that would pull their pages back into the page
/// cache the run just dropped them from. With nothing read from disk each step the
/// rate is 0 (nothing is allocated or read) and does not bound a step.
pub fn measure_read_rate(
    device: &Arc<dyn Device>,
    storage: &Arc<dyn Storage>,
    layout: &ModelLayout,
    read_from_disk: impl Fn(usize) -> bool,
) -> Result<f64, String> {
    let largest = (layout.blocks.iter().enumerate())
        .filter(|(index, _)| read_from_disk(*index))
        .map(|(_, block)| block.bytes)
        .max();
    let Some(largest) = largest.filter(|bytes| *bytes > 0) else {
        return Ok(0.0);
    };
    let loops = Loops::new(device, largest)?;
    let buffer = device
        .allocate_pinned(largest)
        .map_err(|error| format!("calibration buffer: {error}"))?;
    loops.time_reads(storage, layout, read_from_disk, buffer)
}

/// A stop request cuts the calibration short (the rates come from what was measured);
/// the first copy and the first read always run, so there are rates to report.
fn stop_requested() -> bool {
    crate::signals::check().is_err()
}

/// What the copy and the read loop share.
struct Loops<'a> {
    runtime: tokio::runtime::Runtime,
    device: &'a Arc<dyn Device>,
    /// Bytes of one copy: the largest block.
    largest: u64,
    /// Timed copies, and passes over the blocks read from disk, at most.
    rounds: u64,
}

impl<'a> Loops<'a> {
    fn new(device: &'a Arc<dyn Device>, largest: u64) -> Result<Self, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| error.to_string())?;
        Ok(Self {
            runtime,
            device,
            largest,
            rounds: CALIBRATION_BYTES
                .div_ceil(largest)
                .clamp(2, CALIBRATION_OPERATIONS),
        })
    }

    /// Copies the largest block to `places` rotating places of the arena: the copy
    /// rate, or the copy's error.
    fn time_copies(
        &self,
        arena: &DeviceArena,
        places: u64,
        mut buffer: HostBuffer,
    ) -> Result<f64, String> {
        let largest = self.largest;
        let copy = |index: u64, buffer: HostBuffer| {
            let offset = (index % places) * largest;
            let destination = DevicePtr(arena.base.0 + offset);
            self.runtime.block_on(
                self.device
                    .copy_to_device(buffer, offset, largest, destination),
            )
        };
        // Every place once, untimed: the arena's pages are mapped on first touch, and
        // timing those faults would halve the rate of a large block copied only twice.
        let mut copies = 0u64;
        let mut copy_started = Instant::now();
        for index in 0..places + self.rounds {
            if index == places {
                copy_started = Instant::now();
            }
            if index > places && stop_requested() {
                break;
            }
            match copy(index, buffer) {
                Ok(returned) => buffer = returned,
                Err((error, _)) => return Err(format!("calibration copy: {error}")),
            }
            if index >= places {
                copies += 1;
            }
        }
        let copy_seconds = copy_started.elapsed().as_secs_f64();
        Ok((copies * largest) as f64 / copy_seconds.max(1e-9))
    }

    /// Reads the blocks the run reads from disk each step through the storage
    /// adapter, up to `CALIBRATION_BYTES`; 0 when there are none.
    fn time_reads(
        &self,
        storage: &Arc<dyn Storage>,
        layout: &ModelLayout,
        read_from_disk: impl Fn(usize) -> bool,
        mut buffer: HostBuffer,
    ) -> Result<f64, String> {
        let mut read_bytes = 0u64;
        let mut reads = 0u64;
        let read_started = Instant::now();
        'reads: for _ in 0..self.rounds {
            let mut read_any = false;
            for (index, block) in layout.blocks.iter().enumerate() {
                if block.bytes > buffer.len() as u64 || !read_from_disk(index) {
                    continue;
                }
                // As for copies, the first read always runs: a rate of 0 would make the
                // bound of a step that reads from disk infinite.
                if reads == CALIBRATION_OPERATIONS || (reads > 0 && stop_requested()) {
                    break 'reads;
                }
                reads += 1;
                read_any = true;
                buffer = self
                    .runtime
                    .block_on(storage.read(block.extents.clone(), buffer, 0))
                    .map_err(|(error, _)| format!("calibration read: {error}"))?;
                read_bytes += block.bytes;
                if read_bytes >= CALIBRATION_BYTES {
                    break 'reads;
                }
            }
            if !read_any {
                break;
            }
        }
        let read_seconds = read_started.elapsed().as_secs_f64();
        Ok(if read_bytes > 0 {
            read_bytes as f64 / read_seconds.max(1e-9)
        } else {
            0.0
        })
    }
}

/// The bound of one steady-state step and which resource sets it.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StepBound {
    /// The compute's share of the bound: the machine's floor under the step's kernels
    /// (the roofline) where one is known, else the run's own compute time.
    pub compute_seconds: f64,
    /// What sets the compute floor: "memory bandwidth" or "FLOP/s" (the roofline), or
    /// "compute" (the run's own compute time, where no roofline is known).
    pub compute_limited_by: &'static str,
    pub copy_seconds: f64,
    pub read_seconds: f64,
}

impl StepBound {
    /// A bound whose compute share is `compute_seconds` as measured: for comparisons
    /// of runs on one device (`bench`'s resident run) and devices without a roofline.
    pub fn new(compute_seconds: f64, vram_bytes: f64, disk_bytes: f64, rates: LinkRates) -> Self {
        Self::with_compute(compute_seconds, "compute", vram_bytes, disk_bytes, rates)
    }

    /// The physical bound: the machine's floor under the step's kernels, the links'.
    pub fn on_roofline(
        floor: super::roofline::ComputeFloor,
        vram_bytes: f64,
        disk_bytes: f64,
        rates: LinkRates,
    ) -> Self {
        Self::with_compute(
            floor.seconds,
            floor.limited_by(),
            vram_bytes,
            disk_bytes,
            rates,
        )
    }

    fn with_compute(
        compute_seconds: f64,
        compute_limited_by: &'static str,
        vram_bytes: f64,
        disk_bytes: f64,
        rates: LinkRates,
    ) -> Self {
        Self {
            compute_seconds,
            compute_limited_by,
            copy_seconds: vram_bytes / rates.copy_bytes_per_second,
            read_seconds: if disk_bytes > 0.0 {
                disk_bytes / rates.read_bytes_per_second
            } else {
                0.0
            },
        }
    }

    pub fn seconds(&self) -> f64 {
        self.compute_seconds
            .max(self.copy_seconds)
            .max(self.read_seconds)
    }

    pub fn limited_by(&self) -> &'static str {
        let bound = self.seconds();
        if bound == self.compute_seconds {
            self.compute_limited_by
        } else if bound == self.copy_seconds {
            "copy to VRAM"
        } else {
            "disk reads"
        }
    }
}
