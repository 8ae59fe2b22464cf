//! What a decoder run shows in Prometheus: the KV cache's growth (blocks displaced, the
//! plan's streamed bytes after the re-plan) and a Mixtral run's expert acquires by
//! outcome, each equal to the run report's own figure. Real runs on the CPU backend,
//! scraped from the in-process exposition.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::decoder::{decoder_plan, tiny_decoder, KV_GROWTH_BUDGET};
use stagehand::compute::DType;
use stagehand::families::llama::DecoderArch;
use stagehand::run::{execute, prepare_with, Extras, Outcome, WorkloadKind};
use stagehand::settings::Settings;
use stagehand::telemetry::{catalog, exposition, PrometheusObserver};

fn folder(dir: &Path, arch: DecoderArch) -> PathBuf {
    tiny_decoder(dir, arch, DType::F32, 11)
}

/// A scrape of the in-process exposition after a run.
struct Scrape(Vec<exposition::Sample>);

impl Scrape {
    /// The sum of `name`'s series whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        exposition::sum(&self.0, name, labels)
    }
}

/// Runs `model` for `steps` tokens under `vram` bytes, reporting to a fresh in-process
/// Prometheus observer; the outcome and the scrape after it.
fn run_scraped(model: &Path, steps: u64, vram: u64) -> (Outcome, Scrape) {
    let settings = Settings::default();
    let prepared = prepare_with(
        model,
        WorkloadKind::Auto,
        1,
        &settings,
        false,
        &Extras::default(),
    )
    .unwrap();
    let observer = Arc::new(PrometheusObserver::in_process().expect("observer"));
    let outcome = execute(
        &prepared,
        decoder_plan(&settings, vram, steps, observer.clone()),
    )
    .unwrap_or_else(|error| panic!("run: {error}"));
    let samples = exposition::parse(&observer.render()).expect("parse exposition");
    (outcome, Scrape(samples))
}

#[test]
fn kv_growth_shows_as_displaced_blocks_and_a_larger_streamed_plan() {
    // Proves the metrics of a growing KV cache: the blocks that gave way and the
    // plan's bytes per step after the re-plan equal the report's, and before any
    // growth the plan gauge started at the plan's figure (all resident: zero).
    let dir = tempfile::tempdir().unwrap();
    let model = folder(dir.path(), DecoderArch::Llama);
    let (outcome, scrape) = run_scraped(&model, 200, KV_GROWTH_BUDGET);
    let report = &outcome.report;
    assert_eq!(report.verified_steps, 200);
    let displaced: usize = report
        .kv_growth
        .iter()
        .map(|(_, _, blocks)| blocks.len())
        .sum();
    assert!(displaced > 0, "the budget must make weights give way");
    assert_eq!(report.plan.vram.streamed_bytes_per_step, 0);
    assert_eq!(
        scrape.value(catalog::ACTIVATION_DISPLACED_BLOCKS, &[]),
        displaced as f64
    );
    assert_eq!(
        scrape.value(catalog::PLAN_STEP_STREAMED_BYTES, &[]),
        outcome.streamed_bytes_per_step_after_kv as f64
    );
    assert!(outcome.streamed_bytes_per_step_after_kv > 0);
}

#[test]
fn a_mixtral_run_counts_its_expert_acquires_by_outcome() {
    // Proves each expert acquire is scraped once under its outcome: hits, late (hinted,
    // not landed) and misses (not foreseen) add up to the report's hits and misses.
    let dir = tempfile::tempdir().unwrap();
    let model = folder(dir.path(), DecoderArch::Mixtral);
    let (outcome, scrape) = run_scraped(&model, 12, 4 << 20);
    let report = &outcome.report;
    assert_eq!(report.verified_steps, 12);
    assert!(report.expert_hits + report.expert_misses > 0);
    let outcome_of = |label| scrape.value(catalog::EXPERT_ACQUIRES, &[("outcome", label)]);
    assert_eq!(outcome_of("hit"), report.expert_hits as f64);
    assert_eq!(outcome_of("late"), report.expert_late as f64);
    assert_eq!(
        outcome_of("miss"),
        (report.expert_misses - report.expert_late) as f64
    );
    assert_eq!(
        scrape.value(catalog::EXPERT_ACQUIRES, &[]),
        (report.expert_hits + report.expert_misses) as f64
    );
}
