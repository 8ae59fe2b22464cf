//! Reading a decoder's `config.json`: typed values whose errors name the key and its
//! value, and the keys that do not change the computation, listed with the reason.
//!
//! Every key a decoder family reads is implemented or refused by name
//! (`config.rs`, `rope.rs`, `window.rs`); [`NO_MATH`] lists the keys transformers
//! writes that change nothing stagehand computes. Any other key is one the family's
//! transformers class does not read either: it is named in a warning, never used.

use std::path::Path;

use serde_json::Value;

use crate::families::FamilyError;

/// Keys that do not change what a decoder computes, and why.
pub const NO_MATH: &[(&str, &str)] = &[
    (
        "architectures",
        "names the class; model_type picks the family",
    ),
    ("model_type", "picks the family"),
    ("transformers_version", "the writer's version"),
    ("_name_or_path", "where the writer loaded it from"),
    ("bos_token_id", "tokenizer ids: the prompt is given"),
    (
        "eos_token_id",
        "tokenizer ids: --max-tokens ends generation",
    ),
    (
        "pad_token_id",
        "only pads batches of prompts; one prompt runs unpadded",
    ),
    ("use_cache", "stagehand always decodes over its KV cache"),
    ("initializer_range", "random initialisation, training only"),
    ("attention_dropout", "dropout is off at inference"),
    ("output_router_logits", "training-time auxiliary loss"),
    ("router_aux_loss_coef", "training-time auxiliary loss"),
    ("router_jitter_noise", "applied in training only"),
    (
        "pretraining_tp",
        "tensor-parallel slicing of the same products in training",
    ),
    (
        "dtype",
        "checked; weights are read in their stored dtype and computed in f32",
    ),
    (
        "torch_dtype",
        "transformers 4's name of dtype: checked the same way",
    ),
    ("tokenizer_class", "tokenization comes from tokenizer.json"),
    ("id2label", "classification heads are not computed"),
    ("label2id", "classification heads are not computed"),
    ("return_dict", "transformers' output container"),
    ("output_attentions", "transformers' optional outputs"),
    ("output_hidden_states", "transformers' optional outputs"),
    (
        "_attn_implementation",
        "which attention kernel: the same math",
    ),
    (
        "attn_implementation",
        "which attention kernel: the same math",
    ),
];

/// A `config.json`'s values, read with errors that name the key and its value.
pub struct Keys<'a> {
    pub path: &'a Path,
    pub config: &'a Value,
}

/// The largest size any dimension may have (a sanity bound, not a model limit).
pub const MAX_DIMENSION: u64 = 1 << 20;

impl<'a> Keys<'a> {
    pub fn new(path: &'a Path, config: &'a Value) -> Self {
        Self { path, config }
    }

    /// An error about key `key`: "`key` problem".
    pub fn bad(&self, key: &str, problem: impl std::fmt::Display) -> FamilyError {
        let message = format!("{}: `{key}` {problem}", self.path.display());
        FamilyError::config(self.path, Some(key), message)
    }

    /// Key `key` asks for `found`, which no family computes: "`key` problem".
    pub fn unsupported(
        &self,
        key: &str,
        found: impl Into<String>,
        problem: impl std::fmt::Display,
    ) -> FamilyError {
        FamilyError::Unsupported {
            path: self.path.to_path_buf(),
            found: found.into(),
            message: format!("{}: `{key}` {problem}", self.path.display()),
        }
    }

    /// The key's value; `None` when it is missing or null (transformers' "unset").
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.config.get(key).filter(|value| !value.is_null())
    }

    pub fn size(&self, key: &str) -> Result<usize, FamilyError> {
        let value = self.get(key).ok_or_else(|| self.bad(key, "is missing"))?;
        self.size_of(key, value)
    }

    pub fn optional_size(&self, key: &str) -> Result<Option<usize>, FamilyError> {
        self.get(key)
            .map(|value| self.size_of(key, value))
            .transpose()
    }

    fn size_of(&self, key: &str, value: &Value) -> Result<usize, FamilyError> {
        match value.as_u64() {
            Some(number) if (1..=MAX_DIMENSION).contains(&number) => Ok(number as usize),
            _ => Err(self.bad(
                key,
                format!("is {value}; expected a whole number from 1 to {MAX_DIMENSION}"),
            )),
        }
    }

    /// A positive, finite number (`default` when unset).
    pub fn positive(&self, key: &str, default: f64) -> Result<f64, FamilyError> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => positive_number(value)
                .ok_or_else(|| self.bad(key, format!("is {value}; expected a positive number"))),
        }
    }

    pub fn flag(&self, key: &str, default: bool) -> Result<bool, FamilyError> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => value
                .as_bool()
                .ok_or_else(|| self.bad(key, format!("is {value}; expected true or false"))),
        }
    }

    pub fn text(&self, key: &str) -> Result<Option<&'a str>, FamilyError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => value
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(key, format!("is {value}; expected a string"))),
        }
    }

    /// A list of layer numbers, each below `layers` (`mlp_only_layers`).
    pub fn layer_list(&self, key: &str, layers: usize) -> Result<Vec<usize>, FamilyError> {
        let Some(value) = self.get(key) else {
            return Ok(Vec::new());
        };
        let list = value
            .as_array()
            .ok_or_else(|| self.bad(key, format!("is {value}; expected a list of layers")))?;
        list.iter()
            .map(|item| match item.as_u64() {
                Some(layer) if (layer as usize) < layers => Ok(layer as usize),
                _ => Err(self.bad(
                    key,
                    format!(
                        "is {value}; every entry must be a layer from 0 to {}",
                        layers - 1
                    ),
                )),
            })
            .collect()
    }

    /// Keys of the config that are neither in `read` nor in [`NO_MATH`], sorted.
    pub fn unread(&self, read: &[&str]) -> Vec<String> {
        let Some(object) = self.config.as_object() else {
            return Vec::new();
        };
        let known = |key: &str| read.contains(&key) || NO_MATH.iter().any(|(no, _)| *no == key);
        let mut unread: Vec<String> = object.keys().filter(|key| !known(key)).cloned().collect();
        unread.sort();
        unread
    }
}

/// A positive, finite number.
pub fn positive_number(value: &Value) -> Option<f64> {
    value
        .as_f64()
        .filter(|number| number.is_finite() && *number > 0.0)
}

/// The dtypes `dtype` / `torch_dtype` may name: weights of these are computed in f32.
const DTYPES: &[&str] = &["float32", "float16", "bfloat16"];

/// `dtype` (transformers 5) and `torch_dtype` (4): known, and the same when both are
/// given. Neither changes stagehand's computation (see [`NO_MATH`]).
pub fn check_dtype(keys: &Keys<'_>) -> Result<(), FamilyError> {
    let dtype = keys.text("dtype")?;
    let torch_dtype = keys.text("torch_dtype")?;
    for (key, value) in [("dtype", dtype), ("torch_dtype", torch_dtype)] {
        if let Some(value) = value.filter(|value| !DTYPES.contains(value)) {
            return Err(keys.bad(
                key,
                format!(
                    "is \"{value}\"; stagehand computes checkpoints of {}",
                    DTYPES.join(", ")
                ),
            ));
        }
    }
    if let (Some(dtype), Some(torch_dtype)) = (dtype, torch_dtype) {
        if dtype != torch_dtype {
            return Err(keys.bad(
                "dtype",
                format!("is \"{dtype}\" but `torch_dtype` is \"{torch_dtype}\"; give one"),
            ));
        }
    }
    Ok(())
}

/// `quantization_config`: a quantizer's format, none of which stagehand implements.
/// (FP8 weights with a per-tensor `weight_scale` need no config: the tensors say.)
pub fn check_quantization(keys: &Keys<'_>) -> Result<(), FamilyError> {
    let Some(quantization) = keys.get("quantization_config") else {
        return Ok(());
    };
    let method = quantization
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("(none)");
    if method == "fp8" {
        if let Some(block) = quantization
            .get("weight_block_size")
            .filter(|value| !value.is_null())
        {
            return Err(keys.unsupported(
                "quantization_config.weight_block_size",
                "block-wise FP8",
                format!(
                    "is {block}: block-wise FP8 (`weight_scale_inv` per {block} tile) is not implemented; stagehand computes FP8 weights with one per-tensor `weight_scale`"
                ),
            ));
        }
    }
    Err(keys.unsupported(
        "quantization_config.quant_method",
        method,
        format!(
            "is \"{method}\": stagehand does not implement this quantization; it computes F32, F16 and BF16 weights, and FP8 ones with a per-tensor `weight_scale` tensor (no quantization_config)"
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_keys_leave_out_what_is_read_and_what_changes_nothing() {
        // Proves the warning lists exactly the keys no list accounts for.
        let config = serde_json::json!({"hidden_size": 8, "bos_token_id": 1, "logit_scale": 2});
        let keys = Keys::new(Path::new("config.json"), &config);
        assert_eq!(keys.unread(&["hidden_size"]), vec!["logit_scale"]);
    }
}
