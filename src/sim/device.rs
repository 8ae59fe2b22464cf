//! The simulated accelerator: VRAM as a number, a copy engine as a timeline.
//!
//! No bytes move. Arenas get fake addresses and count against the VRAM capacity;
//! pinned buffers are virtual and count against the host's pinnable RAM until they are
//! dropped; a copy takes `bytes / rate` and copies queue on one copy engine in the
//! order they were issued, as on a CUDA copy stream. The link's latency (a launch, the
//! CPU copy thread's wake-up and hand-back) comes before a copy issued to an idle
//! engine; one queued behind others starts when they end, its latency overlapped.
//!
//! A buffer the device pinned copies at the link's pinned rate; any other buffer (a
//! baseline's plain host memory) at the pageable rate, because that is what the
//! driver does: it stages pageable memory through its own pinned bounce buffer.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use stagehand_actors::{
    Device, DeviceArena, DeviceError, DevicePtr, HostBuffer, MemoryInfo, OpFuture, PinRegistration,
};

use super::clock::{transfer_duration, SerialLane, SimClock};
use super::faults::{FaultPlan, Perturber};
use super::first_touch::{FirstTouch, TouchedRanges};
use super::shared::{Demand, SharedBus};
use crate::telemetry::trace::{Lane, TraceRecorder};

/// Host → device rates of one link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinkRates {
    pub pinned_bytes_per_second: u64,
    pub pageable_bytes_per_second: u64,
    /// Fixed cost of a copy issued to an idle copy engine (launch and DMA setup; on
    /// the CPU backend the copy thread's wake-up and hand-back), before its transfer.
    pub latency: Duration,
}

/// What the simulated device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SimDeviceSpec {
    pub vram_bytes: u64,
    /// Host memory the device may pin; `u64::MAX` for no limit.
    pub pinnable_bytes: u64,
    pub link: LinkRates,
}

/// Labels a copy for the trace from its destination and size (the device does not
/// know which block a copy carries; whoever owns the slots does).
pub type CopyLabeler = Box<dyn Fn(DevicePtr, u64) -> String + Send + Sync>;

/// Counters of what the device did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CopyStats {
    pub copies: u64,
    pub pinned_bytes: u64,
    pub pageable_bytes: u64,
}

/// Arenas start here so that a null or small pointer is never a valid address.
const FIRST_ARENA_ADDRESS: u64 = 1 << 32;
/// Arena bases are aligned like a real allocator's (2 MiB pages).
const ARENA_ALIGN_BYTES: u64 = 2 << 20;
/// Perturbation stream of the copy engine (see [`FaultPlan::perturber`]).
const COPY_STREAM: u64 = 2;

pub struct SimDevice {
    spec: SimDeviceSpec,
    clock: Arc<SimClock>,
    copy_engine: SerialLane,
    trace: Option<Arc<TraceRecorder>>,
    labeler: Option<CopyLabeler>,
    /// A shared-bus machine: copies run on the bus beside reads and compute.
    bus: Option<Arc<SharedBus>>,
    /// Fresh memory costs its page faults on first write (the CPU backend).
    first_touch: Option<Arc<FirstTouch>>,
    pinned_bytes: Arc<AtomicU64>,
    state: Mutex<DeviceState>,
}

struct DeviceState {
    /// base → bytes of every live arena.
    arenas: BTreeMap<u64, u64>,
    allocated_bytes: u64,
    next_address: u64,
    perturber: Perturber,
    stats: CopyStats,
    /// Arena addresses written so far (addresses are never reused).
    touched: TouchedRanges,
}

impl SimDevice {
    pub fn new(spec: SimDeviceSpec, clock: Arc<SimClock>, faults: &FaultPlan) -> Self {
        Self {
            spec,
            clock,
            copy_engine: SerialLane::default(),
            trace: None,
            labeler: None,
            bus: None,
            first_touch: None,
            pinned_bytes: Arc::new(AtomicU64::new(0)),
            state: Mutex::new(DeviceState {
                arenas: BTreeMap::new(),
                allocated_bytes: 0,
                next_address: FIRST_ARENA_ADDRESS,
                perturber: faults.perturber(COPY_STREAM),
                stats: CopyStats::default(),
                touched: TouchedRanges::default(),
            }),
        }
    }

    pub fn with_trace(mut self, trace: Arc<TraceRecorder>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Copies share `bus` with reads and compute instead of owning a copy engine.
    pub fn with_bus(mut self, bus: Arc<SharedBus>) -> Self {
        self.bus = Some(bus);
        self
    }

    /// The first copy into each arena byte also pays its page fault, and each pinned
    /// buffer's bytes are fresh until a read fills them (see `first_touch`).
    pub fn with_first_touch(mut self, first_touch: Arc<FirstTouch>) -> Self {
        self.first_touch = Some(first_touch);
        self
    }

    pub fn with_copy_labeler(mut self, labeler: CopyLabeler) -> Self {
        self.labeler = Some(labeler);
        self
    }

    pub fn spec(&self) -> SimDeviceSpec {
        self.spec
    }

    /// Host memory pinned through this device and not yet released.
    pub fn pinned_bytes(&self) -> u64 {
        self.pinned_bytes.load(Ordering::Relaxed)
    }

    /// VRAM held by live arenas.
    pub fn allocated_bytes(&self) -> u64 {
        self.lock().allocated_bytes
    }

    pub fn copy_stats(&self) -> CopyStats {
        self.lock().stats
    }

    /// When the copy engine's last queued copy ends (exact virtual time).
    pub fn copy_engine_busy_until(&self) -> Duration {
        self.copy_engine.busy_until()
    }

    fn lock(&self) -> MutexGuard<'_, DeviceState> {
        // Every update of the state is a few integer fields written together before
        // any call that could panic, so a poisoned lock still guards consistent data.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn check_destination(
        state: &DeviceState,
        destination: DevicePtr,
        bytes: u64,
    ) -> Result<(), String> {
        let Some((&base, &length)) = state.arenas.range(..=destination.0).next_back() else {
            return Err(format!("destination {:#x} is in no arena", destination.0));
        };
        let end = destination.0.checked_add(bytes);
        if end.is_none_or(|end| end > base + length) {
            return Err(format!(
                "{bytes} bytes at {:#x} overrun the arena [{base:#x}, {:#x})",
                destination.0,
                base + length
            ));
        }
        Ok(())
    }
}

/// Returns pinned bytes to the device's count when the buffer is dropped or unpinned.
struct SimPin {
    bytes: u64,
    pinned_bytes: Arc<AtomicU64>,
    /// The buffer's first-touch record, forgotten with the buffer.
    fresh: Option<(Arc<FirstTouch>, u64)>,
}

impl PinRegistration for SimPin {}

impl Drop for SimPin {
    fn drop(&mut self) {
        self.pinned_bytes.fetch_sub(self.bytes, Ordering::Relaxed);
        if let Some((first_touch, tag)) = &self.fresh {
            first_touch.pinned_released(*tag);
        }
    }
}

impl Device for SimDevice {
    fn name(&self) -> String {
        "sim".to_string()
    }

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let allocated_bytes = self.lock().allocated_bytes;
        Ok(MemoryInfo {
            total_bytes: self.spec.vram_bytes,
            free_bytes: self.spec.vram_bytes.saturating_sub(allocated_bytes),
        })
    }

    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        let mut state = self.lock();
        let available_bytes = self.spec.vram_bytes.saturating_sub(state.allocated_bytes);
        if bytes > available_bytes {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: bytes,
                available_bytes,
            });
        }
        let base = state.next_address;
        let span = bytes.max(1).div_ceil(ARENA_ALIGN_BYTES) * ARENA_ALIGN_BYTES;
        state.next_address = base.saturating_add(span);
        state.allocated_bytes += bytes;
        state.arenas.insert(base, bytes);
        Ok(DeviceArena {
            base: DevicePtr(base),
            bytes,
        })
    }

    fn free_arena(&self, arena: DeviceArena) {
        let mut state = self.lock();
        match state.arenas.remove(&arena.base.0) {
            Some(bytes) => state.allocated_bytes -= bytes,
            None => tracing::error!(
                base = arena.base.0,
                "sim device: freeing an arena it never allocated (or twice)"
            ),
        }
    }

    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        let len = usize::try_from(bytes).map_err(|_| DeviceError::PinFailed {
            bytes,
            reason: "larger than this host's address space".to_string(),
        })?;
        let previous = self.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
        if previous.saturating_add(bytes) > self.spec.pinnable_bytes {
            self.pinned_bytes.fetch_sub(bytes, Ordering::Relaxed);
            return Err(DeviceError::PinFailed {
                bytes,
                reason: format!(
                    "the simulated host has {} bytes of pinnable RAM and {previous} are pinned",
                    self.spec.pinnable_bytes
                ),
            });
        }
        let fresh = self
            .first_touch
            .as_ref()
            .map(|first_touch| (Arc::clone(first_touch), first_touch.pinned_allocated()));
        let mut buffer = HostBuffer::virtual_tagged(len, fresh.as_ref().map_or(0, |(_, tag)| *tag));
        buffer.set_registration(Box::new(SimPin {
            bytes,
            pinned_bytes: Arc::clone(&self.pinned_bytes),
            fresh,
        }));
        Ok(buffer)
    }

    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        let source_end = source_offset.checked_add(bytes);
        if source_end.is_none_or(|end| end > source.len() as u64) {
            let error = DeviceError::CopyFailed(format!(
                "source range {source_offset}+{bytes} overruns a {}-byte buffer",
                source.len()
            ));
            return Box::pin(async move { Err((error, source)) });
        }
        let pinned = source.is_registered();
        let rate = if pinned {
            self.spec.link.pinned_bytes_per_second
        } else {
            self.spec.link.pageable_bytes_per_second
        };
        let latency = self.spec.link.latency;
        let mut nominal = transfer_duration(bytes, rate);
        let duration = {
            let mut state = self.lock();
            if let Err(reason) = Self::check_destination(&state, destination, bytes) {
                drop(state);
                let error = DeviceError::CopyFailed(reason);
                return Box::pin(async move { Err((error, source)) });
            }
            if let Some(first_touch) = &self.first_touch {
                let fresh = state.touched.touch(destination.0, destination.0 + bytes);
                nominal += first_touch.duration(fresh);
            }
            state.stats.copies += 1;
            if pinned {
                state.stats.pinned_bytes += bytes;
            } else {
                state.stats.pageable_bytes += bytes;
            }
            state.perturber.copy(nominal)
        };
        let label = || match &self.labeler {
            Some(labeler) => labeler(destination, bytes),
            None => format!("copy {bytes} B"),
        };
        if let Some(bus) = &self.bus {
            // A memcpy on the copy thread: one core, and every byte read and written.
            let seconds = duration.as_secs_f64().max(1e-12);
            let demand = Demand {
                threads: 1.0,
                memory_bytes_per_second: 2.0 * bytes as f64 / seconds,
            };
            let done =
                bus.submit_waking(Lane::Copy, latency, duration, demand, label(), Some(bytes));
            return Box::pin(async move {
                done.await;
                Ok(source)
            });
        }
        // The latency (the launch, the copy thread's wake-up) runs before a copy
        // issued to an idle engine and overlaps the copies queued ahead of one issued
        // behind them.
        let (start, end) = self.copy_engine.book(self.clock.now() + latency, duration);
        if let Some(trace) = &self.trace {
            trace.record(Lane::Copy, label(), start, end, Some(bytes));
        }
        let clock = Arc::clone(&self.clock);
        Box::pin(async move {
            clock.wait_until(end).await;
            Ok(source)
        })
    }
}

impl std::fmt::Debug for SimDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimDevice")
            .field("spec", &self.spec)
            .field("allocated_bytes", &self.allocated_bytes())
            .field("pinned_bytes", &self.pinned_bytes())
            .finish()
    }
}
