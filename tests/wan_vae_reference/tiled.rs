//! The WAN VAE decoded in tiles of space against diffusers' `tiled_decode`
//! (`tests/fixtures/wan_vae/tiled.safetensors`, `scripts/make-wan-vae-tiling-fixtures.py`):
//! a latent [1, 16, 2, 6, 7] decoded in two tilings, and the tile a budget too small
//! for the whole frame chooses.

use super::*;
use stagehand::families::wan_vae::{working_set_bytes, WanTile, WanTiling};
use stagehand::families::Model;
use stagehand::pipeline::{choose_vae_tile, PipelineError};

/// The fixture's tiled decodes: each video's name and the tile diffusers cut it in
/// (its pixels over 8).
const TILED: [(&str, WanTile); 2] = [
    ("video", WanTile::square(4)),
    (
        "video_wide",
        WanTile {
            height: 4,
            width: 5,
            stride_height: 2,
            stride_width: 4,
        },
    ),
];

/// The tensor `name` of tiled.safetensors, with its shape.
fn tiled(name: &str) -> (Vec<usize>, Vec<f32>) {
    let (_, shape, values) = read_tensors(&fixtures().join("tiled.safetensors"))
        .expect("reads tiled.safetensors")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("tiled.safetensors has no {name}"));
    (shape, values)
}

fn tiled_input(tile: Option<WanTile>) -> VideoLatentInput {
    let (shape, latent) = tiled("latent");
    VideoLatentInput {
        latents: vec![latent],
        frames: shape[2],
        height: shape[3],
        width: shape[4],
        tile,
    }
}

/// The video of a run's outputs, assembled as the pipeline assembles it, and its
/// largest difference from diffusers' `name`.
fn difference(prepared: &Prepared, outcome: &Outcome, name: &str) -> f32 {
    let Model::WanVae(vae) = &prepared.workload.model else {
        panic!("not the WAN VAE decoder");
    };
    let chunks: Vec<&[f32]> = outcome.report.outputs.values().map(Vec::as_slice).collect();
    let video = vae.assemble(&chunks);
    let (shape, expected) = tiled(name);
    assert_eq!(video.len(), expected.len(), "{name} {shape:?}");
    video
        .iter()
        .zip(&expected)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
}

/// Steps of a decode of the fixture's latent in tiles of `tile`.
fn steps(tile: WanTile) -> u64 {
    let (shape, _) = tiled("latent");
    let tiles = WanTiling::new(shape[3], shape[4], Some(tile), 8).count();
    (tiles * shape[2]) as u64
}

#[test]
fn wan_vae_tiled_decode_matches_diffusers_streamed_and_resident() {
    // Proves the tiled decode (each tile over every frame with a feature cache of its
    // own, the seams blended from above then from the left, the crop, the clamp after
    // the blend) gives AutoencoderKLWan.tiled_decode's video for a square tile at
    // diffusers' stride and for a tile and stride of their own each way, and that a
    // run streamed under half the model gives the resident run's bits.
    for (name, tile) in TILED {
        let prepared = prepare(tiled_input(Some(tile))).expect("opens");
        let steps = steps(tile);
        assert!(steps >= 2 * 2 * 2, "{name}: fewer than 2 × 2 tiles");
        let streamed = streamed_equal_to_resident(&prepared, steps, name);
        let absolute = difference(&prepared, &streamed, name);
        eprintln!("wan vae tiled ({name}): {absolute:e} max abs from diffusers' tiled_decode");
        assert!(absolute < TOLERANCE, "{name}: differs by {absolute}");
    }
}

#[test]
fn a_budget_too_small_for_the_whole_frame_decodes_in_tiles_within_it() {
    // Proves the automatic tiling: under a budget below the whole frame's working set
    // beside the weights' ring, but above a tile's, the plan chooses tiles (the
    // largest of diffusers' 32 halved that fits: 4 here), the whole decode is refused
    // under it, the tiled one runs with every VRAM peak inside it and gives diffusers'
    // tiled video; below the smallest tile the choice is refused with what it needs.
    let whole = prepare(tiled_input(None)).expect("opens");
    let Model::WanVae(vae) = &whole.workload.model else {
        panic!("not the WAN VAE decoder");
    };
    let layout = whole.facts().layout();
    let (total, largest) = (layout.total_bytes(), layout.largest_block_bytes());
    let weights = (total / 2).max(2 * largest + largest / 2);
    let vram = weights + working_set_bytes(&vae.config, 4, 4);
    assert!(
        vram < 2 * largest + whole.activation_bytes(1),
        "the whole frame fits"
    );
    let tile = choose_vae_tile(&whole, vram).expect("a tile fits");
    assert_eq!(tile, Some(WanTile::square(4)), "the plan chose no tiles");
    let usage = Arc::new(LastUsage::default());
    let refused = run(&whole, (vram, 2), usage.clone()).err();
    assert!(
        matches!(refused, Some(RunError::BudgetTooSmall { .. })),
        "{refused:?}"
    );
    let prepared = prepare(tiled_input(tile)).expect("opens");
    let steps = steps(WanTile::square(4));
    let outcome = run(&prepared, (vram, steps), usage.clone()).expect("decodes in tiles");
    assert_eq!(outcome.report.verified_steps, steps);
    let peak = usage.peak_vram.load(Ordering::SeqCst);
    eprintln!(
        "tiled under {vram} B of VRAM (whole: {} B of activations): peak {peak} B",
        whole.activation_bytes(1)
    );
    assert!(
        peak > 0 && peak <= vram,
        "peak {peak} over the budget {vram}"
    );
    let absolute = difference(&prepared, &outcome, "video");
    assert!(absolute < TOLERANCE, "differs by {absolute}");
    let least = choose_vae_tile(&whole, 2 * largest).err();
    assert!(
        matches!(least, Some(PipelineError::BudgetTooSmall { least_bytes, .. }) if least_bytes > 2 * largest),
        "{least:?}"
    );
}
