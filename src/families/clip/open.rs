//! How a CLIP text encoder's folder is recognised and opened.

use super::{prefix_of, ClipConfig, ClipText, PREFIXES};
use crate::families::config_json::ConfigJson;
use crate::families::inputs::{EncoderInput, WorkloadKind};
use crate::families::prompt_tokens;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::shapes::Shapes;
use crate::families::FamilyError;

/// CLIP's pad token when `tokenizer_config.json` names none (FLUX.1's pads with it).
const PAD: &str = "<|endoftext|>";

impl ClipConfig {
    pub fn from_json(
        path: &std::path::Path,
        config: &serde_json::Value,
    ) -> Result<Self, FamilyError> {
        // A full CLIPModel config keeps the text tower's under `text_config`.
        let config = (config.get("text_config"))
            .filter(|inner| inner.is_object())
            .unwrap_or(config);
        let json = ConfigJson::new(path, config)?;
        json.require_text("hidden_act", &["quick_gelu", "gelu"])?;
        let hidden = json.count("hidden_size", Some(512))?;
        let heads = json.count("num_attention_heads", Some(8))?;
        if hidden % heads != 0 {
            return Err(json.bad(
                "hidden_size",
                format!("hidden_size {hidden} is not a multiple of num_attention_heads {heads}"),
            ));
        }
        Ok(Self {
            vocab: json.count("vocab_size", Some(49408))?,
            hidden,
            intermediate: json.count("intermediate_size", Some(2048))?,
            layers: json.count("num_hidden_layers", Some(12))?,
            heads,
            positions: json.count("max_position_embeddings", Some(77))?,
            eps: json.float("layer_norm_eps", 1e-5)? as f32,
            eos_token_id: json.integer("eos_token_id").unwrap_or(2),
            quick_gelu: json.text("hidden_act", "quick_gelu") == "quick_gelu",
        })
    }
}

/// Every CLIP's head width (L: 768 = 12 × 64, G: 1280 = 20 × 64, B: 512 = 8 × 64):
/// the heads of a checkpoint without its config.
const HEAD_WIDTH: usize = 64;

impl ClipConfig {
    /// The config of a checkpoint without one, from its shapes: CLIP-L's as Flux
    /// uses it (quick GELU, the legacy end-of-text rule) at the file's sizes.
    pub fn infer(index: &crate::model::ModelIndex) -> Result<Self, FamilyError> {
        let shapes = Shapes::new(index, "a CLIP text encoder");
        let prefix = prefix_of(index).unwrap_or(PREFIXES[0]);
        let (vocab, hidden) =
            shapes.matrix(&format!("{prefix}embeddings.token_embedding.weight"))?;
        if hidden % HEAD_WIDTH != 0 {
            return Err(shapes.bad(format!(
                "a width of {hidden} is not a whole number of CLIP's {HEAD_WIDTH}-wide heads; give the encoder's folder with its config.json"
            )));
        }
        Ok(Self {
            vocab,
            hidden,
            intermediate: shapes
                .matrix(&format!("{prefix}encoder.layers.0.mlp.fc1.weight"))?
                .0,
            layers: shapes.count(&format!("{prefix}encoder.layers.")),
            heads: hidden / HEAD_WIDTH,
            positions: shapes
                .matrix(&format!("{prefix}embeddings.position_embedding.weight"))?
                .0,
            eps: 1e-5,
            eos_token_id: 2,
            quick_gelu: true,
        })
    }
}

impl Open for ClipText {
    const NAME: &'static str = "clip";
    const KIND: WorkloadKind = WorkloadKind::TextEncoder;
    const STEP: StepUnit = StepUnit::Batch;

    /// A described step encodes one prompt (the built-in one, padded to the model's
    /// length): what a pipeline asks of it per image.
    /// A described step encodes one prompt of the model's positions; the ids do not
    /// change the work, so they are made up (no tokenizer needed to describe it).
    fn described_step(
        found: &Found<'_>,
        _: u64,
        extras: &mut crate::families::Extras,
    ) -> Result<Option<usize>, FamilyError> {
        if extras.input::<EncoderInput>().is_none() {
            let config = match found.folder {
                Some(folder) => ClipConfig::from_json(&folder.config_path(), &folder.config)?,
                None => ClipConfig::infer(found.index)?,
            };
            let ids = vec![vec![0; config.positions]];
            extras.inputs.insert(EncoderInput::TokenIds(ids));
        }
        Ok(Some(1))
    }
    const MODEL_TYPES: &'static [&'static str] = &["clip_text_model", "clip"];
    const ARCHITECTURES: &'static [&'static str] = &["CLIPTextModel"];

    /// A checkpoint without a config.json in transformers' names (ComfyUI's `clip_l.safetensors`).
    fn recognises_bare(index: &crate::model::ModelIndex) -> bool {
        prefix_of(index).is_some()
    }

    /// The encoder over the run's prompts (or the built-in one), each cut and padded
    /// to the model's positions by the pipeline's CLIP tokenizer.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = match request.folder {
            Some(folder) => ClipConfig::from_json(&folder.config_path(), &folder.config)?,
            None => ClipConfig::infer(request.index)?,
        };
        let prompts = prompt_tokens::prompts(
            &prompt_tokens::tokenizer_home(request)?,
            request.extras.input(),
            config.positions,
            PAD,
        )?;
        ClipText::new(request.index, config, prompts, request.batch)
    }
}
