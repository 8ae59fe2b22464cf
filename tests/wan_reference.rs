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
        guidance: None,
        condition: None,
        first_frame: None,
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

/// The error `prepare_with` gives for `input` on the t2v fixture.
fn refusal(input: WanInput) -> String {
    let model = fixtures().join("t2v/transformer");
    let extras = Extras::default().with(input);
    match prepare_with(
        &model,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &extras,
    ) {
        Ok(_) => panic!("opened"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn inputs_that_do_not_fit_the_model_are_refused_by_name() {
    // Proves a latent of other channels, a size the patch does not divide and text
    // states of another width are refused before anything runs, each naming what is
    // wrong.
    let good = input("t2v", "");
    let fewer_channels = WanInput {
        latent: good.latent[..good.latent.len() / 2].to_vec(),
        ..good.clone()
    };
    assert!(refusal(fewer_channels).contains("in_channels"));
    let odd = WanInput {
        height: 7,
        latent: vec![0.0; 16 * 3 * 7 * 6],
        ..good.clone()
    };
    assert!(refusal(odd).contains("multiple of the patch"));
    let wider_text = WanInput {
        context: vec![0.0; 25],
        ..good
    };
    assert!(refusal(wider_text).contains("text_dim"));
}

#[test]
fn a_wan_folder_is_described_as_a_real_step_from_its_headers() {
    // Proves what `simulate --model` asks of a WAN folder: opened headers only as a
    // diffusion transformer (not as Flux, the other family of that kind), its step is
    // 81 frames of 480 × 832 (21 × 30 × 52 = 32 760 video tokens) with 512 text
    // tokens, and its activations come per kind of block.
    let model = fixtures().join("t2v/transformer");
    let extras = Extras {
        headers_only: true,
        ..Extras::default()
    };
    let prepared = prepare_with(
        &model,
        WorkloadKind::Diffusion,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .expect("opens");
    let facts = prepared.facts();
    assert_eq!(facts.describe(), "wan transformer");
    assert_eq!(facts.tokens_per_step(), 32_760);
    assert_eq!(facts.layout().blocks.len(), 4, "head, 2 blocks, output");
    let activations = facts.activations().expect("activations");
    let kinds: Vec<&str> = activations
        .peaks
        .iter()
        .map(|peak| peak.kind.as_str())
        .collect();
    assert_eq!(kinds, ["embedders", "transformer block", "output layer"]);
    assert_eq!(activations.peaks[1].blocks, 2);
}
