//! A run's physical bound: its link rates, and the machine's floor under its steady
//! step's kernels (the roofline, on the CPU backend) — never one the run beat.

use std::sync::Arc;

use stagehand_actors::{BlockId, Device, Link, ModelLayout, Storage};

use crate::compute::ComputeDtype;
use crate::run::bound::{measure_rates, measure_read_rate, LinkRates, StepBound};
use crate::run::driver::RunReport;
use crate::run::roofline::{steady_work, Obtained, Roofline};

use super::{Prepared, RunError};

/// What a run's link rates are timed on: its device, its files and their blocks.
pub(super) struct Links<'a> {
    pub device: &'a Arc<dyn Device>,
    pub storage: &'a Arc<dyn Storage>,
    pub layout: &'a ModelLayout,
    /// [`super::RunPlan::measure_links`].
    pub measure: bool,
}

/// A run's link rates, its bound, and the roofline the bound came from.
pub(super) struct Bounded {
    pub rates: LinkRates,
    pub bound: StepBound,
    pub roofline: Option<RooflineUsed>,
}

/// The roofline a run's bound came from, as the run left it.
#[derive(Debug, Clone)]
pub struct RooflineUsed {
    /// The figures under the run's `compute_dtype` (after any raise).
    pub roofline: Roofline,
    /// The step's floor under the roofline as taken over its measured compute, where
    /// the step beat it and the roofline was raised (else `None`).
    pub compute_raised_by: Option<f64>,
    /// The steps' copy rate over the cached one, where they beat it.
    pub copy_raised_by: Option<f64>,
}

/// The run's link rates and its physical bound. On the CPU backend (`obtained`
/// known) the compute's share is the machine's roofline under the step's own kernels
/// and the copies' is its copy rate (unless the plan times its own); a device without
/// one keeps its measured compute and times its copies now. A step that computed or
/// copied faster than the roofline allows shows a figure was measured too low: it is
/// raised to what the step reached, and cached so.
pub(super) fn physical_bound(
    prepared: &Prepared,
    report: &RunReport,
    obtained: Option<&Obtained>,
    compute_dtype: ComputeDtype,
    links: Links<'_>,
) -> Result<Bounded, RunError> {
    let Links {
        device,
        storage,
        layout,
        measure,
    } = links;
    let cached_copy_rate =
        (obtained.filter(|_| !measure)).map(|obtained| obtained.roofline.copy_bytes_per_second);
    let read_from_disk = |index: usize| !report.plan.pins.is_cached(BlockId(index as u32));
    let mut rates = match cached_copy_rate {
        Some(copy_bytes_per_second) => measure_read_rate(device, storage, layout, read_from_disk)
            .map(|read_bytes_per_second| LinkRates {
                copy_bytes_per_second,
                read_bytes_per_second,
            }),
        None => measure_rates(device, storage, layout, read_from_disk),
    }
    // Allocating, copying or reading for the calibration failed: the device's or
    // the storage's fault, in their words.
    .map_err(|message| RunError::Device {
        message,
        source: None,
    })?;
    let streamed = report.plan.vram.streamed_bytes_per_step as f64;
    let disk = report.plan.pins.disk_bytes_per_step as f64;
    let Some(obtained) = obtained else {
        let bound = StepBound::new(report.steady_compute_seconds(), streamed, disk, rates);
        return Ok(Bounded {
            rates,
            bound,
            roofline: None,
        });
    };
    let work = steady_work(prepared);
    let used = raised_where_beaten(obtained, report, &work, compute_dtype, !measure);
    if cached_copy_rate.is_some() {
        rates.copy_bytes_per_second = used.roofline.copy_bytes_per_second;
    }
    let mut floor = used.roofline.floor(&work);
    if used.compute_raised_by.is_some() {
        // Raised to the step's compute exactly; rounding must not leave it above.
        floor.seconds = floor.seconds.min(report.steady_compute_seconds());
    }
    Ok(Bounded {
        rates,
        bound: StepBound::on_roofline(floor, streamed, disk, rates),
        roofline: Some(used),
    })
}

/// The roofline `obtained` under `compute_dtype`, raised where the run beat it: its
/// steady compute under the floor of `work`, or (`copies_from_roofline`) its steps'
/// copies above the copy rate. A raised roofline is cached where this one came from
/// the cache or from an optimised build's measurement (an unoptimised build's own
/// measurement serves its process only).
fn raised_where_beaten(
    obtained: &Obtained,
    report: &RunReport,
    work: &crate::compute::work::Work,
    compute_dtype: ComputeDtype,
    copies_from_roofline: bool,
) -> RooflineUsed {
    let now = super::roofline::unix_now();
    let mut roofline = obtained.roofline.clone();
    let compute_raise =
        roofline.raised_to_step(compute_dtype, work, report.steady_compute_seconds(), now);
    let compute_raised_by = compute_raise.map(|raise| {
        roofline = raise.roofline;
        raise.factor
    });
    let copied_bytes_per_second =
        report.steady_bytes_per_step(Link::PinnedToVram) / report.steady_step_seconds().max(1e-9);
    let copy_raise = (copies_from_roofline && report.steps >= 2)
        .then(|| roofline.raised_copy_rate(copied_bytes_per_second, now))
        .flatten();
    let copy_raised_by = copy_raise.map(|raise| {
        roofline = raise.roofline;
        raise.factor
    });
    let raised = compute_raised_by.is_some() || copy_raised_by.is_some();
    if raised && (obtained.from_cache || !cfg!(debug_assertions)) {
        roofline.store_noting_failure(&super::default_cache_dir());
    }
    RooflineUsed {
        roofline: roofline.for_compute_dtype(compute_dtype),
        compute_raised_by,
        copy_raised_by,
    }
}
