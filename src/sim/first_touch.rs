//! First-touch page faults: on the CPU backend the device tier ("VRAM") is an
//! anonymous mapping committed page by page as blocks land in it, and pinned buffers
//! are fresh host allocations faulted in by the first read into them. Each first
//! write of a page costs the kernel's fault and zeroing on the thread that writes it,
//! so the real first step is slower than a warm one by `fresh bytes / first-touch
//! rate` on the copy thread and the reader threads. A profile with
//! `[host] first_touch_gb_per_s` (measured by `stagehand calibrate`: a copy into a
//! freshly mapped arena against the same copy into warm pages) charges it here; GPU
//! profiles leave it out (device memory and page-locked buffers are mapped when
//! allocated, before any step).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The first-touch cost of one simulated host, shared by its device and its disk.
#[derive(Debug)]
pub struct FirstTouch {
    bytes_per_second: f64,
    /// The bytes of each live pinned buffer (by its tag) that reads have written.
    pinned: Mutex<BTreeMap<u64, TouchedRanges>>,
    last_tag: AtomicU64,
}

impl FirstTouch {
    pub fn new(gb_per_s: f64) -> Self {
        Self {
            bytes_per_second: gb_per_s * 1e9,
            pinned: Mutex::new(BTreeMap::new()),
            last_tag: AtomicU64::new(0),
        }
    }

    /// Time to fault in `bytes` of fresh memory.
    pub fn duration(&self, bytes: u64) -> Duration {
        if bytes == 0 || self.bytes_per_second <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(bytes as f64 / self.bytes_per_second).unwrap_or(Duration::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, TouchedRanges>> {
        // Each update is one map operation: a poisoned lock still guards whole entries.
        self.pinned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A fresh pinned buffer: its tag (for `HostBuffer::virtual_tagged`), never 0.
    pub fn pinned_allocated(&self) -> u64 {
        let tag = self.last_tag.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().insert(tag, TouchedRanges::default());
        tag
    }

    /// The buffer `tag` was freed: its memory goes back to the host.
    pub fn pinned_released(&self, tag: u64) {
        self.lock().remove(&tag);
    }

    /// A read writes `bytes` at `offset` of the buffer `tag`: the fault time of the
    /// bytes of that buffer no read wrote before (a buffer is reused: a staging slot
    /// or a fast-disk chunk pays once, for the part its reads fill). Buffers the
    /// device did not allocate (tag 0) are not charged.
    pub fn pinned_write(&self, tag: u64, offset: u64, bytes: u64) -> Duration {
        let fresh = self.lock().get_mut(&tag).map_or(0, |touched| {
            touched.touch(offset, offset.saturating_add(bytes))
        });
        self.duration(fresh)
    }
}

/// Address ranges already written, merged: the bytes a new write touches first.
#[derive(Debug, Default)]
pub struct TouchedRanges {
    /// start → end of each touched range; ranges neither overlap nor abut.
    ranges: BTreeMap<u64, u64>,
}

impl TouchedRanges {
    /// Marks `[start, end)` touched; returns how many of its bytes were not before.
    pub fn touch(&mut self, start: u64, end: u64) -> u64 {
        if start >= end {
            return 0;
        }
        let (mut merged_start, mut merged_end) = (start, end);
        let mut already = 0;
        // The ranges that overlap or abut [start, end): the one starting at or before
        // `start`, and every one starting inside.
        let first = self
            .ranges
            .range(..=start)
            .next_back()
            .filter(|(_, &range_end)| range_end >= start)
            .map(|(&range_start, _)| range_start)
            .unwrap_or(start);
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(first..=end)
            .map(|(&range_start, &range_end)| (range_start, range_end))
            .collect();
        for (range_start, range_end) in overlapping {
            self.ranges.remove(&range_start);
            already += range_end.min(end).saturating_sub(range_start.max(start));
            merged_start = merged_start.min(range_start);
            merged_end = merged_end.max(range_end);
        }
        self.ranges.insert(merged_start, merged_end);
        (end - start) - already
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bytes_never_written_before_are_new() {
        // Proves overlapping, abutting and contained writes count each byte once.
        let mut touched = TouchedRanges::default();
        assert_eq!(touched.touch(100, 200), 100);
        assert_eq!(touched.touch(150, 250), 50);
        assert_eq!(touched.touch(0, 100), 100);
        assert_eq!(touched.touch(10, 240), 0);
        assert_eq!(touched.touch(300, 400), 100);
        assert_eq!(touched.touch(0, 500), 150);
        assert_eq!(touched.touch(0, 500), 0);
        assert_eq!(touched.ranges.len(), 1);
    }

    #[test]
    fn each_pinned_buffer_pays_once_for_the_bytes_reads_fill() {
        // 1 GB/s: a buffer's first 600 bytes cost 600 ns, the next read over 0..1000
        // pays for the 400 it adds, a reuse pays nothing; another buffer pays its own;
        // an untracked buffer nothing.
        let first_touch = FirstTouch::new(1.0);
        let (one, two) = (
            first_touch.pinned_allocated(),
            first_touch.pinned_allocated(),
        );
        assert_eq!(
            first_touch.pinned_write(one, 0, 600),
            Duration::from_nanos(600)
        );
        assert_eq!(
            first_touch.pinned_write(one, 0, 1000),
            Duration::from_nanos(400)
        );
        assert_eq!(first_touch.pinned_write(one, 0, 1000), Duration::ZERO);
        assert_eq!(
            first_touch.pinned_write(two, 500, 100),
            Duration::from_nanos(100)
        );
        assert_eq!(first_touch.pinned_write(0, 0, 100), Duration::ZERO);
        first_touch.pinned_released(one);
        assert_eq!(first_touch.pinned_write(one, 0, 100), Duration::ZERO);
    }
}
