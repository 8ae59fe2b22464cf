//! The WAN VAE decoder against diffusers: `tests/fixtures/wan_vae` holds a tiny
//! AutoencoderKLWan of Wan 2.1's structure (seeded, bf16 weights), a latent video
//! [1, 16, 3, 4, 4] and the video diffusers decodes from it after WanPipeline's
//! un-normalisation (`scripts/make-wan-vae-fixtures.py`). stagehand's frames agree
//! with diffusers' within the stated tolerance, streamed under a budget below the
//! model and fully resident alike, bit for bit; a decode that cannot run is a clear
//! error and holds nothing.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::usage::LastUsage;
use stagehand::families::flux::read_tensors;
use stagehand::families::wan_vae::{VideoInput, VideoLatentInput};
use stagehand::run::{
    execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunError, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

#[path = "wan_vae_reference/tiled.rs"]
mod tiled;

/// Largest absolute difference allowed from diffusers' frames (values in −1 … 1):
/// f32 on both sides in other summation orders.
const TOLERANCE: f32 = 1e-4;

/// The fixture folder; `STAGEHAND_WAN_VAE_FIXTURE` names another one of the same
/// files (`make-wan-vae-fixtures.py --wan21 DIR` writes Wan 2.1's full-width VAE).
fn fixtures() -> PathBuf {
    match std::env::var_os("STAGEHAND_WAN_VAE_FIXTURE") {
        Some(folder) => PathBuf::from(folder),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_vae"),
    }
}

/// The tensor `name` of expected.safetensors, with its shape.
fn expected(name: &str) -> (Vec<usize>, Vec<f32>) {
    let (_, shape, values) = read_tensors(&fixtures().join("expected.safetensors"))
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("expected.safetensors has no {name}"));
    (shape, values)
}

fn latent_input() -> VideoLatentInput {
    let (shape, latent) = expected("latent");
    VideoLatentInput {
        latents: vec![latent],
        frames: shape[2],
        height: shape[3],
        width: shape[4],
        tile: None,
    }
}

fn prepare(input: VideoLatentInput) -> Result<Prepared, RunError> {
    prepare_with(
        &fixtures().join("vae"),
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &Extras::default().with(input),
    )
}

/// Runs `steps` of `prepared` under `vram` bytes, each step checked against the
/// resident pass, observed by `usage`.
fn run(
    prepared: &Prepared,
    (vram, steps): (u64, u64),
    usage: Arc<LastUsage>,
) -> Result<Outcome, RunError> {
    let settings = Settings::default();
    let budgets = Budgets {
        vram_budget_bytes: vram,
        pin_ceiling_bytes: pinned_bytes(prepared),
    };
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        observer: usage,
        ..RunPlan::new(&settings, budgets, steps)
    };
    execute(prepared, plan)
}

/// `steps` of `prepared` twice, streamed under half the model (at least two and a
/// half blocks) and fully resident, every step of both checked against the resident
/// pass and their outputs equal bit for bit (`what` names the case); the streamed run.
fn streamed_equal_to_resident(prepared: &Prepared, steps: u64, what: &str) -> Outcome {
    let layout = prepared.facts().layout();
    let (total, largest) = (layout.total_bytes(), layout.largest_block_bytes());
    let streamed_weights = (total / 2).max(2 * largest + largest / 2);
    let usage = Arc::new(LastUsage::default());
    let streamed = run(
        prepared,
        (budget(prepared, streamed_weights), steps),
        usage.clone(),
    )
    .expect("streams");
    let resident = run(prepared, (budget(prepared, 2 * total), steps), usage).expect("runs");
    assert!(
        streamed.report.plan.vram.resident.iter().any(|r| !r),
        "{what}: nothing streamed"
    );
    assert!(
        resident.report.plan.vram.resident.iter().all(|r| *r),
        "{what}: the resident run streams"
    );
    for outcome in [&streamed, &resident] {
        assert_eq!(outcome.report.verified_steps, steps, "{what}: unverified");
        assert_eq!(outcome.report.tolerance_steps, 0, "{what}: tolerance used");
    }
    assert_eq!(
        streamed.report.outputs, resident.report.outputs,
        "{what}: streamed differs from resident"
    );
    streamed
}

/// A pin ceiling that keeps the model in pinned RAM, and its staging ring.
fn pinned_bytes(prepared: &Prepared) -> u64 {
    let layout = prepared.facts().layout();
    (layout.total_bytes() + 4 * layout.largest_block_bytes()).max(64 << 20)
}

/// VRAM for `weights_bytes` of weights beside the decode's working set.
fn budget(prepared: &Prepared, weights_bytes: u64) -> u64 {
    weights_bytes + prepared.activation_bytes(1)
}

#[test]
fn wan_vae_frames_match_diffusers_streamed_and_resident() {
    // Proves the decoder (un-normalisation, causal 3-D convolutions continued through
    // the feature cache chunk by chunk, RMS norms, the per-frame attention, the
    // temporal and spatial upsamplings, the clamp) gives AutoencoderKLWan's video,
    // and that a run streamed under half the model gives the resident run's bits.
    let input = latent_input();
    let steps = input.frames as u64;
    let prepared = prepare(input).expect("opens");
    assert_eq!(prepared.family.name, "wan-vae");
    let streamed = streamed_equal_to_resident(&prepared, steps, "decoder");
    let chunks: Vec<&[f32]> = streamed
        .report
        .outputs
        .values()
        .map(Vec::as_slice)
        .collect();
    let (shape, video) = expected("video");
    let frames: Vec<f32> = assemble(&chunks, shape[1]);
    assert_eq!(frames.len(), video.len(), "{shape:?}");
    let absolute = frames
        .iter()
        .zip(&video)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("wan vae: frames {absolute:e} max abs from diffusers'");
    assert!(absolute < TOLERANCE, "frames differ by {absolute}");
}

/// `[channels, frames, pixels]` of chunks each `[channels, chunk frames, pixels]`.
fn assemble(chunks: &[&[f32]], channels: usize) -> Vec<f32> {
    let mut planes = vec![Vec::new(); channels];
    for chunk in chunks {
        let plane = chunk.len() / channels;
        for (channel, values) in chunk.chunks_exact(plane).enumerate() {
            planes[channel].extend_from_slice(values);
        }
    }
    planes.concat()
}

#[test]
fn a_wrong_latent_or_a_budget_below_the_working_set_is_refused_clearly() {
    // Proves a latent of the wrong shape is refused by name when it opens, and a VRAM
    // budget below the decode's working set (its feature cache included) before the
    // run starts, holding nothing. (A chunk failing mid-decode gives back its blocks
    // and its feature cache: the family's unit test over a recording compute.)
    let mut wrong = latent_input();
    wrong.height += 1;
    let named = format!(
        "is not [16, {}, {}, {}]",
        wrong.frames, wrong.height, wrong.width
    );
    let refusal = prepare(wrong).err().expect("refused").to_string();
    assert!(refusal.contains(&named), "{refusal}");

    let input = latent_input();
    let steps = input.frames as u64;
    let prepared = prepare(input).expect("opens");
    let layout = prepared.facts().layout();
    let largest = layout.largest_block_bytes();
    let usage = Arc::new(LastUsage::default());
    let too_small = 2 * largest + prepared.activation_bytes(1) / 2;
    let error = run(&prepared, (too_small, steps), usage.clone())
        .err()
        .expect("a budget below the working set fails");
    eprintln!("too small: {error}");
    assert!(
        matches!(error, RunError::BudgetTooSmall { .. }),
        "{error:?}"
    );
    assert_eq!(usage.vram.load(Ordering::SeqCst), 0, "VRAM left held");
    assert_eq!(
        usage.pinned.load(Ordering::SeqCst),
        0,
        "pinned RAM left held"
    );
}

#[test]
fn a_wan_vae_folder_is_described_as_a_real_decode_from_its_headers() {
    // Proves what `simulate --model` asks of a WAN VAE folder: opened headers only
    // as the WAN VAE (not the Flux one, the other autoencoder), a step is one latent
    // frame of a 480 × 832 video (60 × 104 latent positions), and its working set,
    // feature cache included, is reserved as activations.
    let extras = Extras {
        headers_only: true,
        ..Extras::default()
    };
    let prepared = prepare_with(
        &fixtures().join("vae"),
        WorkloadKind::Autoencoder,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .expect("opens");
    let facts = prepared.facts();
    assert_eq!(facts.describe(), "wan vae decoder");
    assert_eq!(facts.tokens_per_step(), 60 * 104);
    let activations = facts.activations().expect("activations");
    assert!(activations.reserved_bytes > 0);
    assert_eq!(activations.reserved_bytes, prepared.activation_bytes(1));
}

#[test]
fn wan_vae_encoder_matches_diffusers_streamed_and_resident() {
    // Proves the encoder (the first frame alone then 4 frames a chunk, the causal
    // convolutions continued through the feature cache, the stride-2 spatial and
    // temporal downsamplings, quant_conv's mean, the pipeline's normalisation) gives
    // the latent WanImageToVideoPipeline conditions on, streamed = resident.
    let (shape, video) = expected("encoder_video");
    let input = VideoInput {
        videos: vec![video],
        frames: shape[2],
        height: shape[3],
        width: shape[4],
    };
    let prepared = prepare_with(
        &fixtures().join("vae"),
        WorkloadKind::ImageEncoder,
        1,
        &Settings::default(),
        false,
        &Extras::default().with(input),
    )
    .expect("opens");
    assert_eq!(prepared.family.name, "wan-vae-encoder");
    let steps = 1 + (shape[2] as u64 - 1) / 4;
    let streamed = streamed_equal_to_resident(&prepared, steps, "encoder");
    // Each step is one latent frame [16, h, w]; the expected latent is [16, f, h, w].
    let chunks: Vec<&[f32]> = streamed
        .report
        .outputs
        .values()
        .map(Vec::as_slice)
        .collect();
    let latent = assemble(&chunks, 16);
    let (_, expected_latent) = expected("encoder_latent");
    let absolute = latent
        .iter()
        .zip(&expected_latent)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let scale = expected_latent.iter().fold(0f32, |m, v| m.max(v.abs()));
    eprintln!("wan vae encoder: latent {absolute:e} max abs from diffusers' (largest {scale})");
    assert_eq!(latent.len(), expected_latent.len());
    assert!(
        absolute < TOLERANCE * scale.max(1.0),
        "latent differs by {absolute}"
    );
}
