//! Choosing the prefetch depth by simulation (`stagehand simulate --prefetch-depth auto`).
//!
//! No single depth is right everywhere. Where there is compute to hide transfers
//! behind, looking further ahead keeps the link and the disk busy; where there is
//! nothing to overlap (batch-1 decode from a slow disk), each of the ring's
//! `depth + 1` slots is a block that cannot stay resident, so a deeper ring only moves
//! more bytes per step. The simulator can simply try: run a few steps at each depth
//! with the same budgets and keep the fastest steady step.

use serde::Serialize;

use super::fit::{FitCheck, FitSettings};
use super::model::ModelDescription;
use super::policy::Policy;
use super::run::{run_policy, RunOptions};
use crate::sim::FaultPlan;
use crate::sim::HardwareProfile;

/// The depths the search tries: 0 (load on use) to 4. Beyond 4 a ring costs more
/// residency than any shipped scenario gains from looking further ahead.
pub const AUTO_DEPTH_MAX: u32 = 4;

/// Steps each candidate runs: the cold one, one that still uses what the cold step
/// prefetched for it, and three steady ones (their median is the figure; see
/// `steady_window`).
pub const SEARCH_STEPS: u64 = 5;

/// Steady steps within this fraction of the fastest are a tie, and a tie goes to the
/// smaller depth: a deeper ring holds one more block of VRAM and one more staging
/// buffer of pinned RAM, worth it only for a gain a run can show. 1 % is below that:
/// the simulator agrees with runs on this backend to a few percent at best
/// (docs/simulator.md, "`stagehand validate`"), and runs of one depth spread more than
/// that from step to step. Measured: issue 22's scenario predicted 64.24 ms at depth 2 and 64.26 at
/// depth 1; depth 1 ran fastest (median 62.3 ms against 66.4).
pub const TIE_RELATIVE: f64 = 0.01;

/// One depth tried.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DepthCandidate {
    pub depth: u32,
    /// Median steady step of the short run; `None` when it could not run.
    pub steady_step_seconds: Option<f64>,
    /// Why it has no figure: a budget that does not fit at this depth, or the run's error.
    pub error: Option<String>,
}

impl DepthCandidate {
    pub fn measured(depth: u32, steady_step_seconds: f64) -> Self {
        Self {
            depth,
            steady_step_seconds: Some(steady_step_seconds),
            error: None,
        }
    }

    pub fn failed(depth: u32, error: String) -> Self {
        Self {
            depth,
            steady_step_seconds: None,
            error: Some(error),
        }
    }
}

/// The depths worth trying: `0..=AUTO_DEPTH_MAX`, plus the configured one when it is
/// deeper, so the answer can say how the configured depth compares.
pub fn candidate_depths(configured: u32) -> Vec<u32> {
    let mut depths: Vec<u32> = (0..=AUTO_DEPTH_MAX).collect();
    if configured > AUTO_DEPTH_MAX {
        depths.push(configured);
    }
    depths
}

/// The depth with the fastest steady step; ties (within [`TIE_RELATIVE`]) go to the
/// smaller depth. `None` when no candidate has a figure.
pub fn pick_depth(candidates: &[DepthCandidate]) -> Option<u32> {
    let fastest = candidates
        .iter()
        .filter_map(|candidate| candidate.steady_step_seconds)
        .min_by(f64::total_cmp)?;
    let tie_limit = fastest * (1.0 + TIE_RELATIVE);
    candidates
        .iter()
        .filter(|candidate| {
            candidate
                .steady_step_seconds
                .is_some_and(|seconds| seconds <= tie_limit)
        })
        .map(|candidate| candidate.depth)
        .min()
}

/// Runs [`SEARCH_STEPS`] steps of stagehand at each depth, with the budgets the
/// settings give (the same at every depth) and the same seed and jitter. Injected read
/// failures are left out: they would only hide depths, and the chosen depth's real run
/// meets them. A depth whose budgets do not fit, or whose run fails, is reported with
/// why; the search itself never fails.
pub fn search_prefetch_depth(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    settings: &FitSettings,
    faults: &FaultPlan,
    max_reads_in_flight: usize,
    depths: &[u32],
) -> Vec<DepthCandidate> {
    let faults = FaultPlan {
        fail_read_after: None,
        ..faults.clone()
    };
    depths
        .iter()
        .map(|&depth| {
            let at_depth = FitSettings {
                prefetch_depth: depth,
                ..*settings
            };
            let fit = FitCheck::new(model, hardware, &at_depth);
            if let Some(failure) = fit.failures.first() {
                return DepthCandidate::failed(depth, format!("does not fit: {failure}"));
            }
            let options = RunOptions {
                steps: SEARCH_STEPS,
                vram_budget_bytes: fit.vram_budget_bytes,
                pin_ceiling_bytes: fit.pin_ceiling_bytes,
                settings: at_depth,
                faults: faults.clone(),
                trace: None,
                max_reads_in_flight,
                virtual_time_limit: None,
            };
            match run_policy(model, hardware, Policy::Stagehand, &options) {
                Ok(run) => DepthCandidate::measured(depth, run.steady_step_seconds),
                Err(error) => DepthCandidate::failed(depth, error.to_string()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1_000_000;

    /// A toy box: 2 GB of VRAM, 8 GB of RAM, a 0.1 GB/s disk and a link of the given rate.
    fn toy_box(link_gb_per_s: f64) -> HardwareProfile {
        let text = r#"
            [gpu]
            name = "toy"
            vram = "2 GB"
            pcie_generation = 4
            bf16_dense_tflops = 10
            sustained_efficiency = 0.5
            memory_gb_per_s = 100

            [host]
            ram = "8 GB"

            [link]
            pinned_gb_per_s = LINK
            pageable_gb_per_s = 0.5
            latency_us = 10

            [disk]
            read_gb_per_s = 0.1
            request_latency_us = 100
        "#;
        let text = text.replace("LINK", &link_gb_per_s.to_string());
        HardwareProfile::parse("toy", "test", &text).unwrap()
    }

    /// `blocks` blocks of 100 MB, each `flops` per token, one token per step.
    fn toy_model(blocks: u64, flops: f64) -> ModelDescription {
        let text = format!(
            "dtype = \"bf16\"\ntokens_per_step = 1\nblock_count = {blocks}\nbytes_per_block = {}\nflops_per_token_per_block = {flops:e}\n",
            100 * MB
        );
        ModelDescription::parse("toy", "test", &text).unwrap()
    }

    fn search(
        model: &ModelDescription,
        link_gb_per_s: f64,
        settings: &FitSettings,
    ) -> Vec<DepthCandidate> {
        search_prefetch_depth(
            model,
            &toy_box(link_gb_per_s),
            settings,
            &FaultPlan::default(),
            4,
            &candidate_depths(settings.prefetch_depth),
        )
    }

    fn steady(candidates: &[DepthCandidate], depth: u32) -> f64 {
        candidates
            .iter()
            .find(|candidate| candidate.depth == depth)
            .and_then(|candidate| candidate.steady_step_seconds)
            .unwrap()
    }

    #[test]
    fn the_fastest_depth_wins_and_ties_go_to_the_smaller_depth() {
        // Proves the pick is the minimum steady step, and that equal figures (within
        // the tie tolerance) choose the smallest depth, whatever the listing order.
        let figures = |pairs: &[(u32, f64)]| -> Vec<DepthCandidate> {
            pairs
                .iter()
                .map(|&(depth, seconds)| DepthCandidate::measured(depth, seconds))
                .collect()
        };
        assert_eq!(
            pick_depth(&figures(&[(0, 3.0), (1, 2.0), (2, 2.5)])),
            Some(1)
        );
        assert_eq!(
            pick_depth(&figures(&[(3, 2.0), (1, 2.0), (2, 2.0)])),
            Some(1)
        );
        let within_tolerance = 2.0 * (1.0 + TIE_RELATIVE / 2.0);
        assert_eq!(
            pick_depth(&figures(&[(0, within_tolerance), (2, 2.0)])),
            Some(0)
        );
        let beyond_tolerance = 2.0 * (1.0 + 2.0 * TIE_RELATIVE);
        assert_eq!(
            pick_depth(&figures(&[(0, beyond_tolerance), (2, 2.0)])),
            Some(2)
        );
        let mut some_failed = figures(&[(2, 5.0)]);
        some_failed.insert(0, DepthCandidate::failed(0, "does not fit".to_string()));
        assert_eq!(pick_depth(&some_failed), Some(2));
        assert_eq!(
            pick_depth(&[DepthCandidate::failed(1, "x".to_string())]),
            None
        );
    }

    #[test]
    fn with_compute_to_overlap_the_search_prefers_prefetching() {
        // Proves the search on a simulated toy picks a depth ≥ 1 when each block's
        // compute can hide the next block's copy: 20 × 100 MB through a 600 MB budget,
        // 120 ms of compute per block (0.6 TFLOP at 5 TFLOP/s) vs 100 ms per copy at
        // 1 GB/s, and every block cached in pinned RAM after the cold step.
        let model = toy_model(20, 6e11);
        let settings = FitSettings {
            vram_budget_bytes: Some(600 * MB),
            pin_ceiling_bytes: Some(3000 * MB),
            ..FitSettings::default()
        };
        let candidates = search(&model, 1.0, &settings);
        let chosen = pick_depth(&candidates).unwrap_or_else(|| panic!("{candidates:?}"));
        assert!(chosen >= 1, "{candidates:?}");
        assert!(
            steady(&candidates, chosen) < steady(&candidates, 0),
            "{candidates:?}"
        );
        for candidate in &candidates {
            assert!(
                steady(&candidates, chosen)
                    <= steady(&candidates, candidate.depth) * (1.0 + TIE_RELATIVE)
            );
        }
    }

    #[test]
    fn with_nothing_to_overlap_the_search_keeps_residency() {
        // Proves that when the disk dominates and compute is negligible, depth 0 wins:
        // every extra ring slot and staging buffer is a block read from the 0.1 GB/s disk
        // every step, and there is nothing to hide the 10 ms copies behind. 40 × 100 MB,
        // 800 MB of VRAM, 1 GB pinned: 25 blocks from disk at depth 0, 28 at depth 2.
        let model = toy_model(40, 1.0);
        let settings = FitSettings {
            vram_budget_bytes: Some(800 * MB),
            pin_ceiling_bytes: Some(1000 * MB),
            ..FitSettings::default()
        };
        let candidates = search(&model, 10.0, &settings);
        assert_eq!(pick_depth(&candidates), Some(0), "{candidates:?}");
        assert!(
            steady(&candidates, 0) < steady(&candidates, 2),
            "{candidates:?}"
        );
    }

    #[test]
    fn a_resident_model_ties_at_every_depth_and_picks_zero() {
        // Proves the tie rule on real runs: 5 × 100 MB fits a 2 GB card whole, so
        // every depth runs the same step and the smallest depth is chosen.
        let model = toy_model(5, 1e9);
        let candidates = search(&model, 1.0, &FitSettings::default());
        let first = steady(&candidates, 0);
        for candidate in &candidates {
            assert_eq!(candidate.steady_step_seconds, Some(first), "{candidates:?}");
        }
        assert_eq!(pick_depth(&candidates), Some(0));
    }

    #[test]
    fn a_depth_whose_ring_does_not_fit_is_reported_not_chosen() {
        // Proves a candidate whose ring exceeds the budget is skipped with the fit
        // check's reason: 250 MB of VRAM holds 2 slots of 100 MB, not 3.
        let model = toy_model(10, 1e9);
        let settings = FitSettings {
            vram_budget_bytes: Some(250 * MB),
            ..FitSettings::default()
        };
        let candidates = search(&model, 1.0, &settings);
        let deep = candidates.iter().find(|c| c.depth == 2).unwrap();
        assert!(
            deep.error
                .as_deref()
                .is_some_and(|e| e.contains("vram_budget")),
            "{candidates:?}"
        );
        assert!(pick_depth(&candidates).is_some_and(|depth| depth <= 1));
    }
}
