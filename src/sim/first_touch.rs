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
use std::time::Duration;

/// The first-touch cost of one simulated host, shared by its device and its disk.
#[derive(Debug)]
pub struct FirstTouch {
    bytes_per_second: f64,
    /// Bytes of pinned buffers allocated and not yet written by a read.
    fresh_pinned_bytes: AtomicU64,
}

impl FirstTouch {
    pub fn new(gb_per_s: f64) -> Self {
        Self {
            bytes_per_second: gb_per_s * 1e9,
            fresh_pinned_bytes: AtomicU64::new(0),
        }
    }

    /// Time to fault in `bytes` of fresh memory.
    pub fn duration(&self, bytes: u64) -> Duration {
        if bytes == 0 || self.bytes_per_second <= 0.0 {
            return Duration::ZERO;
        }
        Duration::try_from_secs_f64(bytes as f64 / self.bytes_per_second).unwrap_or(Duration::MAX)
    }

    /// A pinned buffer of `bytes` was allocated: fresh until a read writes it.
    pub fn pinned_allocated(&self, bytes: u64) {
        self.fresh_pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A read writes `bytes` into pinned buffers: the fault time of the fresh bytes
    /// it takes. Which buffer a read fills is not tracked (a simulated buffer has no
    /// address); buffers are filled soon after they are allocated, so the fresh bytes
    /// are charged to the next reads, each byte once.
    pub fn pinned_write(&self, bytes: u64) -> Duration {
        let taken = self
            .fresh_pinned_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |fresh| {
                Some(fresh.saturating_sub(bytes))
            })
            .map_or(0, |fresh| fresh.min(bytes));
        self.duration(taken)
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
    fn fresh_pinned_bytes_are_charged_once_to_the_next_reads() {
        // 1 GB/s: 1000 fresh bytes cost 1 µs in all, however the reads split them.
        let first_touch = FirstTouch::new(1.0);
        first_touch.pinned_allocated(1000);
        assert_eq!(first_touch.pinned_write(600), Duration::from_nanos(600));
        assert_eq!(first_touch.pinned_write(600), Duration::from_nanos(400));
        assert_eq!(first_touch.pinned_write(600), Duration::ZERO);
    }
}
