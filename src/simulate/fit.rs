//! The fit check: will a model run on a machine under given budgets, and what is the
//! fastest a step can possibly be?
//!
//! The arithmetic is DESIGN §1's and mirrors the pipeline's plans (`VramPlan`,
//! `PinPlan`), so simulated runs can be checked against it:
//!
//! - VRAM: a model larger than the budget streams through a ring of
//!   `largest block × (prefetch_depth + 1)`; the rest of the budget keeps blocks
//!   resident. Bytes over PCIe per step = model − (budget − ring), at least 0.
//! - Pinned RAM: without `fast_disk` the staging ring is `largest block ×
//!   staging_buffers` inside the pin ceiling and the rest of the ceiling caches
//!   streamed blocks; with `fast_disk` blocks stream in chunks through a ring of
//!   `staging_buffers × staging_buffer_size` beside the ceiling (the host must spare
//!   RAM for both) and the whole ceiling caches. Bytes from disk per step = streamed −
//!   cache, at least 0. A cache smaller than the streamed bytes is not a failure: it
//!   means those bytes stream from disk every step. Either ring needs ≥ 2 buffers.
//! - Bound: `max(compute, pcie bytes / pinned link rate, disk bytes / disk rate)`.
//!   The cold first step must read and copy everything once.

use serde::Serialize;

use super::model::ModelDescription;
use crate::settings::Settings;
use crate::sim::HardwareProfile;

mod failure;
pub use failure::FitFailure;

/// Free RAM never goes below this, whatever `ram_floor` says (DESIGN §2).
pub const RAM_FLOOR_MIN_BYTES: u64 = 2 << 30;

/// The budget knobs the fit check reads (the same names as the settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FitSettings {
    /// `None` = VRAM − reserve_vram − vram_headroom.
    pub vram_budget_bytes: Option<u64>,
    pub reserve_vram_bytes: u64,
    pub vram_headroom_bytes: u64,
    /// `None` = RAM − max(ram_floor, 2 GiB).
    pub pin_ceiling_bytes: Option<u64>,
    pub ram_floor_bytes: u64,
    pub prefetch_depth: u32,
    pub staging_buffers: u32,
    /// Chunk size of the fast-disk ring.
    pub staging_buffer_bytes: u64,
    pub fast_disk: bool,
    /// The storage splits each read into requests of this size (`read_request_size`).
    pub read_request_bytes: u64,
}

/// Fewest buffers a staging ring works with (one filling, one being copied).
pub const MIN_STAGING_BUFFERS: u32 = 2;

/// Whole-block staging buffers a session really allocates at `depth`: at most
/// `depth + 2` are ever busy (depth + 1 blocks being read ahead, one being copied), so
/// the session stages with no more (`sim::run`, like `stagehand run`) and the rest of
/// the ceiling caches blocks. Fewer than [`MIN_STAGING_BUFFERS`] stay as configured, to
/// be refused.
pub fn whole_block_staging_buffers(configured: u32, depth: u32) -> u32 {
    configured.min(depth.saturating_add(2))
}

impl FitSettings {
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            vram_budget_bytes: settings.vram_budget.map(|budget| budget.as_u64()),
            reserve_vram_bytes: settings.reserve_vram.as_u64(),
            vram_headroom_bytes: settings.vram_headroom.as_u64(),
            pin_ceiling_bytes: settings.pin_ceiling.map(|ceiling| ceiling.as_u64()),
            ram_floor_bytes: settings.ram_floor.as_u64(),
            prefetch_depth: settings.prefetch_depth,
            staging_buffers: settings.staging_buffers,
            staging_buffer_bytes: settings.staging_buffer_size.as_u64(),
            fast_disk: settings.fast_disk,
            read_request_bytes: settings.read_request_size.as_u64(),
        }
    }
}

impl Default for FitSettings {
    fn default() -> Self {
        Self::from_settings(&Settings::default())
    }
}

/// What limits a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bottleneck {
    Compute,
    Link,
    Disk,
}

/// The verdict and the figures behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FitCheck {
    pub fits: bool,
    pub failures: Vec<FitFailure>,
    pub model_bytes: u64,
    pub largest_block_bytes: u64,
    pub vram_budget_bytes: u64,
    /// 0 when the whole model stays resident.
    pub ring_bytes: u64,
    pub resident_bytes: u64,
    /// What the fit counts beside the weights: a decoder's first KV pages, a step's
    /// activation tensors (0: the description states none).
    pub activation_bytes: u64,
    /// VRAM the plan takes under the budget: resident weights, the ring, activations.
    pub vram_used_bytes: u64,
    /// The budget less what the plan takes.
    pub vram_margin_bytes: u64,
    /// The least budget this model runs under at this depth, activations counted.
    pub vram_least_bytes: u64,
    pub pcie_bytes_per_step: u64,
    pub pin_ceiling_bytes: u64,
    pub staging_bytes: u64,
    pub pinned_cache_bytes: u64,
    pub disk_bytes_per_step: u64,
    pub compute_seconds: f64,
    pub pcie_seconds: f64,
    pub disk_seconds: f64,
    /// Steady state: `max(compute, pcie, disk)`.
    pub bound_seconds: f64,
    pub bottleneck: Bottleneck,
    /// First step: every byte read from disk and copied once.
    pub cold_bound_seconds: f64,
}

/// The pipeline's VRAM plan for this budget, if one is feasible: (ring bytes, slot bytes).
fn pipeline_ring(model: &ModelDescription, budget_bytes: u64, depth: u32) -> Option<(u64, u64)> {
    use stagehand_actors::{BlockId, ResidencyPolicy, StepOrder, VramPlan};
    let layout = model.layout();
    let order = StepOrder::new(
        (0..layout.len() as u32).map(BlockId).collect(),
        layout.len(),
    )
    .ok()?;
    let plan = VramPlan::new(
        &layout,
        &order,
        budget_bytes,
        depth,
        ResidencyPolicy::Planned,
    )
    .ok()?;
    Some((plan.ring_bytes(), plan.slot_bytes))
}

/// The least VRAM budget the pipeline's plan takes for this model at `depth`.
fn plan_minimum(model: &ModelDescription, depth: u32) -> u64 {
    use stagehand_actors::{BlockId, ResidencyPolicy, StepOrder, VramPlan};
    let layout = model.layout();
    let Ok(order) = StepOrder::new(
        (0..layout.len() as u32).map(BlockId).collect(),
        layout.len(),
    ) else {
        return 0;
    };
    VramPlan::minimum_capacity_bytes(&layout, &order, depth, ResidencyPolicy::Planned)
}

impl FitCheck {
    pub fn new(
        model: &ModelDescription,
        hardware: &HardwareProfile,
        settings: &FitSettings,
    ) -> Self {
        let mut failures = Vec::new();
        let model_bytes = model.total_bytes();
        let largest_block_bytes = model.largest_block_bytes();
        let vram = VramFit::new(model, hardware, settings, &mut failures);
        let pinned = PinnedFit::new(
            hardware,
            settings,
            &vram,
            largest_block_bytes,
            &mut failures,
        );
        let bound = BoundFit::new(model, hardware, &vram, &pinned);
        Self {
            fits: failures.is_empty(),
            failures,
            model_bytes,
            largest_block_bytes,
            vram_budget_bytes: vram.budget_bytes,
            ring_bytes: vram.ring_bytes,
            resident_bytes: vram.resident_bytes,
            activation_bytes: vram.activation_bytes,
            vram_used_bytes: vram.used_bytes(),
            vram_margin_bytes: vram.budget_bytes.saturating_sub(vram.used_bytes()),
            vram_least_bytes: plan_minimum(model, settings.prefetch_depth).min(model_bytes)
                + vram.activation_bytes,
            pcie_bytes_per_step: vram.pcie_bytes_per_step,
            pin_ceiling_bytes: pinned.ceiling_bytes,
            staging_bytes: pinned.staging_bytes,
            pinned_cache_bytes: pinned.cache_bytes,
            disk_bytes_per_step: pinned.disk_bytes_per_step,
            compute_seconds: bound.compute_seconds,
            pcie_seconds: bound.pcie_seconds,
            disk_seconds: bound.disk_seconds,
            bound_seconds: bound.seconds,
            bottleneck: bound.bottleneck,
            cold_bound_seconds: bound.cold_seconds,
        }
    }
}

/// The VRAM side of the fit: the budget, the streaming ring, and what stays resident.
struct VramFit {
    budget_bytes: u64,
    /// The size of one ring slot (the largest streamed block).
    slot_bytes: u64,
    ring_bytes: u64,
    resident_bytes: u64,
    activation_bytes: u64,
    pcie_bytes_per_step: u64,
}

impl VramFit {
    fn used_bytes(&self) -> u64 {
        self.resident_bytes + self.ring_bytes + self.activation_bytes
    }

    fn new(
        model: &ModelDescription,
        hardware: &HardwareProfile,
        settings: &FitSettings,
        failures: &mut Vec<FitFailure>,
    ) -> Self {
        let model_bytes = model.total_bytes();
        let largest_block_bytes = model.largest_block_bytes();
        let vram_available_bytes = hardware
            .vram_bytes()
            .saturating_sub(settings.reserve_vram_bytes)
            .saturating_sub(settings.vram_headroom_bytes);
        let vram_budget_bytes = settings.vram_budget_bytes.unwrap_or(vram_available_bytes);
        if vram_budget_bytes > vram_available_bytes {
            failures.push(FitFailure::VramBudgetAboveDevice {
                budget_bytes: vram_budget_bytes,
                available_bytes: vram_available_bytes,
            });
        }
        // A decoder's first KV pages and a family's activation tensors are kept out of
        // the plan (the session plans in the budget less them, as `stagehand run`
        // does); a shortfall counts them.
        let kv_start_bytes = model.activation_reserve_bytes();
        let plan_budget_bytes = vram_budget_bytes.saturating_sub(kv_start_bytes);
        let streams = model_bytes > plan_budget_bytes;
        // The ring the pipeline's own plan picks: slots sized for the largest block it
        // streams (blocks too large to stream stay resident). Without a feasible plan,
        // the ring a largest-block slot would need, to report the shortfall.
        let planned = pipeline_ring(model, plan_budget_bytes, settings.prefetch_depth);
        // Whole-block staging buffers hold the largest streamed block (a larger, resident
        // block is loaded once in chunks through them).
        let slot_bytes = planned.map_or(largest_block_bytes, |(_, slot)| slot);
        let ring_bytes = if streams {
            planned.map_or(
                largest_block_bytes * (u64::from(settings.prefetch_depth) + 1),
                |(ring, _)| ring,
            )
        } else {
            0
        };
        if ring_bytes > plan_budget_bytes {
            let depth = settings.prefetch_depth;
            let fits_at_depth = (0..depth)
                .rev()
                .find(|&smaller| plan_minimum(model, smaller) <= plan_budget_bytes);
            failures.push(FitFailure::VramBelowRing {
                budget_bytes: vram_budget_bytes,
                ring_bytes: ring_bytes + kv_start_bytes,
                largest_block_bytes,
                prefetch_depth: depth,
                needed_bytes: plan_minimum(model, depth) + kv_start_bytes,
                fits_at_depth,
                least_bytes: plan_minimum(model, 0) + kv_start_bytes,
                activation_bytes: kv_start_bytes,
            });
        }
        let resident_bytes = model_bytes.min(plan_budget_bytes.saturating_sub(ring_bytes));
        Self {
            budget_bytes: vram_budget_bytes,
            slot_bytes,
            ring_bytes,
            resident_bytes,
            activation_bytes: kv_start_bytes,
            pcie_bytes_per_step: model_bytes - resident_bytes,
        }
    }
}

/// The pinned side of the fit: the ceiling, the staging ring, and the cache of
/// streamed blocks that spares the disk.
struct PinnedFit {
    ceiling_bytes: u64,
    staging_bytes: u64,
    cache_bytes: u64,
    disk_bytes_per_step: u64,
}

impl PinnedFit {
    fn new(
        hardware: &HardwareProfile,
        settings: &FitSettings,
        vram: &VramFit,
        largest_block_bytes: u64,
        failures: &mut Vec<FitFailure>,
    ) -> Self {
        // The pipeline's staging ring: block-sized buffers inside the ceiling (as many
        // as the depth can keep busy), or fast-disk chunks beside it.
        let (staging_buffers, staging_buffer_bytes) = if settings.fast_disk {
            (settings.staging_buffers, settings.staging_buffer_bytes)
        } else {
            (
                whole_block_staging_buffers(settings.staging_buffers, settings.prefetch_depth),
                vram.slot_bytes,
            )
        };
        let staging_bytes = u64::from(staging_buffers) * staging_buffer_bytes;
        if staging_buffers < MIN_STAGING_BUFFERS || staging_buffer_bytes == 0 {
            failures.push(FitFailure::StagingRingUnusable {
                staging_buffers,
                staging_buffer_bytes,
            });
        }
        let ram_floor_bytes = settings.ram_floor_bytes.max(RAM_FLOOR_MIN_BYTES);
        let ring_beside_ceiling_bytes = if settings.fast_disk { staging_bytes } else { 0 };
        let pin_available_bytes = hardware
            .ram_bytes
            .saturating_sub(ram_floor_bytes)
            .saturating_sub(ring_beside_ceiling_bytes);
        let pin_ceiling_bytes = settings.pin_ceiling_bytes.unwrap_or(pin_available_bytes);
        if pin_ceiling_bytes > pin_available_bytes {
            failures.push(FitFailure::PinCeilingAboveHost {
                ceiling_bytes: pin_ceiling_bytes,
                available_bytes: pin_available_bytes,
            });
        }
        let cache_room_bytes = if settings.fast_disk {
            pin_ceiling_bytes
        } else {
            if staging_bytes > pin_ceiling_bytes {
                failures.push(FitFailure::PinnedBelowStaging {
                    ceiling_bytes: pin_ceiling_bytes,
                    staging_bytes,
                    largest_block_bytes,
                    staging_buffers,
                });
            }
            pin_ceiling_bytes.saturating_sub(staging_bytes)
        };
        let pinned_cache_bytes = cache_room_bytes.min(vram.pcie_bytes_per_step);
        Self {
            ceiling_bytes: pin_ceiling_bytes,
            staging_bytes,
            cache_bytes: pinned_cache_bytes,
            disk_bytes_per_step: vram.pcie_bytes_per_step - pinned_cache_bytes,
        }
    }
}

/// The bound of a step: the slowest of compute, the link and the disk.
struct BoundFit {
    compute_seconds: f64,
    pcie_seconds: f64,
    disk_seconds: f64,
    seconds: f64,
    bottleneck: Bottleneck,
    cold_seconds: f64,
}

impl BoundFit {
    fn new(
        model: &ModelDescription,
        hardware: &HardwareProfile,
        vram: &VramFit,
        pinned: &PinnedFit,
    ) -> Self {
        let model_bytes = model.total_bytes();
        let compute_rates = hardware.compute_rates();
        let compute_seconds: f64 = model
            .blocks
            .iter()
            .map(|block| {
                compute_rates
                    .block_duration(model.block_step_flops(block), block.bytes)
                    .as_secs_f64()
            })
            .sum();
        let link_rate = hardware.link_rates().pinned_bytes_per_second as f64;
        let disk_rate = hardware.disk_rates().bytes_per_second as f64;
        let pcie_seconds = vram.pcie_bytes_per_step as f64 / link_rate;
        let disk_seconds = pinned.disk_bytes_per_step as f64 / disk_rate;
        let (bound_seconds, bottleneck) = [
            (compute_seconds, Bottleneck::Compute),
            (pcie_seconds, Bottleneck::Link),
            (disk_seconds, Bottleneck::Disk),
        ]
        .into_iter()
        .fold((0.0, Bottleneck::Compute), |best, candidate| {
            if candidate.0 > best.0 {
                candidate
            } else {
                best
            }
        });
        Self {
            compute_seconds,
            pcie_seconds,
            disk_seconds,
            seconds: bound_seconds,
            bottleneck,
            // The first step reads and copies every byte once.
            cold_seconds: compute_seconds
                .max(model_bytes as f64 / link_rate)
                .max(model_bytes as f64 / disk_rate),
        }
    }
}

#[cfg(test)]
#[path = "fit_tests.rs"]
mod tests;
