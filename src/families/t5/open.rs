//! How a T5 encoder's folder is recognised and opened.

use super::{T5Config, T5Encoder};
use crate::families::config_json::ConfigJson;
use crate::families::inputs::{EncoderInput, PromptLength, WorkloadKind};
use crate::families::prompt_tokens;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::shapes::Shapes;
use crate::families::FamilyError;

/// Tokens a prompt is padded to when the run names no length: diffusers'
/// `FluxPipeline` default (`max_sequence_length`, Flux dev's).
pub const DEFAULT_PROMPT_LENGTH: usize = 512;

/// T5's pad token when `tokenizer_config.json` names none.
const PAD: &str = "<pad>";

impl T5Config {
    pub fn from_json(
        path: &std::path::Path,
        config: &serde_json::Value,
    ) -> Result<Self, FamilyError> {
        let json = ConfigJson::new(path, config)?;
        // v1.1 (T5-XXL of Flux, FLAN-T5, umT5's layers): the gated tanh GELU.
        json.require_text("feed_forward_proj", &["gated-gelu"])?;
        json.require_text("dense_act_fn", &["gelu_new", "gelu_pytorch_tanh"])?;
        if json.flag("is_decoder", false) {
            return Err(json.bad("`is_decoder` is true; stagehand computes T5's encoder".into()));
        }
        let model = json.count("d_model", Some(512))?;
        Ok(Self {
            vocab: json.count("vocab_size", Some(32128))?,
            model,
            head_dim: json.count("d_kv", Some(64))?,
            feed_forward: json.count("d_ff", Some(2048))?,
            layers: json.count("num_layers", Some(6))?,
            heads: json.count("num_heads", Some(8))?,
            buckets: json.count("relative_attention_num_buckets", Some(32))?,
            max_distance: json.count("relative_attention_max_distance", Some(128))?,
            eps: json.float("layer_norm_epsilon", 1e-6)? as f32,
        })
    }
}

/// The first block's relative position bias, `[buckets, heads]`, in transformers'
/// names (ComfyUI's `t5xxl_fp16.safetensors` too).
const POSITION_BIAS: &str = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";

impl T5Config {
    /// The config of a checkpoint without one, from its shapes: T5 v1.1 (the gated
    /// tanh GELU, buckets reaching 128 positions) at the file's sizes. The heads are
    /// the position bias table's columns.
    pub fn infer(index: &crate::model::ModelIndex) -> Result<Self, FamilyError> {
        let shapes = Shapes::new(index, "a T5 encoder");
        let embedding = ["shared.weight", "encoder.embed_tokens.weight"]
            .into_iter()
            .find(|name| shapes.has(name))
            .unwrap_or("shared.weight");
        let (vocab, model) = shapes.matrix(embedding)?;
        let (buckets, heads) = shapes.matrix(POSITION_BIAS)?;
        let inner = shapes
            .matrix("encoder.block.0.layer.0.SelfAttention.q.weight")?
            .0;
        let feed_forward = "encoder.block.0.layer.1.DenseReluDense";
        if !shapes.has(&format!("{feed_forward}.wi_0.weight")) {
            return Err(shapes.bad(
                "its feed-forward is not gated (no `wi_0`): T5 v1.0, which stagehand does not compute (Flux's T5-XXL is v1.1)".into(),
            ));
        }
        if heads == 0 || inner % heads != 0 {
            return Err(shapes.bad(format!(
                "{inner} query rows are not a whole number of the position bias's {heads} heads"
            )));
        }
        Ok(Self {
            vocab,
            model,
            head_dim: inner / heads,
            feed_forward: shapes.matrix(&format!("{feed_forward}.wi_0.weight"))?.0,
            layers: shapes.count("encoder.block."),
            heads,
            buckets,
            max_distance: 128,
            eps: 1e-6,
        })
    }
}

impl Open for T5Encoder {
    const NAME: &'static str = "t5";
    const KIND: WorkloadKind = WorkloadKind::TextEncoder;
    const STEP: StepUnit = StepUnit::Batch;

    /// A described step encodes one prompt (the built-in one, padded to the model's
    /// length): what a pipeline asks of it per image.
    /// A described step encodes one prompt of the run's length (512 by default); the
    /// ids do not change the work, so they are made up (no tokenizer needed).
    fn described_step(
        _: &Found<'_>,
        _: u64,
        extras: &mut crate::families::Extras,
    ) -> Result<Option<usize>, FamilyError> {
        if extras.input::<EncoderInput>().is_none() {
            let length = extras
                .input::<PromptLength>()
                .map_or(DEFAULT_PROMPT_LENGTH, |length| length.0);
            extras
                .inputs
                .insert(EncoderInput::TokenIds(vec![vec![0; length]]));
        }
        Ok(Some(1))
    }
    const MODEL_TYPES: &'static [&'static str] = &["t5"];
    const ARCHITECTURES: &'static [&'static str] = &["T5EncoderModel"];

    /// A checkpoint without a config.json in transformers' names (ComfyUI's `t5xxl_fp16.safetensors`).
    fn recognises_bare(index: &crate::model::ModelIndex) -> bool {
        index.tensor(POSITION_BIAS).is_some()
    }

    /// The encoder over the run's prompts (or the built-in one), each cut and padded
    /// to the run's prompt length (512 by default) by the pipeline's T5 tokenizer.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = match request.folder {
            Some(folder) => T5Config::from_json(&folder.config_path(), &folder.config)?,
            None => T5Config::infer(request.index)?,
        };
        let length = request
            .extras
            .input::<PromptLength>()
            .map_or(DEFAULT_PROMPT_LENGTH, |length| length.0);
        if length == 0 {
            return Err(FamilyError::Model(
                "--max-sequence-length 0: a prompt needs at least one token".into(),
            ));
        }
        let prompts = prompt_tokens::prompts(
            &prompt_tokens::tokenizer_home(request)?,
            request.extras.input(),
            length,
            PAD,
        )?;
        T5Encoder::new(request.index, config, prompts, length, request.batch)
    }
}
