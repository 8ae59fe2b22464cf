//! Flux transformers end to end on the CPU backend: generated checkpoints in the three
//! layouts (original, ComfyUI, diffusers), BF16 and FP8, sampled streamed under a VRAM
//! budget well below the model, every step equal to the fully-resident pass bit for
//! bit, and the three layouts of the same weights giving the same latents.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use stagehand::compute::DType;
use stagehand::families::flux::{
    write_conditioning, FluxDemo, FluxPreset, Layout, SampleInput, Start,
};
use stagehand::run::{
    execute, no_observer, prepare_with, Budgets, Extras, Outcome, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

const LAYOUTS: [Layout; 3] = [Layout::Original, Layout::ComfyUi, Layout::Diffusers];

/// Writes `preset` in `layout`/`dtype` and a conditioning file of 8 tokens.
fn generated(dir: &Path, preset: FluxPreset, layout: Layout, dtype: DType) -> (PathBuf, PathBuf) {
    let demo = FluxDemo {
        preset,
        layout,
        dtype,
        seed: 42,
    };
    let model = demo
        .write(&dir.join(layout.describe()))
        .expect("writes the model");
    let cond = dir.join("cond.safetensors");
    write_conditioning(&cond, &preset.shape(), 8, 3).expect("writes the conditioning");
    (model, cond)
}

fn input(cond: &Path, steps: usize) -> SampleInput {
    SampleInput {
        cond: cond.to_path_buf(),
        width: 64,
        height: 48,
        steps,
        guidance: None,
        start: Start::Seed(5),
    }
}

/// Samples `steps` steps streamed under `share` of the streamed bytes, checked step
/// by step against the resident pass.
fn sample(model: &Path, input: SampleInput, share: f64) -> Outcome {
    let settings = Settings::default();
    let steps = input.steps as u64;
    let extras = Extras {
        diffusion: Some(input),
        ..Extras::default()
    };
    let prepared =
        prepare_with(model, WorkloadKind::Auto, 1, &settings, false, &extras).expect("opens");
    let layout = prepared.facts().layout();
    let largest = layout
        .blocks
        .iter()
        .map(|block| block.bytes)
        .max()
        .unwrap_or(0);
    let budget = ((layout.total_bytes() as f64 * share) as u64).max(3 * largest + (1 << 20));
    execute(
        &prepared,
        RunPlan {
            settings: &settings,
            budgets: Budgets {
                vram_budget_bytes: budget,
                pin_ceiling_bytes: 64 << 20,
            },
            prefetch_depth: 2,
            policy: stagehand::actors::ResidencyPolicy::Planned,
            steps,
            stop: Arc::new(AtomicBool::new(false)),
            observer: no_observer(),
            on_step: Box::new(|_, _| {}),
            fail_after_reads: None,
            keep_outputs: true,
            on_token: None,
        },
    )
    .expect("samples")
}

fn last_latent(outcome: &Outcome) -> Vec<f32> {
    outcome
        .report
        .outputs
        .values()
        .last()
        .cloned()
        .expect("a latent")
}

#[test]
fn the_three_layouts_stream_bit_exact_and_give_the_same_latents() {
    // Proves each layout's streamed steps equal its resident pass bit for bit under a
    // budget below the model, and the three layouts of the same weights compute the
    // same latents.
    let dir = tempfile::tempdir().unwrap();
    let mut latents = Vec::new();
    for layout in LAYOUTS {
        let (model, cond) = generated(dir.path(), FluxPreset::Tiny, layout, DType::Bf16);
        let outcome = sample(&model, input(&cond, 3), 0.5);
        assert_eq!(outcome.report.verified_steps, 3, "{layout:?}");
        assert!(
            outcome.report.stats.pinned_to_vram.model_bytes > 0,
            "{layout:?}: nothing streamed"
        );
        latents.push((layout, last_latent(&outcome)));
    }
    let (_, first) = &latents[0];
    assert!(first.iter().all(|v| v.is_finite()) && first.iter().any(|v| v.abs() > 0.1));
    for (layout, latent) in &latents[1..] {
        assert_eq!(latent, first, "{layout:?} differs from the original layout");
    }
}
