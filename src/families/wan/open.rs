//! How a WAN transformer folder is recognised and opened, and what the run asks of it.

use std::path::Path;

use stagehand_actors::ModelLayout;

use super::config::WanConfig;
use super::input::WanInput;
use super::sample::{DeferredSample, WanSample};
use super::single_file;
use super::working_set::activations_at;
use super::Wan;
use crate::families::family::Facts;
use crate::families::inputs::WorkloadKind;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::{DescribedReserve, DescribedWorkload, Extras, FamilyError};
use crate::model::ModelIndex;

/// diffusers' class of the WAN transformer (`_class_name` of `transformer/config.json`).
pub const CLASS_NAME: &str = "WanTransformer3DModel";

/// What a run without a [`WanInput`] computes: a seeded latent of this many frames,
/// rows and columns with this many text tokens; when only headers are read (to
/// describe a real step), 81 frames of 480 × 832 (the VAE's 4× in time, 8× in
/// space) with umT5's 512 tokens.
const DEFAULT_LATENT: [usize; 3] = [2, 16, 16];
const DEFAULT_TEXT_TOKENS: usize = 16;
const DESCRIBED_LATENT: [usize; 3] = [21, 60, 104];
const DESCRIBED_TEXT_TOKENS: usize = 512;

/// Latent frames of `frames` video frames (WAN's VAE keeps the first frame and
/// folds every 4 after it into one).
fn latent_frames(frames: u64) -> u64 {
    frames.saturating_sub(1) / 4 + 1
}

impl Open for Wan {
    const NAME: &'static str = "wan";
    const KIND: WorkloadKind = WorkloadKind::Diffusion;
    const STEP: StepUnit = StepUnit::Denoise;

    /// A described step is one guided velocity (the prompt's and the negative
    /// prompt's passes, as WanPipeline samples) of 81 frames at 480 × 832 with 512 text
    /// tokens.
    fn described_step(_: &Found<'_>, _: u64, _: &mut Extras) -> Result<Option<usize>, FamilyError> {
        Ok(Some(1))
    }

    /// The activation tensors of a step at `width` × `height` (81 frames) with
    /// `text_tokens` umT5 tokens, for diffusers' `transformer/config.json`.
    fn described_reserve(
        config: &serde_json::Value,
        workload: &DescribedWorkload,
    ) -> Result<Option<DescribedReserve>, FamilyError> {
        let config = WanConfig::from_json(Path::new("[activations] config"), config)?;
        let need = |value, key| DescribedWorkload::needs(value, key, "wan");
        let width = need(workload.width, "width")
            .map_err(|message| FamilyError::request("width", message))?;
        let height = need(workload.height, "height")
            .map_err(|message| FamilyError::request("height", message))?;
        let text = need(workload.text_tokens, "text_tokens")
            .map_err(|message| FamilyError::request("text_tokens", message))?;
        let [pt, ph, pw] = config.patch.map(|patch| patch as u64);
        let tokens = latent_frames(81) / pt * (height / 8 / ph) * (width / 8 / pw);
        if tokens == 0 || width % (8 * pw) != 0 || height % (8 * ph) != 0 {
            return Err(FamilyError::request("width", format!(
                "a {width}×{height} video: WAN takes sizes that are positive multiples of 8 (the VAE) × the patch {:?}",
                config.patch
            )));
        }
        Ok(Some(DescribedReserve {
            kv_cache: None,
            activations: Some(activations_at(
                &config,
                tokens as usize,
                text as usize,
                true,
            )),
        }))
    }

    /// A `WanTransformer3DModel` folder, or one file of a WAN transformer's tensors
    /// (read in diffusers' names: ComfyUI's files are renamed as they are opened).
    fn recognises(found: &Found<'_>) -> bool {
        match found.folder {
            Some(_) => found.class_name() == Some(CLASS_NAME),
            None => single_file::is_wan(found.index),
        }
    }

    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = match request.folder {
            Some(folder) => WanConfig::from_json(&folder.config_path(), &folder.config)?,
            None => {
                WanConfig::from_json(request.path, &single_file::inferred_config(request.index)?)?
            }
        };
        check_layers(request.index, &config)?;
        if let Some(sample) = request.extras.input::<WanSample>() {
            let Some(first) = sample.solver.timestep(sample.solver.steps_taken()) else {
                return Err(FamilyError::request(
                    "steps",
                    "the sampling's schedule has no step left".into(),
                ));
            };
            if config.in_channels != config.out_channels && sample.input.condition.is_none() {
                return Err(FamilyError::request("image", format!(
                    "this transformer takes {} channels and gives {}: it samples from an image (image-to-video), whose condition fills the other {}; give --image",
                    config.in_channels,
                    config.out_channels,
                    config.in_channels.saturating_sub(config.out_channels)
                )));
            }
            let input = WanInput {
                timestep: first,
                ..sample.input.clone()
            };
            let wan = Wan::new(request.index, config, input, Some(sample.clone()))?;
            return Ok(match request.extras.input::<DeferredSample>() {
                Some(deferred) => wan.with_deferred(deferred.clone()),
                None => wan,
            });
        }
        let input = match request.extras.input::<WanInput>() {
            Some(input) => input.clone(),
            None if request.extras.headers_only => {
                WanInput::seeded_guided(&config, DESCRIBED_LATENT, DESCRIBED_TEXT_TOKENS)
            }
            None => WanInput::seeded(&config, DEFAULT_LATENT, DEFAULT_TEXT_TOKENS),
        };
        Wan::new(request.index, config, input, None)
    }
}

/// The checkpoint's blocks against `num_layers`: a block past the config's last is
/// a file and a config of different models.
fn check_layers(index: &ModelIndex, config: &WanConfig) -> Result<(), FamilyError> {
    let beyond = format!("blocks.{}.", config.layers);
    if let Some(tensor) = index.tensors.iter().find(|t| t.name.starts_with(&beyond)) {
        return Err(FamilyError::config(&index.path, Some("num_layers"), format!(
            "{}: tensor `{}` lies past the config's num_layers {}; the file and the config are of different models",
            index.path.display(),
            tensor.name,
            config.layers
        )));
    }
    Ok(())
}

impl Facts for Wan {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Diffusion
    }

    fn describe(&self) -> &'static str {
        "wan transformer"
    }

    fn layout(&self) -> &ModelLayout {
        &self.weights.placement.layout
    }

    fn activation_bytes(&self, _steps: u64) -> u64 {
        self.working_set_bytes()
    }

    fn activations(&self) -> Option<crate::families::Activations> {
        Some(Wan::activations(self))
    }

    /// Video and text token rows through every block.
    fn tokens_per_step(&self) -> u64 {
        self.tokens.max(self.text) as u64
    }

    /// Every step of a sampling is its own (one velocity: all steps the same).
    fn reference_key(&self, step: u64) -> u64 {
        step % self.steps_per_sample() as u64
    }

    /// A sampling's step continues from the latent of the one before.
    fn reference_is_sequential(&self) -> bool {
        self.sampling()
    }
}
