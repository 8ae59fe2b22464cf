//! Wan 2.2 TI2V-5B's parts against diffusers: `tests/fixtures/wan_ti2v`
//! (`scripts/make-wan-ti2v-fixtures.py`) holds a tiny AutoencoderKLWan of Wan 2.2's
//! structure (residual levels, 2 × 2 patches, 48 latent channels), a tiny
//! 48-channel WanTransformer3DModel and a WanPipeline folder with
//! `expand_timesteps: true`, with what diffusers computes from them. stagehand's VAE
//! decodes (and encodes) the same videos, streamed equal to resident bit for bit.

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::families::wan_vae::{VideoInput, VideoLatentInput, WanTile};
use stagehand::families::Model;
use stagehand::run::{
    execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

/// Largest absolute difference allowed from diffusers' floats (frames in −1 … 1):
/// f32 on both sides in other summation orders.
const TOLERANCE: f32 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_ti2v")
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

fn prepare(folder: &str, kind: WorkloadKind, extras: &Extras) -> Prepared {
    let settings = Settings::default();
    prepare_with(&fixtures().join(folder), kind, 1, &settings, false, extras).expect("opens")
}

fn run(prepared: &Prepared, (vram, steps): (u64, u64)) -> Outcome {
    let layout = prepared.facts().layout();
    let budgets = Budgets {
        vram_budget_bytes: vram + prepared.activation_bytes(1),
        pin_ceiling_bytes: (layout.total_bytes() + 4 * layout.largest_block_bytes()).max(64 << 20),
    };
    let settings = Settings::default();
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, steps)
    };
    execute(prepared, plan).expect("runs")
}

/// `steps` of `prepared` streamed under half the model and resident, each step
/// checked against the resident pass; their outputs equal bit for bit. The
/// streamed run's outputs in step order.
fn streamed_equal_to_resident(prepared: &Prepared, steps: u64, what: &str) -> Vec<Vec<f32>> {
    let layout = prepared.facts().layout();
    let (total, largest) = (layout.total_bytes(), layout.largest_block_bytes());
    let streamed = run(
        prepared,
        ((total / 2).max(2 * largest + largest / 2), steps),
    );
    let resident = run(prepared, (2 * total, steps));
    assert!(
        streamed.report.plan.vram.resident.iter().any(|r| !r),
        "{what}: nothing streamed"
    );
    for outcome in [&streamed, &resident] {
        assert_eq!(outcome.report.verified_steps, steps, "{what}: unverified");
    }
    assert_eq!(
        streamed.report.outputs, resident.report.outputs,
        "{what}: streamed differs from resident"
    );
    streamed.report.outputs.values().cloned().collect()
}

fn largest_difference(ours: &[f32], theirs: &[f32]) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "lengths");
    (ours.iter().zip(theirs)).fold(0f32, |m, (a, b)| m.max((a - b).abs()))
}

/// Decodes the fixture's latent (in `tile`s, when given), streamed equal to
/// resident, and compares the video with diffusers' `name`.
fn decodes(tile: Option<WanTile>, name: &str) {
    let (shape, latent) = expected("vae_latent");
    let input = VideoLatentInput {
        latents: vec![latent],
        frames: shape[2],
        height: shape[3],
        width: shape[4],
        tile,
    };
    let prepared = prepare("vae", WorkloadKind::Auto, &Extras::default().with(input));
    let Model::WanVae(vae) = &prepared.workload.model else {
        panic!("not the WAN VAE decoder");
    };
    let steps = vae.steps_per_video() as u64;
    let chunks = streamed_equal_to_resident(&prepared, steps, name);
    let chunks: Vec<&[f32]> = chunks.iter().map(Vec::as_slice).collect();
    let (_, video) = expected(name);
    let difference = largest_difference(&vae.assemble(&chunks), &video);
    eprintln!("wan 2.2 vae: {name} {difference:e} max abs from diffusers' ({steps} steps)");
    assert!(difference < TOLERANCE, "{name} differs by {difference}");
}

#[test]
fn wan22_vae_decodes_diffusers_video_streamed_and_resident() {
    // Proves Wan 2.2's decoder (48 channels un-normalised, residual up blocks with
    // their DupUp3D shortcuts, the first chunk's shortcut cut to its last frame, no
    // halved widths, 12 channels unpatchified into 2 × 2 pixels, the clamp) gives
    // AutoencoderKLWan's video, streamed under half the model as resident.
    decodes(None, "vae_video");
}

#[test]
fn wan22_vae_decodes_in_tiles_as_tiled_decode() {
    // Proves the tiles of Wan 2.2's VAE: cut, blended and cropped in the patches'
    // space (8 of them a latent position) and unpatchified after, as `tiled_decode`
    // does with patch_size 2 (tiles of 2 latent positions every 1: 2 × 3 tiles).
    let tile = WanTile {
        height: 2,
        width: 2,
        stride_height: 1,
        stride_width: 1,
    };
    decodes(Some(tile), "vae_video_tiled");
}

#[test]
fn wan22_vae_encodes_diffusers_latent_streamed_and_resident() {
    // Proves Wan 2.2's encoder (frames patchified into 12 channels, residual down
    // blocks with their AvgDown3D shortcuts over each chunk, zero-padded to whole
    // groups of frames, 48 channels normalised) gives `(vae.encode(video).mode() −
    // latents_mean) · (1 / latents_std)`, streamed under half the model as resident.
    let (shape, video) = expected("encoder_video");
    let input = VideoInput {
        videos: vec![video],
        frames: shape[2],
        height: shape[3],
        width: shape[4],
    };
    let extras = Extras::default().with(input);
    let prepared = prepare("vae", WorkloadKind::ImageEncoder, &extras);
    let (latent_shape, latent) = expected("encoder_latent");
    let frames = latent_shape[2] as u64;
    let steps = streamed_equal_to_resident(&prepared, frames, "encoder");
    // Each step one latent frame [48, pixels]: as [48, frames, pixels].
    let plane = latent_shape[3] * latent_shape[4];
    let ours: Vec<f32> = (0..latent_shape[1])
        .flat_map(|channel| {
            steps
                .iter()
                .flat_map(move |step| step[channel * plane..][..plane].to_vec())
        })
        .collect();
    let difference = largest_difference(&ours, &latent);
    eprintln!("wan 2.2 vae: encoded latent {difference:e} max abs from diffusers'");
    assert!(difference < TOLERANCE, "latent differs by {difference}");
}

#[path = "wan_ti2v/pipeline.rs"]
mod pipeline;
