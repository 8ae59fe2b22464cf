//! How a T5 encoder's folder is recognised and opened.

use super::{T5Config, T5Encoder};
use crate::families::config_json::ConfigJson;
use crate::families::inputs::{EncoderInput, PaddingMasked, PromptLength, WorkloadKind};
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
        let umt5 = json.text("model_type", "t5") == "umt5";
        // Where the config leaves a size out, transformers' defaults of its class.
        let defaults = if umt5 { UMT5_DEFAULTS } else { T5_DEFAULTS };
        // v1.1 (T5-XXL of Flux, FLAN-T5, umT5's layers): the gated tanh GELU.
        json.require_text("feed_forward_proj", &["gated-gelu"])?;
        json.require_text("dense_act_fn", &["gelu_new", "gelu_pytorch_tanh"])?;
        if json.flag("is_decoder", false) {
            return Err(json.bad(
                "is_decoder",
                "`is_decoder` is true; stagehand computes T5's encoder".into(),
            ));
        }
        let [vocab, feed_forward, layers, heads] = defaults;
        Ok(Self {
            vocab: json.count("vocab_size", Some(vocab))?,
            model: json.count("d_model", Some(512))?,
            head_dim: json.count("d_kv", Some(64))?,
            feed_forward: json.count("d_ff", Some(feed_forward))?,
            layers: json.count("num_layers", Some(layers))?,
            heads: json.count("num_heads", Some(heads))?,
            buckets: json.count("relative_attention_num_buckets", Some(32))?,
            max_distance: json.count("relative_attention_max_distance", Some(128))?,
            eps: json.float("layer_norm_epsilon", 1e-6)? as f32,
            bias_per_layer: umt5,
        })
    }
}

/// `T5Config`'s and `UMT5Config`'s defaults of vocab_size, d_ff, num_layers, num_heads.
const T5_DEFAULTS: [usize; 4] = [32128, 2048, 6, 8];
const UMT5_DEFAULTS: [usize; 4] = [250112, 1024, 8, 6];

/// The first block's relative position bias, `[buckets, heads]`, in transformers'
/// names (ComfyUI's `t5xxl_fp16.safetensors` too).
const POSITION_BIAS: &str = "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";

/// The second block's, which only umT5 has (ComfyUI's `umt5_xxl_fp16.safetensors`).
const SECOND_POSITION_BIAS: &str =
    "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight";

impl T5Config {
    /// The config of a checkpoint without one, from its shapes: T5 v1.1 (the gated
    /// tanh GELU, buckets reaching 128 positions) at the file's sizes. The heads are
    /// the position bias table's columns; a second block with its own table is umT5.
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
            return Err(shapes.unsupported(
                "T5 v1.0",
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
            bias_per_layer: shapes.has(SECOND_POSITION_BIAS),
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
    const MODEL_TYPES: &'static [&'static str] = &["t5", "umt5"];
    const ARCHITECTURES: &'static [&'static str] = &["T5EncoderModel", "UMT5EncoderModel"];

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
            return Err(FamilyError::request(
                "max_sequence_length",
                "--max-sequence-length 0: a prompt needs at least one token".into(),
            ));
        }
        let prompts = prompt_tokens::prompts(
            &prompt_tokens::tokenizer_home(request)?,
            request.extras.input(),
            length,
            PAD,
        )?;
        let masked = request.extras.input::<PaddingMasked>().is_some();
        T5Encoder::new(
            request.index,
            config,
            prompts,
            (length, masked),
            request.batch,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::T5Config;
    use serde_json::json;
    use std::path::Path;

    #[test]
    fn a_umt5_config_has_a_bias_per_block_and_umt5s_defaults() {
        // Proves `model_type: umt5` turns on the per-block position bias and fills
        // missing sizes from UMT5Config (vocab 250 112, 6 heads), T5's config neither.
        let path = Path::new("config.json");
        let umt5 = T5Config::from_json(path, &json!({"model_type": "umt5"})).expect("umt5");
        assert!(umt5.bias_per_layer);
        assert_eq!((umt5.vocab, umt5.heads, umt5.layers), (250112, 6, 8));
        let t5 = T5Config::from_json(path, &json!({"model_type": "t5"})).expect("t5");
        assert!(!t5.bias_per_layer);
        assert_eq!((t5.vocab, t5.heads), (32128, 8));
    }

    #[test]
    fn a_umt5_config_with_another_feed_forward_is_refused_by_name() {
        // Proves a umt5 config whose feed-forward is not the gated tanh GELU is refused
        // naming the key, not computed wrong.
        let config = json!({"model_type": "umt5", "feed_forward_proj": "relu"});
        let error = T5Config::from_json(Path::new("config.json"), &config)
            .expect_err("refused")
            .to_string();
        assert!(error.contains("feed_forward_proj"), "{error}");
    }
}
