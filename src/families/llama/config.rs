//! A Llama-family `config.json` (`llama`, `mistral`, `qwen2`, `mixtral`), read and
//! checked: sizes, grouped-query heads, rotary embedding (with Llama 3's
//! `rope_scaling`), tied embeddings, q/k/v biases, experts.

use std::path::Path;

use serde_json::Value;

use crate::families::FamilyError;

/// The decoder families stagehand computes, by `model_type`.
pub const DECODER_FAMILIES: &[&str] = &["llama", "mistral", "qwen2", "mixtral"];

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderConfig {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub rms_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3Scaling>,
    pub tie_embeddings: bool,
    /// Qwen2 (and `attention_bias: true`): q, k and v projections carry biases.
    pub qkv_bias: bool,
    /// Mixtral: experts per layer and how many each token uses.
    pub experts: Option<Experts>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Experts {
    pub count: usize,
    pub top_k: usize,
}

/// Llama 3's `rope_scaling` (`rope_type: "llama3"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Llama3Scaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_positions: f64,
}

const MAX_DIMENSION: u64 = 1 << 20;

impl DecoderConfig {
    pub fn from_json(path: &Path, model_type: &str, config: &Value) -> Result<Self, FamilyError> {
        let bad = |key: &str, problem: String| {
            FamilyError::Model(format!("{}: `{key}` {problem}", path.display()))
        };
        let size = |key: &str| -> Result<usize, FamilyError> {
            let value = config
                .get(key)
                .ok_or_else(|| bad(key, "is missing".into()))?;
            match value.as_u64() {
                Some(number) if (1..=MAX_DIMENSION).contains(&number) => Ok(number as usize),
                _ => Err(bad(
                    key,
                    format!("is {value}; expected a whole number from 1 to {MAX_DIMENSION}"),
                )),
            }
        };
        let optional_size = |key: &str| match config.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => size(key).map(Some),
        };
        let float = |key: &str, default: f64| -> Result<f64, FamilyError> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(value) => value
                    .as_f64()
                    .filter(|number| number.is_finite() && *number > 0.0)
                    .ok_or_else(|| bad(key, format!("is {value}; expected a positive number"))),
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool, FamilyError> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(value) => value
                    .as_bool()
                    .ok_or_else(|| bad(key, format!("is {value}; expected true or false"))),
            }
        };
        let hidden = size("hidden_size")?;
        let heads = size("num_attention_heads")?;
        let kv_heads = optional_size("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads > heads || heads % kv_heads != 0 {
            return Err(bad(
                "num_key_value_heads",
                format!("is {kv_heads}, which does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = match optional_size("head_dim")? {
            Some(head_dim) => head_dim,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(bad(
                    "num_attention_heads",
                    format!("is {heads}, which does not divide hidden_size {hidden}"),
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(bad(
                "head_dim",
                format!("is {head_dim}; rotary embedding needs it even"),
            ));
        }
        let activation = config
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("silu");
        if activation != "silu" {
            return Err(bad(
                "hidden_act",
                format!("is \"{activation}\"; Llama-family decoders use \"silu\""),
            ));
        }
        let experts = if model_type == "mixtral" {
            let count = size("num_local_experts")?;
            let top_k = size("num_experts_per_tok")?;
            if top_k > count {
                return Err(bad(
                    "num_experts_per_tok",
                    format!("is {top_k}, more than the {count} experts"),
                ));
            }
            Some(Experts { count, top_k })
        } else {
            None
        };
        Ok(Self {
            hidden,
            layers: size("num_hidden_layers")?,
            heads,
            kv_heads,
            head_dim,
            intermediate: size("intermediate_size")?,
            vocab: size("vocab_size")?,
            max_positions: size("max_position_embeddings")?,
            rms_eps: float("rms_norm_eps", 1e-6)? as f32,
            rope_theta: float("rope_theta", 10_000.0)?,
            rope_scaling: rope_scaling(path, config)?,
            tie_embeddings: flag("tie_word_embeddings", false)?,
            qkv_bias: model_type == "qwen2" || flag("attention_bias", false)?,
            experts,
        })
    }

    /// The rotary frequencies of one head (`head_dim / 2` of them), with Llama 3's
    /// scaling applied when the config has it (as Hugging Face computes them).
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.head_dim as f64;
        (0..self.head_dim / 2)
            .map(|i| {
                let frequency = 1.0 / self.rope_theta.powf(2.0 * i as f64 / dim);
                let Some(scaling) = self.rope_scaling else {
                    return frequency as f32;
                };
                let wavelength = 2.0 * std::f64::consts::PI / frequency;
                let low_wavelength = scaling.original_max_positions / scaling.low_freq_factor;
                let high_wavelength = scaling.original_max_positions / scaling.high_freq_factor;
                let scaled = if wavelength < high_wavelength {
                    frequency
                } else if wavelength > low_wavelength {
                    frequency / scaling.factor
                } else {
                    let smooth = (scaling.original_max_positions / wavelength
                        - scaling.low_freq_factor)
                        / (scaling.high_freq_factor - scaling.low_freq_factor);
                    (1.0 - smooth) * frequency / scaling.factor + smooth * frequency
                };
                scaled as f32
            })
            .collect()
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }
}

fn rope_scaling(path: &Path, config: &Value) -> Result<Option<Llama3Scaling>, FamilyError> {
    let Some(scaling) = config.get("rope_scaling").filter(|value| !value.is_null()) else {
        return Ok(None);
    };
    let bad = |problem: String| {
        FamilyError::Model(format!("{}: `rope_scaling` {problem}", path.display()))
    };
    let kind = scaling
        .get("rope_type")
        .or_else(|| scaling.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("(none)");
    if kind != "llama3" {
        return Err(bad(format!(
            "has type \"{kind}\"; stagehand implements \"llama3\" scaling (or none)"
        )));
    }
    let number = |key: &str| {
        scaling
            .get(key)
            .and_then(Value::as_f64)
            .filter(|value| value.is_finite() && *value > 0.0)
            .ok_or_else(|| bad(format!("needs a positive `{key}`")))
    };
    let result = Llama3Scaling {
        factor: number("factor")?,
        low_freq_factor: number("low_freq_factor")?,
        high_freq_factor: number("high_freq_factor")?,
        original_max_positions: number("original_max_position_embeddings")?,
    };
    if result.high_freq_factor <= result.low_freq_factor {
        return Err(bad("needs high_freq_factor above low_freq_factor".into()));
    }
    Ok(Some(result))
}
