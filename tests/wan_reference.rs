//! WAN against diffusers: `tests/fixtures/wan` holds tiny WanTransformer3DModels
//! diffusers built (seeded, weights of bf16 values; a text-to-video expert stored BF16
//! and an image-to-video one with 36 input channels and no norm2 stored F32), their
//! inputs and the velocity diffusers computed (`scripts/make-wan-fixtures.py`).
//! stagehand's velocity agrees with diffusers' within the stated tolerance, streamed
//! under a budget below the model and fully resident alike, bit for bit.

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::families::wan::WanInput;
use stagehand::run::WorkloadKind;
use stagehand::run::{execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunPlan};
use stagehand::settings::Settings;

/// Largest difference allowed, relative to the largest magnitude of diffusers'
/// velocity: f32 both sides, different summation orders (the patch embedding a
/// Conv3d there, a product here). Measured: 3.1e-7 to 4.3e-7 relative on the four
/// cases (at most 1.6e-6 absolute); diffusers' own f32 run is as far from its f64
/// run (3.1e-7 to 3.5e-7).
const TOLERANCE: f32 = 1e-4;

/// Steps each run computes (every step the same velocity; the second checks a
/// step that finds its blocks where the first left them).
const STEPS: u64 = 2;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan")
}

/// The tensor `name` of `variant`'s expected.safetensors, with its shape.
fn expected(variant: &str, name: &str) -> (Vec<usize>, Vec<f32>) {
    let path = fixtures().join(variant).join("expected.safetensors");
    let (_, shape, values) = read_tensors(&path)
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("{variant}/expected.safetensors has no {name}"));
    (shape, values)
}

/// The input of case `suffix` ("" or "_short") of `variant`.
fn input(variant: &str, suffix: &str) -> WanInput {
    let (shape, latent) = expected(variant, &format!("latent{suffix}"));
    let (_, context) = expected(variant, &format!("encoder_hidden_states{suffix}"));
    let (_, timestep) = expected(variant, &format!("timestep{suffix}"));
    WanInput {
        latent,
        frames: shape[2],
        height: shape[3],
        width: shape[4],
        timestep: timestep[0],
        context,
    }
}

fn prepare(model: &Path, input: WanInput) -> Prepared {
    let extras = Extras::default().with(input);
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

/// Runs `prepared` for [`STEPS`] under `weights_bytes` of VRAM for weights (plus the
/// activations), checked step by step against the resident pass.
fn run_within(prepared: &Prepared, weights_bytes: u64) -> Outcome {
    let settings = Settings::default();
    let budgets = Budgets {
        vram_budget_bytes: weights_bytes + prepared.activation_bytes(STEPS),
        pin_ceiling_bytes: 64 << 20,
    };
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, STEPS)
    };
    execute(prepared, plan).expect("runs")
}

/// Largest |a − b|, and that over the largest |b|.
fn differences(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let absolute = a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    (absolute, absolute / scale)
}

#[test]
fn wan_velocity_matches_diffusers_streamed_and_resident() {
    // Proves the text-to-video and image-to-video transformers' velocity agrees with
    // diffusers' WanTransformer3DModel within the tolerance, for more video than text
    // tokens and for more text than video tokens, and that a run streamed under half
    // the model gives the fully resident run's bits.
    for variant in ["t2v", "i2v"] {
        let model = fixtures().join(variant).join("transformer");
        for suffix in ["", "_short"] {
            let case = format!("{variant}{suffix}");
            let prepared = prepare(&model, input(variant, suffix));
            let layout = prepared.facts().layout();
            let largest = layout.largest_block_bytes();
            let streamed_budget = (layout.total_bytes() / 2).max(2 * largest + largest / 2);
            let streamed = run_within(&prepared, streamed_budget);
            let resident = run_within(&prepared, 2 * layout.total_bytes());
            assert!(
                streamed.report.plan.vram.resident.iter().any(|r| !r),
                "{case}: the streamed budget keeps every block"
            );
            assert!(
                resident.report.plan.vram.resident.iter().all(|r| *r),
                "{case}: the resident run streams"
            );
            for outcome in [&streamed, &resident] {
                assert_eq!(outcome.report.verified_steps, STEPS, "{case}: unverified");
                assert_eq!(outcome.report.tolerance_steps, 0, "{case}: tolerance used");
            }
            assert_eq!(
                streamed.report.outputs, resident.report.outputs,
                "{case}: streamed differs from resident"
            );
            let velocity = streamed.report.outputs.values().next().expect("an output");
            let (_, expected_velocity) = expected(variant, &format!("velocity{suffix}"));
            let (absolute, relative) = differences(velocity, &expected_velocity);
            eprintln!("{case}: velocity {absolute:e} max abs, {relative:e} relative");
            assert!(
                relative < TOLERANCE,
                "{case}: velocity differs by {relative}"
            );
        }
    }
}
