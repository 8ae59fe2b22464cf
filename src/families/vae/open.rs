//! How a VAE folder is recognised and opened.

use super::{LatentInput, VaeConfig, VaeDecoder};
use crate::families::flux::gaussian;
use crate::families::inputs::WorkloadKind;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::FamilyError;

/// diffusers' class of the VAE (`_class_name` of `vae/config.json`).
pub const CLASS_NAME: &str = "AutoencoderKL";

/// What a run without a pipeline's latent decodes: seeded noise of this many latent
/// positions a side (a 64² image for an 8× VAE), 128² (1024²) when only headers are
/// read, to describe a real decode.
const DEFAULT_LATENT_SIDE: usize = 8;
const DESCRIBED_LATENT_SIDE: usize = 128;

impl Open for VaeDecoder {
    const NAME: &'static str = "vae";
    const KIND: WorkloadKind = WorkloadKind::Autoencoder;
    const STEP: StepUnit = StepUnit::Batch;

    /// A described step decodes one 1024² image (the latent `open` makes when only
    /// headers are read), whole.
    fn described_step(
        _: &Found<'_>,
        _: u64,
        _: &mut crate::families::Extras,
    ) -> Result<Option<usize>, FamilyError> {
        Ok(Some(1))
    }

    /// diffusers' VAE folder, or a checkpoint without a config in diffusers' names
    /// (ComfyUI's `ae.safetensors` is read renamed: [`crate::model::PartNames`]).
    fn recognises(found: &Found<'_>) -> bool {
        match found.folder {
            Some(_) => found.class_name() == Some(CLASS_NAME),
            None => ["decoder.up_blocks.0.", "encoder.down_blocks.0."]
                .iter()
                .any(|prefix| {
                    found
                        .index
                        .tensors
                        .iter()
                        .any(|tensor| tensor.name.starts_with(prefix))
                }),
        }
    }

    /// The decoder over the run's latents, or one seeded latent.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = VaeConfig::of(request)?;
        let input = match request.extras.input::<LatentInput>() {
            Some(input) => input.clone(),
            None => {
                let side = match request.extras.headers_only {
                    true => DESCRIBED_LATENT_SIDE,
                    false => DEFAULT_LATENT_SIDE,
                };
                LatentInput {
                    latents: vec![gaussian(config.latent_channels * side * side, 0)],
                    height: side,
                    width: side,
                    tile: None,
                }
            }
        };
        VaeDecoder::new(request.index, config, input)
    }
}

impl VaeConfig {
    /// The config of the VAE `request` opens: its folder's, or read from its shapes.
    pub fn of(request: &Request<'_>) -> Result<Self, FamilyError> {
        match request.folder {
            Some(folder) => Self::from_json(&folder.config_path(), &folder.config),
            None => Self::infer(request.index),
        }
    }
}
