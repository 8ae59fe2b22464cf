//! A BERT-family `config.json`, read and checked: BERT, and RoBERTa / XLM-RoBERTa (the
//! same encoder with positions counted from `pad_token_id + 1`, as e5, bge and gte
//! embedders of that kind have them).

use std::path::Path;

use serde_json::Value;

use crate::families::FamilyError;

/// Which encoder of the family a folder holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// `bert`: positions 0, 1, … for every token.
    Bert,
    /// `roberta`, `xlm-roberta`: a real token at index i has position
    /// `padding_idx + 1 + i` (counting real tokens only) and padding has `padding_idx`,
    /// as transformers' `create_position_ids_from_input_ids` computes them.
    Roberta { padding_idx: u32 },
}

impl Variant {
    pub fn describe(self) -> &'static str {
        match self {
            Variant::Bert => "bert encoder",
            Variant::Roberta { .. } => "roberta encoder",
        }
    }

    /// Tensor-name prefixes of the task checkpoints (`BertForMaskedLM`, …), besides none.
    pub fn prefix(self) -> &'static str {
        match self {
            Variant::Bert => "bert.",
            Variant::Roberta { .. } => "roberta.",
        }
    }
}

/// The hyper-parameters a BERT encoder's forward pass needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertConfig {
    pub variant: Variant,
    /// The id batches are padded with.
    pub pad_token_id: u32,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub max_positions: usize,
    pub type_vocab: usize,
    pub vocab: usize,
    pub layer_norm_eps: f32,
}

/// Sizes past these are not a BERT anyone trained; they guard the arithmetic.
const MAX_DIMENSION: u64 = 1 << 20;
const MAX_LAYERS: u64 = 4096;

/// Which variant `config` is (by `model_type`, else the first architecture) and the id
/// its batches are padded with (`pad_token_id`; RoBERTa's positions start past it).
fn variant(
    config: &Value,
    bad: &dyn Fn(&str, String) -> FamilyError,
) -> Result<(Variant, u32), FamilyError> {
    let model_type = config.get("model_type").and_then(Value::as_str);
    let roberta = matches!(model_type, Some("roberta" | "xlm-roberta"))
        || config
            .get("architectures")
            .and_then(|names| names.get(0))
            .and_then(Value::as_str)
            .is_some_and(|name| name.starts_with("Roberta") || name.starts_with("XLMRoberta"));
    let pad_token_id = match config.get("pad_token_id") {
        None | Some(Value::Null) => u32::from(roberta),
        Some(value) => value
            .as_u64()
            .filter(|&id| id < 1 << 24)
            .ok_or_else(|| bad("pad_token_id", format!("is {value}; expected a token id")))?
            as u32,
    };
    let variant = if roberta {
        Variant::Roberta {
            padding_idx: pad_token_id,
        }
    } else {
        Variant::Bert
    };
    Ok((variant, pad_token_id))
}

impl BertConfig {
    pub fn from_json(path: &Path, config: &Value) -> Result<Self, FamilyError> {
        let bad = |key: &str, problem: String| {
            FamilyError::config(
                path,
                Some(key),
                format!("{}: `{key}` {problem}", path.display()),
            )
        };
        let size = |key: &str, limit: u64| -> Result<usize, FamilyError> {
            let value = config
                .get(key)
                .ok_or_else(|| bad(key, "is missing".to_string()))?;
            match value.as_u64() {
                Some(number) if number >= 1 && number <= limit => Ok(number as usize),
                _ => Err(bad(
                    key,
                    format!("is {value}; expected a whole number from 1 to {limit}"),
                )),
            }
        };
        let (variant, pad_token_id) = variant(config, &bad)?;
        let hidden = size("hidden_size", MAX_DIMENSION)?;
        let heads = size("num_attention_heads", MAX_DIMENSION)?;
        if hidden % heads != 0 {
            return Err(bad(
                "num_attention_heads",
                format!("is {heads}, which does not divide hidden_size {hidden}"),
            ));
        }
        let activation = config
            .get("hidden_act")
            .and_then(Value::as_str)
            .unwrap_or("gelu");
        if activation != "gelu" {
            return Err(bad(
                "hidden_act",
                format!("is \"{activation}\"; stagehand's encoders implement \"gelu\" (exact erf)"),
            ));
        }
        let positions = config
            .get("position_embedding_type")
            .and_then(Value::as_str)
            .unwrap_or("absolute");
        if positions != "absolute" {
            return Err(bad(
                "position_embedding_type",
                format!("is \"{positions}\"; stagehand's encoders implement \"absolute\""),
            ));
        }
        // A causal or cross-attending BERT/RoBERTa is a decoder; its mask is not the
        // padding mask an embedder computes under.
        for key in ["is_decoder", "add_cross_attention"] {
            if config.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(bad(
                    key,
                    "is true: stagehand runs these models as bidirectional encoders (sentence embeddings); use the checkpoint's encoder configuration".to_string(),
                ));
            }
        }
        let layer_norm_eps = match config.get("layer_norm_eps") {
            None => 1e-12,
            Some(value) => value
                .as_f64()
                .filter(|eps| eps.is_finite() && *eps >= 0.0)
                .ok_or_else(|| {
                    bad(
                        "layer_norm_eps",
                        format!("is {value}; expected a small positive number"),
                    )
                })? as f32,
        };
        let max_positions = size("max_position_embeddings", MAX_DIMENSION)?;
        if let Variant::Roberta { padding_idx } = variant {
            if padding_idx as usize + 1 >= max_positions {
                return Err(bad(
                    "pad_token_id",
                    format!("is {padding_idx}: a RoBERTa's positions start after it, and max_position_embeddings is only {max_positions}"),
                ));
            }
        }
        Ok(Self {
            variant,
            pad_token_id,
            hidden,
            layers: size("num_hidden_layers", MAX_LAYERS)?,
            heads,
            intermediate: size("intermediate_size", MAX_DIMENSION)?,
            max_positions,
            type_vocab: size("type_vocab_size", MAX_DIMENSION)?,
            vocab: size("vocab_size", 1 << 24)?,
            layer_norm_eps,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Tokens a sequence may have: the position table's rows, less those a RoBERTa
    /// skips (`padding_idx + 1`).
    pub fn usable_positions(&self) -> usize {
        match self.variant {
            Variant::Bert => self.max_positions,
            Variant::Roberta { padding_idx } => self.max_positions - padding_idx as usize - 1,
        }
    }

    /// The position id of every token of a padded batch (`ids`: `sequences × length`).
    pub fn position_ids(&self, ids: &[u32], length: usize) -> Vec<u32> {
        match self.variant {
            Variant::Bert => (0..ids.len())
                .map(|row| (row % length.max(1)) as u32)
                .collect(),
            Variant::Roberta { padding_idx } => {
                let mut positions = Vec::with_capacity(ids.len());
                for sequence in ids.chunks(length.max(1)) {
                    let mut real = 0;
                    for &id in sequence {
                        if id == padding_idx {
                            positions.push(padding_idx);
                        } else {
                            real += 1;
                            positions.push(padding_idx + real);
                        }
                    }
                }
                positions
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minilm() -> Value {
        serde_json::json!({
            "hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12,
            "intermediate_size": 1536, "max_position_embeddings": 512,
            "type_vocab_size": 2, "vocab_size": 30522, "layer_norm_eps": 1e-12,
            "hidden_act": "gelu", "model_type": "bert"
        })
    }

    #[test]
    fn a_real_config_reads_and_a_bad_one_names_its_key() {
        // Proves MiniLM's config reads, and each kind of bad value names the key.
        let path = Path::new("config.json");
        let config = BertConfig::from_json(path, &minilm()).unwrap();
        assert_eq!(
            (config.hidden, config.head_dim(), config.layers),
            (384, 32, 6)
        );
        for (key, value, needle) in [
            (
                "num_attention_heads",
                serde_json::json!(5),
                "does not divide",
            ),
            ("hidden_size", serde_json::json!("big"), "hidden_size"),
            ("hidden_act", serde_json::json!("relu"), "hidden_act"),
            ("layer_norm_eps", serde_json::json!(-1.0), "layer_norm_eps"),
            ("is_decoder", serde_json::json!(true), "is_decoder"),
            (
                "add_cross_attention",
                serde_json::json!(true),
                "add_cross_attention",
            ),
        ] {
            let mut json = minilm();
            json[key] = value;
            let message = BertConfig::from_json(path, &json).unwrap_err().to_string();
            assert!(message.contains(needle), "{key}: {message}");
        }
        let mut json = minilm();
        json.as_object_mut().unwrap().remove("vocab_size");
        let message = BertConfig::from_json(path, &json).unwrap_err().to_string();
        assert!(message.contains("`vocab_size` is missing"), "{message}");
    }

    #[test]
    fn roberta_counts_positions_past_its_padding_id() {
        // Proves a RoBERTa config gives positions padding_idx + 1 + i for real tokens and
        // padding_idx for padding, and takes padding_idx + 1 fewer tokens than its table.
        let mut json = minilm();
        json["model_type"] = "xlm-roberta".into();
        json["pad_token_id"] = 1.into();
        json["max_position_embeddings"] = 514.into();
        let config = BertConfig::from_json(Path::new("config.json"), &json).unwrap();
        assert_eq!(config.variant, Variant::Roberta { padding_idx: 1 });
        assert_eq!(config.usable_positions(), 512);
        // Two sequences of 4: [0, 7, 2, pad], [0, 2, pad, pad].
        assert_eq!(
            config.position_ids(&[0, 7, 2, 1, 0, 2, 1, 1], 4),
            [2, 3, 4, 1, 2, 3, 1, 1]
        );
        let bert = BertConfig::from_json(Path::new("config.json"), &minilm()).unwrap();
        assert_eq!(
            bert.position_ids(&[5, 6, 0, 7, 0, 0], 3),
            [0, 1, 2, 0, 1, 2]
        );
        json["pad_token_id"] = 513.into();
        let message = BertConfig::from_json(Path::new("config.json"), &json)
            .unwrap_err()
            .to_string();
        assert!(message.contains("pad_token_id"), "{message}");
    }
}
