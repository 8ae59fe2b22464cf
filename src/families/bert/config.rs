//! A BERT-family `config.json`, read and checked.

use std::path::Path;

use serde_json::Value;

use crate::families::FamilyError;

/// The hyper-parameters a BERT encoder's forward pass needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertConfig {
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

impl BertConfig {
    pub fn from_json(path: &Path, config: &Value) -> Result<Self, FamilyError> {
        let bad = |key: &str, problem: String| {
            FamilyError::Model(format!("{}: `{key}` {problem}", path.display()))
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
        Ok(Self {
            hidden,
            layers: size("num_hidden_layers", MAX_LAYERS)?,
            heads,
            intermediate: size("intermediate_size", MAX_DIMENSION)?,
            max_positions: size("max_position_embeddings", MAX_DIMENSION)?,
            type_vocab: size("type_vocab_size", MAX_DIMENSION)?,
            vocab: size("vocab_size", 1 << 24)?,
            layer_norm_eps,
        })
    }

    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
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
}
