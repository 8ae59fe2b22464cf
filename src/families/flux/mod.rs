//! Flux.1 diffusion transformers (dev, schnell, and fine-tunes of their shape) from the
//! original, ComfyUI and diffusers layouts, written once against the compute port.
//!
//! One step of the family is one denoising step: the transformer's velocity at the
//! step's sigma from the latent the state carries, then the Euler update. The pass:
//! the packed latent (64 channels = 16 × 2×2) through `img_in`, the T5 states through
//! `txt_in`, `vec` = time (and, for dev, guidance) embeddings of 256 frequencies plus
//! the pooled CLIP vector's; the double-stream blocks (per-stream adaLN with shift,
//! scale, gate ×2, LayerNorm without affine at eps 1e-6, QK RMSNorm, joint attention
//! over text then image with the three-axis rope on interleaved pairs, GELU-tanh MLP);
//! the single-stream blocks over the concatenation (`linear1` giving q, k, v and the
//! MLP input, `linear2` over attention and MLP, gated); the final adaLN and linear.
//! Every double and single block is a block the session streams.

mod config;
mod demo;
mod demo_lora;
mod embed;
mod input;
mod layers;
mod lora_names;
mod names;
mod open;
mod quant;
mod sampler;
mod step;
mod weights;
mod working_set;

pub use config::{FluxConfig, AXES_METADATA};
pub use demo::{write_conditioning, FluxDemo, FluxPreset, FluxShape};
pub use demo_lora::{
    lora_modules, write_flux_lora, write_flux_lora_in, write_flux_lora_own_down, FluxLoraNaming,
};
pub use embed::{gaussian, pack, unpack};
pub use input::{
    read_tensors, write_latent, CondInput, Conditioning, SampleInput, Start, CONTEXT_NAME,
    LATENT_NAME, POOLED_NAME,
};
pub use names::{Layout, COMFY_PREFIX};
pub use quant::METADATA_KEY as QUANTIZATION_METADATA;
pub use sampler::{euler_step, first_step, mu, sigmas};

use self::names::Names;
use self::weights::FluxWeights;
use crate::families::FamilyError;
use crate::model::ModelIndex;

/// Guidance of Flux dev when none is asked for (diffusers' default).
pub const DEFAULT_GUIDANCE: f32 = 3.5;

/// A Flux transformer ready to sample.
pub struct Flux {
    pub config: FluxConfig,
    pub layout: Layout,
    weights: FluxWeights,
    cond: Conditioning,
    /// The image in tokens: `rows × cols` (pixels / 16).
    pub rows: usize,
    pub cols: usize,
    guidance: Option<f32>,
    /// The schedule's sigmas (steps + 1, ending at 0) and the step it starts at.
    pub sigmas: Vec<f32>,
    pub first: usize,
    /// The packed first latent.
    initial: Vec<f32>,
    /// The rope table of every token, text then image.
    table: Vec<f32>,
}

/// How a Flux model is asked to sample, resolved.
pub struct Plan {
    pub cond: Conditioning,
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    pub guidance: Option<f32>,
    /// The unpacked latent to start from and, for image-to-image, its strength and the
    /// noise's seed; or the seed of the starting noise.
    pub init: Option<Vec<f32>>,
    pub strength: Option<f64>,
    pub seed: u64,
}

impl Flux {
    pub fn new(
        index: &ModelIndex,
        config: FluxConfig,
        names: Names,
        plan: Plan,
    ) -> Result<Self, FamilyError> {
        let weights = FluxWeights::place(index, names, &config)?;
        if plan.width == 0 || plan.height == 0 || plan.width % 16 != 0 || plan.height % 16 != 0 {
            return Err(FamilyError::request("width", format!(
                "--width {} --height {}: both must be positive multiples of 16 (8 for the VAE × 2 for the patches)",
                plan.width, plan.height
            )));
        }
        if plan.steps == 0 {
            return Err(FamilyError::request(
                "steps",
                "--steps 0 samples nothing; give at least 1".into(),
            ));
        }
        let guidance = match (plan.guidance, config.guidance) {
            (Some(_), false) => {
                return Err(FamilyError::request("guidance", 
                    "--guidance: this checkpoint has no guidance embedder (Flux schnell or another guidance-free model); drop --guidance".into(),
                ))
            }
            (Some(guidance), true) => Some(guidance),
            (None, true) => Some(DEFAULT_GUIDANCE),
            (None, false) => None,
        };
        let (rows, cols) = (plan.height / 16, plan.width / 16);
        let channels = config.in_channels / 4;
        let sigmas = sampler::sigmas(plan.steps, rows * cols, config.guidance);
        let strength = plan.strength.unwrap_or(1.0);
        let first = sampler::first_step(plan.steps, strength);
        if first >= plan.steps {
            return Err(FamilyError::request(
                "strength",
                format!(
                    "--strength {strength} with --steps {} runs no step; raise either",
                    plan.steps
                ),
            ));
        }
        let noise = || embed::gaussian(channels * 4 * rows * cols, plan.seed);
        let latent = match (plan.init, plan.strength) {
            (Some(image), Some(_)) => {
                let sigma = sigmas[first];
                noise()
                    .iter()
                    .zip(&image)
                    .map(|(noise, image)| sigma * noise + (1.0 - sigma) * image)
                    .collect()
            }
            (Some(init), None) => init,
            (None, _) => noise(),
        };
        let initial = embed::pack(&latent, channels, rows, cols);
        let ids = embed::token_ids(plan.cond.tokens, rows, cols);
        let table = embed::rope_table(&ids, &config.axes);
        Ok(Self {
            layout: names.layout,
            config,
            weights,
            cond: plan.cond,
            rows,
            cols,
            guidance,
            sigmas,
            first,
            initial,
            table,
        })
    }

    /// Denoising steps one sample runs (the schedule's, less image-to-image's skip).
    pub fn steps_per_sample(&self) -> usize {
        self.sigmas.len() - 1 - self.first
    }

    pub fn text_tokens(&self) -> usize {
        self.cond.tokens
    }

    pub fn image_tokens(&self) -> usize {
        self.rows * self.cols
    }

    /// The latent `[channels, H/8, W/8]` of a step's packed output.
    pub fn unpack(&self, packed: &[f32]) -> Vec<f32> {
        embed::unpack(packed, self.config.in_channels / 4, self.rows, self.cols)
    }

    /// Bytes of the activations one step holds (every tensor of its state), reserved
    /// before its first block.
    pub fn working_set_bytes(&self) -> u64 {
        self.activations().reserved_bytes
    }

    /// What a step reserves, and the working set of each kind of block (embedders,
    /// double block, single block, final layer), from the shapes each uses.
    pub fn activations(&self) -> crate::families::Activations {
        working_set::activations(self)
    }
}
