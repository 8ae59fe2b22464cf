//! Fault injection at random points: wrappers of the `Device` and `Storage` ports that
//! fail, shorten or delay operations as a seeded plan draws them. They wrap any
//! adapter — the simulator's, for thousands of fast runs in CI, or the CPU backend's,
//! where threads and files are real — and every draw comes from a splitmix64 stream of
//! the plan's seed, so a run that fails is replayed exactly from its seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stagehand_actors::{
    Device, DeviceArena, DeviceError, DevicePtr, Extent, HostBuffer, MemoryInfo, MemorySpace,
    OpFuture, Storage, StorageError,
};

use super::faults::SplitMix64;

/// How often each kind of fault strikes: the chance per operation, 0 = never.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ChaosPlan {
    pub seed: u64,
    /// A read fails outright (an I/O error).
    pub read_error: f64,
    /// A read gets only part of its bytes (the file shrank under it).
    pub short_read: f64,
    /// A read waits `slow_read_delay` first (a disk hiccup).
    pub slow_read: f64,
    pub slow_read_delay: Duration,
    /// A pinned allocation is refused (no page-locked memory left).
    pub pin_failure: f64,
    /// A copy to the device fails.
    pub copy_failure: f64,
}

impl ChaosPlan {
    /// A plan drawn from `seed`: each kind of fault on or off, at up to 10 % of
    /// operations, so runs range from clean to failing everywhere.
    pub fn drawn(seed: u64, slow_read_delay: Duration) -> Self {
        let mut rng = SplitMix64::new(seed);
        let mut rate = || {
            if rng.next_u64() % 3 == 0 {
                0.0
            } else {
                rng.next_f64() * 0.1
            }
        };
        Self {
            seed,
            read_error: rate(),
            short_read: rate(),
            slow_read: rate(),
            slow_read_delay,
            pin_failure: rate(),
            copy_failure: rate(),
        }
    }
}

/// What the wrappers injected, for the test's report.
#[derive(Debug, Default)]
pub struct ChaosCounts {
    pub read_errors: AtomicU64,
    pub short_reads: AtomicU64,
    pub slow_reads: AtomicU64,
    pub pin_failures: AtomicU64,
    pub copy_failures: AtomicU64,
}

impl ChaosCounts {
    pub fn total(&self) -> u64 {
        [
            &self.read_errors,
            &self.short_reads,
            &self.slow_reads,
            &self.pin_failures,
            &self.copy_failures,
        ]
        .iter()
        .map(|count| count.load(Ordering::Relaxed))
        .sum()
    }
}

/// One seeded stream of draws.
struct Draws(Mutex<SplitMix64>);

impl Draws {
    fn new(seed: u64, stream: u64) -> Self {
        Self(Mutex::new(SplitMix64::new(
            seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        )))
    }

    fn hit(&self, chance: f64) -> bool {
        if chance <= 0.0 {
            return false;
        }
        // A poisoned stream still draws: the state is a plain integer.
        let mut rng = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        rng.next_f64() < chance
    }
}

/// A storage adapter whose reads fail, come up short or stall at random.
pub struct ChaosStorage {
    inner: Arc<dyn Storage>,
    plan: ChaosPlan,
    draws: Draws,
    counts: Arc<ChaosCounts>,
}

impl ChaosStorage {
    pub fn new(inner: Arc<dyn Storage>, plan: ChaosPlan, counts: Arc<ChaosCounts>) -> Self {
        Self {
            inner,
            plan,
            draws: Draws::new(plan.seed, 1),
            counts,
        }
    }
}

impl Storage for ChaosStorage {
    fn name(&self) -> String {
        format!("chaos({})", self.inner.name())
    }

    fn read(
        &self,
        mut extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        if self.draws.hit(self.plan.read_error) {
            self.counts.read_errors.fetch_add(1, Ordering::Relaxed);
            let error = StorageError::Injected("read error".to_string());
            return Box::pin(std::future::ready(Err((error, into))));
        }
        let slow = self.draws.hit(self.plan.slow_read);
        let short = self.draws.hit(self.plan.short_read);
        let mut expected_bytes = 0;
        if short {
            // Half the bytes arrive, then the read fails as a shrunken file does.
            expected_bytes = extents.iter().map(|extent| extent.length).sum::<u64>();
            let mut keep = expected_bytes / 2;
            extents.retain_mut(|extent| {
                let kept = extent.length.min(keep);
                keep -= kept;
                extent.length = kept;
                kept > 0
            });
            self.counts.short_reads.fetch_add(1, Ordering::Relaxed);
        }
        if slow {
            self.counts.slow_reads.fetch_add(1, Ordering::Relaxed);
        }
        let read = self.inner.read(extents, into, into_offset);
        let delay = self.plan.slow_read_delay;
        Box::pin(async move {
            if slow {
                tokio::time::sleep(delay).await;
            }
            let buffer = read.await?;
            if short {
                let error = StorageError::FileChanged {
                    path: "chaos".to_string(),
                    expected_bytes,
                    found_bytes: expected_bytes / 2,
                };
                return Err((error, buffer));
            }
            Ok(buffer)
        })
    }

    fn forget_cached(&self, extents: &[Extent]) {
        self.inner.forget_cached(extents);
    }
}

/// A device whose pinned allocations and copies fail at random.
pub struct ChaosDevice {
    inner: Arc<dyn Device>,
    plan: ChaosPlan,
    pins: Draws,
    copies: Draws,
    counts: Arc<ChaosCounts>,
}

impl ChaosDevice {
    pub fn new(inner: Arc<dyn Device>, plan: ChaosPlan, counts: Arc<ChaosCounts>) -> Self {
        Self {
            inner,
            plan,
            pins: Draws::new(plan.seed, 2),
            copies: Draws::new(plan.seed, 3),
            counts,
        }
    }
}

impl Device for ChaosDevice {
    fn name(&self) -> String {
        format!("chaos({})", self.inner.name())
    }

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        self.inner.memory_info()
    }

    fn memory_space(&self) -> MemorySpace {
        self.inner.memory_space()
    }

    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        self.inner.allocate_arena(bytes)
    }

    fn free_arena(&self, arena: DeviceArena) {
        self.inner.free_arena(arena);
    }

    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        if self.pins.hit(self.plan.pin_failure) {
            self.counts.pin_failures.fetch_add(1, Ordering::Relaxed);
            return Err(DeviceError::PinFailed {
                bytes,
                reason: "injected".to_string(),
            });
        }
        self.inner.allocate_pinned(bytes)
    }

    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        if self.copies.hit(self.plan.copy_failure) {
            self.counts.copy_failures.fetch_add(1, Ordering::Relaxed);
            let error = DeviceError::CopyFailed("injected".to_string());
            return Box::pin(std::future::ready(Err((error, source))));
        }
        self.inner
            .copy_to_device(source, source_offset, bytes, destination)
    }
}
