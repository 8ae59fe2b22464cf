//! The video pipeline's VAE stage: the latent decoded chunk by chunk, in tiles of
//! space when the request names them or when the whole frame's working set does not
//! fit beside the weights' ring (as the image pipeline's VAE stage tiles), and the
//! frames rounded.

use std::time::Instant;

use super::super::vae::{ring_bytes, vram_budget_bytes, TiledDecode};
use super::{outputs, Picture, PipelineError, PipelineRun, Stage, VideoRequest, WanParts};
use crate::families::wan_vae::{working_set_bytes, VideoLatentInput, WanTile, WanTiling};
use crate::families::{Extras, Model, WorkloadKind};
use crate::run::Prepared;

/// The VAE's stage: the latent decoded, the frames rounded.
pub(super) fn decode(
    parts: &WanParts,
    request: &VideoRequest,
    run: &PipelineRun<'_>,
    latent: &[f32],
) -> Result<(Vec<Picture>, Stage), PipelineError> {
    let [frames, height, width] = request.latent_size(parts.vae_scale);
    let input = |tile: Option<WanTile>| {
        Extras::default().with(VideoLatentInput {
            latents: vec![latent.to_vec()],
            frames,
            height,
            width,
            tile,
        })
    };
    let started = Instant::now();
    let kind = ("vae", WorkloadKind::Auto);
    let opened = run.open(kind, &parts.vae, &input(request.vae_tile), 1)?;
    // Opened again only when the budget asks for tiles the request did not name.
    let prepared = match request.vae_tile {
        Some(_) => opened,
        None => match choose_vae_tile(&opened, vram_budget_bytes(&opened, run))? {
            Some(tile) => run.open(kind, &parts.vae, &input(Some(tile)), 1)?,
            None => opened,
        },
    };
    let Model::WanVae(vae) = &prepared.workload.model else {
        return Err(PipelineError::Layout {
            path: parts.vae.path.clone(),
            problem: "is not an AutoencoderKLWan".into(),
        });
    };
    let steps = vae.steps_per_video() as u64;
    let checked = (steps, run.verify_for(steps));
    let stage = run.run_opened(("vae", started), &parts.vae, &prepared, checked)?;
    let chunks: Vec<&[f32]> = outputs(&stage).into_iter().map(Vec::as_slice).collect();
    let video = vae.assemble(&chunks);
    Ok((pictures(&video, request)?, stage))
}

/// Each frame of a decoded video `[3, frames, H, W]`, rounded.
fn pictures(video: &[f32], request: &VideoRequest) -> Result<Vec<Picture>, PipelineError> {
    let plane = request.height * request.width;
    let count = video.len() / (3 * plane).max(1);
    if count != request.frames || video.len() != 3 * plane * count {
        return Err(PipelineError::StageOutput {
            stage: "vae",
            message: format!(
                "the VAE gave {} values; {} frames of {}×{} RGB are {}",
                video.len(),
                request.frames,
                request.width,
                request.height,
                3 * plane * request.frames
            ),
        });
    }
    // [3, frames, H, W] → each frame's [3, H, W].
    (0..count)
        .map(|frame| {
            let planar: Vec<f32> = (0..3)
                .flat_map(|channel| {
                    let at = (channel * count + frame) * plane;
                    video[at..at + plane].iter().copied()
                })
                .collect();
            Picture::from_decoded(&planar, request.height, request.width)
        })
        .collect()
}

/// The tile a WAN VAE decode opened whole (`prepared`) takes under a VRAM budget of
/// `vram_budget_bytes`: none when the whole frame's working set fits beside the
/// weights' ring, else the largest of diffusers' default tile (32 latent positions,
/// 256 pixels) halved until a tile's fits, at diffusers' stride of 3/4 of a tile.
/// `BudgetTooSmall` when not even the smallest tile fits.
pub fn choose_vae_tile(
    prepared: &Prepared,
    vram_budget_bytes: u64,
) -> Result<Option<WanTile>, PipelineError> {
    let Model::WanVae(vae) = &prepared.workload.model else {
        return Ok(None);
    };
    let ring = ring_bytes(prepared);
    let room = vram_budget_bytes.saturating_sub(ring);
    if vae.whole_frame_bytes() <= room {
        return Ok(None);
    }
    let [_, height, width] = vae.latent_size();
    let (scale, pixels) = (vae.config.spatial_scale(), vae.config.pixel_scale());
    // A tile as large as the latent is the whole frame, which does not fit.
    let tile_bytes = |side: usize| {
        let tiling = WanTiling::new(height, width, Some(WanTile::square(side)), scale);
        let (rows, cols) = tiling.grid.largest();
        (tiling.tile.is_some()).then(|| working_set_bytes(&vae.config, rows, cols))
    };
    let whole = TiledDecode {
        pixels: [width * pixels, height * pixels],
        whole_bytes: vae.whole_frame_bytes(),
        room_bytes: room,
    };
    let sides = [WanTile::DIFFUSERS.height, MIN_TILE];
    if let Some(side) = whole.largest_tile(sides, tile_bytes) {
        return Ok(Some(WanTile::square(side)));
    }
    Err(PipelineError::BudgetTooSmall {
        stage: "vae",
        least_bytes: working_set_bytes(&vae.config, MIN_TILE, MIN_TILE) + ring,
    })
}

/// The smallest tile an automatic tiling takes (latent positions a side): below
/// it a tile is mostly seam.
const MIN_TILE: usize = 4;
