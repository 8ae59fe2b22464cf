//! How a Flux checkpoint is recognised and opened, and what the run asks of it.

use std::path::Path;

use stagehand_actors::ModelLayout;

use super::config::FluxConfig;
use super::input::{read_latent, Conditioning, SampleInput, Start};
use super::names::Names;
use super::working_set::activations_at;
use super::{Flux, Plan};
use crate::compute::TensorSlot;
use crate::families::family::Facts;
use crate::families::inputs::WorkloadKind;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::{DescribedReserve, DescribedWorkload, FamilyError};
use crate::model::ModelIndex;

/// diffusers' class of the Flux transformer (`_class_name` of `transformer/config.json`).
pub const CLASS_NAME: &str = "FluxTransformer2DModel";

/// What a run without `sample`'s inputs computes: a seeded conditioning of this many
/// text tokens at this size and steps (Flux's own 512 tokens at 1024² when only
/// headers are read, to describe a real step).
const DEFAULT_TEXT_TOKENS: usize = 32;
const DEFAULT_SIZE: usize = 256;
const DEFAULT_STEPS: usize = 4;
const DESCRIBED_TEXT_TOKENS: usize = 512;
const DESCRIBED_SIZE: usize = 1024;

impl Open for Flux {
    const NAME: &'static str = "flux";
    const KIND: WorkloadKind = WorkloadKind::Diffusion;
    const STEP: StepUnit = StepUnit::Denoise;

    /// A described step is one denoising step of 1024² with 512 text tokens (the
    /// input `open` makes when only headers are read).
    fn described_step(
        _: &Found<'_>,
        _: u64,
        _: &mut crate::families::Extras,
    ) -> Result<Option<usize>, FamilyError> {
        Ok(Some(1))
    }

    /// The activation tensors of a step at `width` × `height` with `text_tokens` T5
    /// tokens, for diffusers' `transformer/config.json`: the list a run allocates.
    fn described_reserve(
        config: &serde_json::Value,
        workload: &DescribedWorkload,
    ) -> Result<Option<DescribedReserve>, FamilyError> {
        let config = FluxConfig::from_json(Path::new("[activations] config"), config)?;
        let need = |value, key| DescribedWorkload::needs(value, key, "flux");
        let width = need(workload.width, "width")
            .map_err(|message| FamilyError::request("width", message))?;
        let height = need(workload.height, "height")
            .map_err(|message| FamilyError::request("height", message))?;
        let text_tokens = need(workload.text_tokens, "text_tokens")
            .map_err(|message| FamilyError::request("text_tokens", message))?;
        if width % 16 != 0 || height % 16 != 0 || width == 0 || height == 0 {
            return Err(FamilyError::request(
                "width",
                format!("a {width}×{height} image: Flux takes sizes that are multiples of 16"),
            ));
        }
        let image_tokens = (width / 16) * (height / 16);
        Ok(Some(DescribedReserve {
            kv_cache: None,
            activations: Some(activations_at(
                &config,
                text_tokens as usize,
                image_tokens as usize,
            )),
        }))
    }

    fn recognises(found: &Found<'_>) -> bool {
        match found.folder {
            Some(_) => found.class_name() == Some(CLASS_NAME),
            None => Names::detect(found.index).is_some(),
        }
    }

    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let index = request.index;
        let names = Names::detect(index).ok_or_else(|| {
            FamilyError::unsupported(request.path, "not a Flux transformer", format!(
                "{}: not a Flux transformer (no img_in/txt_in/double_blocks tensors, with or without model.diffusion_model., nor diffusers' x_embedder/context_embedder)",
                request.path.display()
            ))
        })?;
        super::quant::check(index, request.extras.headers_only)?;
        let config = match request.folder {
            Some(folder) => FluxConfig::from_json(&folder.config_path(), &folder.config)?,
            None => FluxConfig::infer(index, &names)?,
        };
        check_counts(index, &names, &config)?;
        let plan = plan_of(request, &config)?;
        Flux::new(index, config, names, plan)
    }
}

/// Block counts of the checkpoint against its config.
fn check_counts(index: &ModelIndex, names: &Names, config: &FluxConfig) -> Result<(), FamilyError> {
    for (kind, key, expected) in [
        ("double_blocks", "num_layers", config.double_blocks),
        ("single_blocks", "num_single_layers", config.single_blocks),
    ] {
        let found = names.count(index, kind);
        if found != expected {
            return Err(FamilyError::config(&index.path, Some(key), format!(
                "{}: the checkpoint has {found} {kind}, its config says {expected} ({key}); the file and the config are of different models",
                index.path.display()
            )));
        }
    }
    Ok(())
}

fn plan_of(request: &Request<'_>, config: &FluxConfig) -> Result<Plan, FamilyError> {
    let (context_dim, pooled_dim) = (config.context_dim, config.pooled_dim);
    let Some(input) = request.extras.input::<SampleInput>() else {
        let (tokens, size) = match request.extras.headers_only {
            true => (DESCRIBED_TEXT_TOKENS, DESCRIBED_SIZE),
            false => (DEFAULT_TEXT_TOKENS, DEFAULT_SIZE),
        };
        return Ok(Plan {
            cond: Conditioning::seeded(tokens, context_dim, pooled_dim),
            width: size,
            height: size,
            steps: DEFAULT_STEPS,
            guidance: None,
            init: None,
            strength: None,
            seed: 0,
        });
    };
    let cond = Conditioning::of(&input.cond, context_dim, pooled_dim)?;
    let channels = config.in_channels / 4;
    let (init, strength, seed) = match &input.start {
        Start::Seed(seed) => (None, None, *seed),
        Start::Latent(latent) => {
            let expected = channels * (input.height / 8) * (input.width / 8);
            if latent.len() != expected {
                return Err(FamilyError::request("latents", format!(
                    "the starting latent has {} values; a {}×{} image starts from [{channels}, {}, {}]",
                    latent.len(),
                    input.width,
                    input.height,
                    input.height / 8,
                    input.width / 8
                )));
            }
            (Some(latent.clone()), None, 0)
        }
        Start::Image {
            latent,
            strength,
            seed,
        } => {
            let expected = channels * (input.height / 8) * (input.width / 8);
            if latent.len() != expected {
                return Err(FamilyError::request("image", format!(
                    "the encoded image has {} values; a {}×{} image's latent is [{channels}, {}, {}]",
                    latent.len(),
                    input.width,
                    input.height,
                    input.height / 8,
                    input.width / 8
                )));
            }
            (Some(latent.clone()), Some(*strength), *seed)
        }
        Start::Init {
            path,
            strength,
            seed,
        } => {
            if input.width % 16 != 0 || input.height % 16 != 0 {
                (None, *strength, *seed)
            } else {
                let latent = read_latent(path, channels, input.height / 8, input.width / 8)?;
                (Some(latent), *strength, *seed)
            }
        }
    };
    if let Some(strength) = strength.filter(|strength| !(*strength > 0.0 && *strength <= 1.0)) {
        return Err(FamilyError::request(
            "strength",
            format!("--strength {strength}: give a value in (0, 1] (1 starts from pure noise)"),
        ));
    }
    Ok(Plan {
        cond,
        width: input.width,
        height: input.height,
        steps: input.steps,
        guidance: input.guidance,
        init,
        strength,
        seed,
    })
}

impl Facts for Flux {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Diffusion
    }

    fn describe(&self) -> &'static str {
        "flux transformer"
    }

    fn layout(&self) -> &ModelLayout {
        &self.weights.placement.layout
    }

    fn activation_bytes(&self, _steps: u64) -> u64 {
        self.working_set_bytes()
    }

    fn activations(&self) -> Option<crate::families::Activations> {
        Some(Flux::activations(self))
    }

    fn takes_lora(&self) -> bool {
        true
    }

    /// The other layout's modules: diffusers pieces on an original or ComfyUI file,
    /// original (kohya) names on a diffusers folder.
    fn lora_aliases(&self) -> Vec<crate::lora::LoraAlias> {
        super::lora_names::aliases(
            Names {
                layout: self.layout,
            },
            &self.weights.linears,
        )
    }

    fn place(&self, _index: &ModelIndex, tensor: usize) -> Option<(usize, TensorSlot)> {
        self.weights.placement.slot_of(tensor)
    }

    fn reference_key(&self, step: u64) -> u64 {
        step
    }

    /// Each step continues from the latent of the one before.
    fn reference_is_sequential(&self) -> bool {
        true
    }

    /// Text and image tokens through every block.
    fn tokens_per_step(&self) -> u64 {
        (self.text_tokens() + self.image_tokens()) as u64
    }
}
