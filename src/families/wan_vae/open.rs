//! How a WAN VAE folder is recognised and opened.

use super::{VideoLatentInput, WanVaeConfig, WanVaeDecoder};
use crate::families::flux::gaussian;
use crate::families::inputs::WorkloadKind;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::FamilyError;

/// diffusers' class of the WAN VAE (`_class_name` of `vae/config.json`).
pub const CLASS_NAME: &str = "AutoencoderKLWan";

/// What a run without a pipeline's latent decodes: seeded noise of this many latent
/// frames, rows and columns (5 frames of 64² for Wan 2.1's VAE); when only headers
/// are read, to describe a real decode, 21 × 60 × 104 (81 frames of 480 × 832).
const DEFAULT_LATENT: [usize; 3] = [2, 8, 8];
const DESCRIBED_LATENT: [usize; 3] = [21, 60, 104];

impl Open for WanVaeDecoder {
    const NAME: &'static str = "wan-vae";
    const KIND: WorkloadKind = WorkloadKind::Autoencoder;
    const STEP: StepUnit = StepUnit::Batch;

    /// A described step decodes one latent frame of a 480 × 832 video.
    fn described_step(
        _: &Found<'_>,
        _: u64,
        _: &mut crate::families::Extras,
    ) -> Result<Option<usize>, FamilyError> {
        Ok(Some(1))
    }

    /// diffusers' WAN VAE folder, or one file of a WAN VAE's tensors (read in
    /// diffusers' names: ComfyUI's files are renamed as they are opened), known by
    /// its RMS norms.
    fn recognises(found: &Found<'_>) -> bool {
        match found.folder {
            Some(_) => found.class_name() == Some(CLASS_NAME),
            None => super::single_file::is_wan_vae(found.index),
        }
    }

    /// The decoder over the run's latent videos, or one seeded latent.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = WanVaeConfig::of(request)?;
        let input = match request.extras.input::<VideoLatentInput>() {
            Some(input) => input.clone(),
            None => {
                let [frames, height, width] = match request.extras.headers_only {
                    true => DESCRIBED_LATENT,
                    false => DEFAULT_LATENT,
                };
                VideoLatentInput {
                    latents: vec![gaussian(config.z_dim * frames * height * width, 0)],
                    frames,
                    height,
                    width,
                    tile: None,
                }
            }
        };
        WanVaeDecoder::new(request.index, config, input)
    }
}
