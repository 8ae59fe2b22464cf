//! What a run moved per step over each link, and the steady state: the steps after
//! the cold one and its warm-up, where per-step figures are read.

use serde::Serialize;
use stagehand_actors::{Link, StatsSnapshot};

/// Bytes over each link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct LinkBytes {
    pub disk_to_pinned: u64,
    pub pinned_to_vram: u64,
    pub disk_to_vram: u64,
}

impl LinkBytes {
    pub(super) fn of(stats: &StatsSnapshot) -> Self {
        Self {
            disk_to_pinned: stats.link(Link::DiskToPinned).model_bytes,
            pinned_to_vram: stats.link(Link::PinnedToVram).model_bytes,
            disk_to_vram: stats.link(Link::DiskToVram).model_bytes,
        }
    }

    pub(super) fn minus(self, earlier: Self) -> Self {
        Self {
            disk_to_pinned: self.disk_to_pinned - earlier.disk_to_pinned,
            pinned_to_vram: self.pinned_to_vram - earlier.pinned_to_vram,
            disk_to_vram: self.disk_to_vram - earlier.disk_to_vram,
        }
    }

    /// Bytes that reached VRAM (from pinned RAM or straight from disk).
    pub fn to_vram(&self) -> u64 {
        self.pinned_to_vram + self.disk_to_vram
    }

    /// Bytes read from disk.
    pub fn from_disk(&self) -> u64 {
        self.disk_to_pinned + self.disk_to_vram
    }
}

/// Mean bytes per steady-state step over each link.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct SteadyBytes {
    pub disk_to_pinned: f64,
    pub pinned_to_vram: f64,
    pub disk_to_vram: f64,
}

impl SteadyBytes {
    pub fn to_vram(&self) -> f64 {
        self.pinned_to_vram + self.disk_to_vram
    }

    pub fn from_disk(&self) -> f64 {
        self.disk_to_pinned + self.disk_to_vram
    }
}

/// The steps that count as steady state: the first step is cold (everything read
/// and copied once), and the second still benefits from what the first prefetched
/// for it, so both are left out when there are enough steps.
pub fn steady_window<T>(per_step: &[T]) -> &[T] {
    let skip = match per_step.len() {
        0 | 1 => 0,
        2 => 1,
        _ => 2,
    };
    &per_step[skip..]
}

pub(super) fn steady(step_seconds: &[f64]) -> f64 {
    let later = steady_window(step_seconds);
    if later.is_empty() {
        return 0.0;
    }
    let mut sorted = later.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

pub(super) fn steady_bytes(bytes_per_step: &[LinkBytes]) -> SteadyBytes {
    let later = steady_window(bytes_per_step);
    let count = later.len().max(1) as f64;
    let sum = |field: fn(&LinkBytes) -> u64| later.iter().map(field).sum::<u64>() as f64 / count;
    SteadyBytes {
        disk_to_pinned: sum(|bytes| bytes.disk_to_pinned),
        pinned_to_vram: sum(|bytes| bytes.pinned_to_vram),
        disk_to_vram: sum(|bytes| bytes.disk_to_vram),
    }
}
