//! The pipeline's VAE stages: the encoder of image-to-image, and the decoder, opened
//! in tiles when the budget leaves too little room for a whole decode.

use std::time::Instant;

use super::{
    outputs, FluxParts, ImageRequest, InitImage, Picture, PipelineError, PipelineRun, Stage,
};
use crate::families::vae::{working_set_bytes, ImageInput, LatentInput};
use crate::families::{Extras, Model, WorkloadKind};
use crate::run::{budgets_for, BudgetAsk, Prepared};

/// The VAE encoder's stage: the image image-to-image starts from, to its latent.
pub(super) fn encode(
    parts: &FluxParts,
    request: &ImageRequest,
    run: &PipelineRun<'_>,
    init: &InitImage,
    stages: &mut Vec<Stage>,
) -> Result<Vec<f32>, PipelineError> {
    let extras = Extras::default().with(ImageInput {
        images: vec![init.pixels.clone()],
        height: request.height,
        width: request.width,
    });
    let kind = ("vae-encoder", WorkloadKind::ImageEncoder);
    let (_, stage) = run.stage(kind, &parts.vae, &extras, 1, |_| 1)?;
    let latent = outputs(&stage).first().map(|latent| latent.to_vec());
    stages.push(stage);
    latent.ok_or_else(|| PipelineError::StageOutput {
        stage: "vae-encoder",
        message: "the VAE encoder computed no latent".into(),
    })
}

/// The VAE's stage: every latent decoded (in tiles when the budget leaves too little
/// room for a whole decode's activations, or when the request says so) and rounded.
pub(super) fn decode(
    parts: &FluxParts,
    request: &ImageRequest,
    run: &PipelineRun<'_>,
    latents: &[Vec<f32>],
) -> Result<(Vec<Picture>, Stage), PipelineError> {
    let input = |tile: Option<usize>| {
        Extras::default().with(LatentInput {
            latents: latents.to_vec(),
            height: request.height / 8,
            width: request.width / 8,
            tile,
        })
    };
    let started = Instant::now();
    let kind = ("vae", WorkloadKind::Autoencoder);
    let opened = run.open(kind, &parts.vae, &input(request.vae_tile), 1)?;
    // Opened again only when the budget asks for tiles the request did not name.
    let prepared = match request.vae_tile {
        Some(_) => opened,
        None => match automatic_tile(&opened, run)? {
            Some(tile) => run.open(kind, &parts.vae, &input(Some(tile)), 1)?,
            None => opened,
        },
    };
    let Model::Vae(vae) = &prepared.workload.model else {
        return Err(PipelineError::Layout {
            path: parts.vae.path.clone(),
            problem: "is not an AutoencoderKL".into(),
        });
    };
    let steps = (vae.images() * vae.steps_per_image()) as u64;
    let checked = (steps, run.verify_for(steps));
    let stage = run.run_opened(("vae", started), &parts.vae, &prepared, checked)?;
    let outputs: Vec<&[f32]> = outputs(&stage).into_iter().map(Vec::as_slice).collect();
    let pictures = outputs
        .chunks(vae.steps_per_image().max(1))
        .map(|tiles| Picture::from_decoded(&vae.assemble(tiles), request.height, request.width))
        .collect::<Result<_, _>>()?;
    Ok((pictures, stage))
}

/// The tile a decode takes under the settings' budget: none when a whole decode's
/// working set fits beside a ring of its largest block, else the largest of the
/// VAE's own tile (diffusers' `sample_size / 8`) halved until its working set fits.
fn automatic_tile(
    prepared: &Prepared,
    run: &PipelineRun<'_>,
) -> Result<Option<usize>, PipelineError> {
    let Model::Vae(vae) = &prepared.workload.model else {
        return Ok(None);
    };
    let ring = ring_bytes(prepared);
    let room = vram_budget_bytes(prepared, run).saturating_sub(ring);
    if vae.working_set_bytes() <= room {
        return Ok(None);
    }
    let (height, width) = (vae.tiling.height, vae.tiling.width);
    let largest = (vae.config.sample_size / vae.config.scale_factor()).min(height.max(width));
    let whole = TiledDecode {
        pixels: [width, height].map(|side| side * vae.config.scale_factor()),
        whole_bytes: vae.working_set_bytes(),
        room_bytes: room,
    };
    let fits = |tile: usize| Some(working_set_bytes(&vae.config, tile, tile));
    if let Some(tile) = whole.largest_tile([largest, MIN_TILE], fits) {
        return Ok(Some(tile));
    }
    let least = working_set_bytes(&vae.config, MIN_TILE, MIN_TILE) + ring;
    Err(PipelineError::BudgetTooSmall {
        stage: "vae",
        least_bytes: least,
    })
}

/// A decode too large for its room, about to be tiled: the whole frame's pixels
/// (`[width, height]`), its working set and the room beside the weights' ring.
pub(super) struct TiledDecode {
    pub(super) pixels: [usize; 2],
    pub(super) whole_bytes: u64,
    pub(super) room_bytes: u64,
}

impl TiledDecode {
    /// The largest tile side from `largest` halved down to `least` (latent positions)
    /// whose working set (`tile_bytes`; `None` when that side is no tiling at all)
    /// fits the room, said in one line; `None` when not even `least` fits.
    pub(super) fn largest_tile(
        &self,
        [largest, least]: [usize; 2],
        tile_bytes: impl Fn(usize) -> Option<u64>,
    ) -> Option<usize> {
        let mut side = largest;
        while side >= least {
            if tile_bytes(side).is_some_and(|bytes| bytes <= self.room_bytes) {
                tracing::info!(
                    "vae: a whole {}×{} decode needs {} of activations beside the weights' ring, more than the budget leaves ({}); decoding in tiles of {side}² latent positions",
                    self.pixels[0],
                    self.pixels[1],
                    stagehand_actors::Bytes(self.whole_bytes),
                    stagehand_actors::Bytes(self.room_bytes)
                );
                return Some(side);
            }
            side /= 2;
        }
        None
    }
}

/// The VRAM budget a decode runs under: the settings' for it, or all of a shared
/// budget (in a shared budget the VAE may have all of it, the others giving way).
pub(super) fn vram_budget_bytes(prepared: &Prepared, run: &PipelineRun<'_>) -> u64 {
    match &run.shared {
        Some((pool, _)) => pool.total().vram_bytes,
        None => budgets_for(prepared, run.settings, BudgetAsk::steps(1)).vram_budget_bytes,
    }
}

/// The weights' ring a streamed decode keeps beside its activations: two of its
/// largest block.
pub(super) fn ring_bytes(prepared: &Prepared) -> u64 {
    2 * prepared.facts().layout().largest_block_bytes()
}

/// The smallest tile an automatic tiling takes (latent positions a side).
const MIN_TILE: usize = 8;
