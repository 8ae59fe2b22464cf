//! The session's own record of what moved: an [`Observer`] over atomics.
//!
//! The run summary is read from here and the Prometheus adapter is fed by the same
//! observer calls, so the two always agree.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::observer::{
    AcquireBatch, ErrorKind, Link, Observer, Owner, ReadAheadOutcome, Tier, TierUsage,
};

#[derive(Default)]
struct LinkCounters {
    model_bytes: AtomicU64,
    lora_bytes: AtomicU64,
    transfers: AtomicU64,
    busy_nanos: AtomicU64,
}

#[derive(Default)]
struct TierCounters {
    used_bytes: AtomicU64,
    peak_used_bytes: AtomicU64,
    budget_bytes: AtomicU64,
    model_bytes: AtomicU64,
    lora_bytes: AtomicU64,
    blocks: AtomicU64,
    evictions: AtomicU64,
}

/// Counters for one session. Cheap to update from any thread.
#[derive(Default)]
pub struct Stats {
    links: [LinkCounters; 3],
    tiers: [TierCounters; 2],
    hits: AtomicU64,
    misses: AtomicU64,
    stall_nanos: AtomicU64,
    consolidations: AtomicU64,
    consolidated_operations: AtomicU64,
    speculative_declined: AtomicU64,
    /// Disk read-aheads by outcome: used, dropped, failed.
    read_ahead: [AtomicU64; 3],
    errors: AtomicU64,
    steps: AtomicU64,
    step_history: Mutex<StepHistory>,
    step_loads: Mutex<StepLoads>,
}

/// Model bytes landed in VRAM per step that uses them, for the last [`STEP_HISTORY`]
/// steps: `(step, [pinned → VRAM, disk → VRAM])`, by step; never grows past that.
#[derive(Default)]
struct StepLoads(VecDeque<(u64, [u64; 2])>);

impl StepLoads {
    fn add(&mut self, step: u64, link: usize, bytes: u64) {
        let index = match self.0.binary_search_by_key(&step, |(known, _)| *known) {
            Ok(index) => index,
            Err(index) => {
                if self.0.len() == STEP_HISTORY {
                    if index == 0 {
                        // Older than every step kept: too old to keep.
                        return;
                    }
                    self.0.pop_front();
                    self.0.insert(index - 1, (step, [0; 2]));
                    index - 1
                } else {
                    self.0.insert(index, (step, [0; 2]));
                    index
                }
            }
        };
        self.0[index].1[link] += bytes;
    }
}

/// Step times the stats keep: the most recent ones. A session that runs for days
/// (`--steps 0`) keeps this many and no more.
pub const STEP_HISTORY: usize = 1024;

/// The last [`STEP_HISTORY`] step times, oldest first; allocated once, never grows.
struct StepHistory(VecDeque<f64>);

impl Default for StepHistory {
    fn default() -> Self {
        Self(VecDeque::with_capacity(STEP_HISTORY))
    }
}

impl StepHistory {
    fn push(&mut self, seconds: f64) {
        if self.0.len() == STEP_HISTORY {
            self.0.pop_front();
        }
        self.0.push_back(seconds);
    }
}

fn link_index(link: Link) -> usize {
    match link {
        Link::DiskToPinned => 0,
        Link::PinnedToVram => 1,
        Link::DiskToVram => 2,
    }
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Vram => 0,
        Tier::Pinned => 1,
    }
}

impl Observer for Stats {
    fn transfer(&self, link: Link, owner: Owner, bytes: u64, seconds: f64) {
        let counters = &self.links[link_index(link)];
        match owner {
            Owner::Model => counters.model_bytes.fetch_add(bytes, Ordering::Relaxed),
            Owner::Lora => counters.lora_bytes.fetch_add(bytes, Ordering::Relaxed),
        };
        counters.transfers.fetch_add(1, Ordering::Relaxed);
        counters
            .busy_nanos
            .fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
    }

    fn step_load(&self, link: Link, step: u64, bytes: u64) {
        let index = match link {
            Link::PinnedToVram => 0,
            Link::DiskToVram => 1,
            Link::DiskToPinned => return,
        };
        if let Ok(mut loads) = self.step_loads.lock() {
            loads.add(step, index, bytes);
        }
    }

    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        let counters = &self.tiers[tier_index(tier)];
        let used = usage.used_bytes();
        counters.used_bytes.store(used, Ordering::Relaxed);
        counters.peak_used_bytes.fetch_max(used, Ordering::Relaxed);
        counters
            .budget_bytes
            .store(usage.budget_bytes, Ordering::Relaxed);
        counters
            .model_bytes
            .store(usage.model_bytes, Ordering::Relaxed);
        counters
            .lora_bytes
            .store(usage.lora_bytes, Ordering::Relaxed);
        counters.blocks.store(usage.blocks, Ordering::Relaxed);
    }

    fn eviction(&self, tier: Tier, blocks: u64) {
        self.tiers[tier_index(tier)]
            .evictions
            .fetch_add(blocks, Ordering::Relaxed);
    }

    fn pin_consolidation(&self, operations: u64) {
        self.consolidations.fetch_add(1, Ordering::Relaxed);
        self.consolidated_operations
            .fetch_add(operations, Ordering::Relaxed);
    }

    fn speculative_declined(&self) {
        self.speculative_declined.fetch_add(1, Ordering::Relaxed);
    }

    fn read_ahead(&self, outcome: ReadAheadOutcome, blocks: u64) {
        self.read_ahead[outcome.index()].fetch_add(blocks, Ordering::Relaxed);
    }

    fn acquires(&self, batch: AcquireBatch) {
        self.hits.fetch_add(batch.hits, Ordering::Relaxed);
        self.misses.fetch_add(batch.misses, Ordering::Relaxed);
        self.stall_nanos
            .fetch_add((batch.stall_seconds * 1e9) as u64, Ordering::Relaxed);
    }

    fn step(&self, seconds: f64) {
        self.steps.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut history) = self.step_history.lock() {
            history.push(seconds);
        }
    }

    fn error(&self, _kind: ErrorKind) {
        self.errors.fetch_add(1, Ordering::Relaxed);
    }
}

/// Bytes moved over one link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LinkSnapshot {
    /// The model's bytes carried over the link since the start.
    pub model_bytes: u64,
    /// LoRA factors' bytes carried over it, counted apart.
    pub lora_bytes: u64,
    /// Completed transfers (a block, a chunk or a pack each).
    pub transfers: u64,
    /// Sum of transfer durations (overlapping transfers add up).
    pub busy_seconds: f64,
}

/// One tier's occupancy now and at its peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierSnapshot {
    /// Everything the tier held at its last report (see [`TierUsage::used_bytes`]).
    pub used_bytes: u64,
    /// The most `used_bytes` any report showed since the start.
    pub peak_used_bytes: u64,
    /// The tier's budget, as last reported.
    pub budget_bytes: u64,
    /// The model's share of `used_bytes`.
    pub model_bytes: u64,
    /// LoRA adapters' share of `used_bytes`.
    pub lora_bytes: u64,
    /// The model's blocks in the tier at the last report.
    pub blocks: u64,
    /// Blocks that left the tier since the start, for any reason.
    pub evictions: u64,
}

/// A plain copy of the counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct StatsSnapshot {
    /// Reads into pinned buffers ([`Link::DiskToPinned`]).
    pub disk_to_pinned: LinkSnapshot,
    /// Copies from pinned buffers to the device ([`Link::PinnedToVram`]).
    pub pinned_to_vram: LinkSnapshot,
    /// `--fast-disk` chunks read through the staging ring on to the device
    /// ([`Link::DiskToVram`]).
    pub disk_to_vram: LinkSnapshot,
    /// The VRAM tier's occupancy.
    pub vram: TierSnapshot,
    /// The pinned tier's occupancy.
    pub pinned: TierSnapshot,
    /// Acquires that found the block ready, in the steps flushed so far.
    pub hits: u64,
    /// Acquires that waited for the block.
    pub misses: u64,
    /// Time the compute thread spent waiting in those misses, together.
    pub stall_seconds: f64,
    /// Sync points at which pin work was done together (and the ring's pinning at
    /// start).
    pub consolidations: u64,
    /// Pin registrations done at those sync points, together.
    pub consolidated_operations: u64,
    /// Speculative loads the allocator declined (they would have evicted a block
    /// needed sooner).
    pub speculative_declined: u64,
    /// Disk read-aheads a request used.
    pub read_ahead_used: u64,
    /// Disk read-aheads dropped unused.
    pub read_ahead_dropped: u64,
    /// Disk read-aheads whose read failed.
    pub read_ahead_failed: u64,
    /// Failures of every [`ErrorKind`], together.
    pub errors: u64,
    /// Steps the session ran.
    pub steps: u64,
    /// The last [`STEP_HISTORY`] of them (all of them in a shorter run), oldest first.
    pub step_seconds: Vec<f64>,
    /// Model bytes that landed in VRAM for each step (counted from the session's
    /// start) that used them, whenever the copy ran: the last [`STEP_HISTORY`] steps
    /// that loaded anything, by step. A step that loaded nothing is absent.
    pub step_loads: Vec<StepLoad>,
}

/// The model bytes one step needed copied to VRAM (see [`StatsSnapshot::step_loads`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StepLoad {
    /// The step, counted from the session's start.
    pub step: u64,
    /// Bytes copied from pinned buffers ([`Link::PinnedToVram`]).
    pub pinned_to_vram: u64,
    /// Bytes streamed from disk through the staging ring ([`Link::DiskToVram`]).
    pub disk_to_vram: u64,
}

impl StatsSnapshot {
    /// Model bytes `link` carried to VRAM for `step` (0 for a step that loaded
    /// nothing, or one older than the history keeps, and for disk → pinned).
    pub fn step_bytes(&self, link: Link, step: u64) -> u64 {
        self.step_loads
            .iter()
            .find(|load| load.step == step)
            .map_or(0, |load| match link {
                Link::PinnedToVram => load.pinned_to_vram,
                Link::DiskToVram => load.disk_to_vram,
                Link::DiskToPinned => 0,
            })
    }

    /// The figures of one link, by its enum rather than its field.
    pub fn link(&self, link: Link) -> &LinkSnapshot {
        match link {
            Link::DiskToPinned => &self.disk_to_pinned,
            Link::PinnedToVram => &self.pinned_to_vram,
            Link::DiskToVram => &self.disk_to_vram,
        }
    }

    /// Hits over all acquires; 0 before any step was flushed.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

impl Stats {
    /// A copy of every counter now. Each is read on its own, so a snapshot taken
    /// while the actors run may mix figures from around the same instant.
    pub fn snapshot(&self) -> StatsSnapshot {
        let link = |index: usize| {
            let counters = &self.links[index];
            LinkSnapshot {
                model_bytes: counters.model_bytes.load(Ordering::Relaxed),
                lora_bytes: counters.lora_bytes.load(Ordering::Relaxed),
                transfers: counters.transfers.load(Ordering::Relaxed),
                busy_seconds: counters.busy_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            }
        };
        let tier = |index: usize| {
            let counters = &self.tiers[index];
            TierSnapshot {
                used_bytes: counters.used_bytes.load(Ordering::Relaxed),
                peak_used_bytes: counters.peak_used_bytes.load(Ordering::Relaxed),
                budget_bytes: counters.budget_bytes.load(Ordering::Relaxed),
                model_bytes: counters.model_bytes.load(Ordering::Relaxed),
                lora_bytes: counters.lora_bytes.load(Ordering::Relaxed),
                blocks: counters.blocks.load(Ordering::Relaxed),
                evictions: counters.evictions.load(Ordering::Relaxed),
            }
        };
        StatsSnapshot {
            disk_to_pinned: link(0),
            pinned_to_vram: link(1),
            disk_to_vram: link(2),
            vram: tier(0),
            pinned: tier(1),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            stall_seconds: self.stall_nanos.load(Ordering::Relaxed) as f64 / 1e9,
            consolidations: self.consolidations.load(Ordering::Relaxed),
            consolidated_operations: self.consolidated_operations.load(Ordering::Relaxed),
            speculative_declined: self.speculative_declined.load(Ordering::Relaxed),
            read_ahead_used: self.read_ahead[ReadAheadOutcome::Used.index()]
                .load(Ordering::Relaxed),
            read_ahead_dropped: self.read_ahead[ReadAheadOutcome::Dropped.index()]
                .load(Ordering::Relaxed),
            read_ahead_failed: self.read_ahead[ReadAheadOutcome::Failed.index()]
                .load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            steps: self.steps.load(Ordering::Relaxed),
            step_seconds: self
                .step_history
                .lock()
                .map(|history| history.0.iter().copied().collect())
                .unwrap_or_default(),
            step_loads: self
                .step_loads
                .lock()
                .map(|loads| {
                    loads
                        .0
                        .iter()
                        .map(|&(step, [pinned_to_vram, disk_to_vram])| StepLoad {
                            step,
                            pinned_to_vram,
                            disk_to_vram,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_loads_add_up_per_step_in_any_order_and_keep_the_last_steps_only() {
        // Proves bytes landing for a step count for it whatever order they land in,
        // each link apart, and the record keeps the latest STEP_HISTORY steps.
        let stats = Stats::default();
        stats.step_load(Link::PinnedToVram, 2, 10);
        stats.step_load(Link::PinnedToVram, 1, 5);
        stats.step_load(Link::DiskToVram, 2, 7);
        stats.step_load(Link::PinnedToVram, 2, 1);
        stats.step_load(Link::DiskToPinned, 2, 100);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.step_bytes(Link::PinnedToVram, 1), 5);
        assert_eq!(snapshot.step_bytes(Link::PinnedToVram, 2), 11);
        assert_eq!(snapshot.step_bytes(Link::DiskToVram, 2), 7);
        assert_eq!(snapshot.step_bytes(Link::DiskToPinned, 2), 0);
        for step in 0..STEP_HISTORY as u64 + 10 {
            stats.step_load(Link::PinnedToVram, step, 1);
        }
        stats.step_load(Link::PinnedToVram, 0, 1);
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.step_loads.len(), STEP_HISTORY);
        assert_eq!(snapshot.step_loads[0].step, 10);
        assert_eq!(snapshot.step_bytes(Link::PinnedToVram, 0), 0);
    }

    #[test]
    fn the_step_history_keeps_the_last_steps_only() {
        // Proves a long session's step record stays bounded: after more steps than the
        // history holds, it keeps the most recent ones, oldest first, and counts all.
        let stats = Stats::default();
        let steps = STEP_HISTORY as u64 * 3 + 7;
        for step in 0..steps {
            stats.step(step as f64);
        }
        let snapshot = stats.snapshot();
        assert_eq!(snapshot.steps, steps);
        assert_eq!(snapshot.step_seconds.len(), STEP_HISTORY);
        assert_eq!(
            snapshot.step_seconds[0],
            (steps - STEP_HISTORY as u64) as f64
        );
        assert_eq!(
            snapshot.step_seconds.last().copied(),
            Some((steps - 1) as f64)
        );
    }
}
