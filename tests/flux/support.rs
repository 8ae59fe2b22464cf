//! What the Flux tests share: generated checkpoints and conditioning files, and a
//! sampling run streamed under a budget and checked against the resident pass.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use stagehand::compute::DType;
use stagehand::families::flux::{
    write_conditioning, FluxDemo, FluxPreset, Layout, SampleInput, Start,
};
use stagehand::lora::LoraSpec;
use stagehand::run::{
    execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

pub const LAYOUTS: [Layout; 3] = [Layout::Original, Layout::ComfyUi, Layout::Diffusers];

/// Writes `preset` in `layout`/`dtype` and a conditioning file of 8 tokens.
pub fn generated(
    dir: &Path,
    preset: FluxPreset,
    layout: Layout,
    dtype: DType,
) -> (PathBuf, PathBuf) {
    let demo = FluxDemo {
        preset,
        layout,
        dtype,
        seed: 42,
    };
    let model = demo
        .write(&dir.join(format!("{}-{dtype}", layout.describe())))
        .expect("writes the model");
    let cond = dir.join("cond.safetensors");
    write_conditioning(&cond, &preset.shape(), 8, 3).expect("writes the conditioning");
    (model, cond)
}

/// A 64 × 48 sample of `steps` steps from seeded noise.
pub fn input(cond: &Path, steps: usize) -> SampleInput {
    SampleInput {
        cond: cond.to_path_buf().into(),
        width: 48,
        height: 64,
        steps,
        guidance: None,
        start: Start::Seed(5),
    }
}

pub fn prepare(model: &Path, input: SampleInput, loras: Vec<LoraSpec>) -> Prepared {
    let extras = Extras {
        loras,
        ..Extras::default()
    }
    .with(input);
    prepare_with(
        model,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .expect("opens")
}

/// Runs `prepared`'s `steps` streamed under `share` of its streamed bytes (at least
/// a ring of two blocks, prefetching one ahead; some block always streams), checked step by step against
/// the resident pass.
pub fn run(prepared: &Prepared, steps: u64, share: f64) -> Outcome {
    let layout = prepared.facts().layout();
    let largest = layout
        .blocks
        .iter()
        .map(|block| block.bytes)
        .max()
        .unwrap_or(0);
    let weights = ((layout.total_bytes() as f64 * share) as u64).max(2 * largest + largest / 2);
    let outcome = run_within(prepared, steps, weights + prepared.activation_bytes(steps));
    let resident = &outcome.report.plan.vram.resident;
    assert!(resident.iter().any(|r| !r), "the budget streams no block");
    outcome
}

/// Runs `prepared`'s `steps` under a VRAM budget of `vram_budget_bytes`, checked step
/// by step against the resident pass.
pub fn run_within(prepared: &Prepared, steps: u64, vram_budget_bytes: u64) -> Outcome {
    let settings = Settings::default();
    execute(prepared, plan(&settings, steps, vram_budget_bytes)).expect("samples")
}

/// The plan of a sampling run: `steps` under `vram_budget_bytes` and a 64 MiB pin
/// ceiling, prefetching one block ahead, keeping the latents.
pub fn plan(settings: &Settings, steps: u64, vram_budget_bytes: u64) -> RunPlan<'_> {
    let budgets = Budgets {
        vram_budget_bytes,
        pin_ceiling_bytes: 64 << 20,
    };
    RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(settings, budgets, steps)
    }
}

/// Samples `input` with no LoRA.
pub fn sample(model: &Path, input: SampleInput, share: f64) -> Outcome {
    let steps = input.steps as u64;
    run(&prepare(model, input, Vec::new()), steps, share)
}

/// The packed latent after the last step.
pub fn last_latent(outcome: &Outcome) -> Vec<f32> {
    outcome
        .report
        .outputs
        .values()
        .last()
        .cloned()
        .expect("a latent")
}
