//! Generated umT5 encoders with umT5's structure and seeded weights, as transformers
//! lays out `UMT5EncoderModel` (`text_encoder/config.json` and `model.safetensors`;
//! no model hub is reachable offline): a tiny one for tests and umT5-XXL's real shape
//! (WAN's text encoder) for real-shape runs and `simulate`. No tokenizer is written
//! (umT5's is a 256 k-piece SentencePiece model): a run gives token ids, and
//! `simulate` describes a step from the headers.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::T5Config;
use crate::compute::DType;
use crate::model::generated::{write_model_folder, TensorSpec};

/// Which shape `demo-model --arch umt5` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum Umt5Preset {
    /// 2 blocks of width 32 (4 heads of 8), FFN 64, 384 tokens.
    Tiny,
    /// umT5-XXL's encoder (google/umt5-xxl, Wan 2.2's text encoder): 24 blocks of
    /// width 4096 (64 heads of 64), FFN 10 240, 256 384 tokens, a position bias per
    /// block: 5.68 B parameters (10.6 GiB in BF16).
    Xxl,
}

impl Umt5Preset {
    /// The preset's sizes.
    pub fn config(self) -> T5Config {
        let tiny = T5Config {
            vocab: 384,
            model: 32,
            head_dim: 8,
            feed_forward: 64,
            layers: 2,
            heads: 4,
            buckets: 32,
            max_distance: 128,
            eps: 1e-6,
            bias_per_layer: true,
        };
        match self {
            Umt5Preset::Tiny => tiny,
            Umt5Preset::Xxl => T5Config {
                vocab: 256_384,
                model: 4096,
                head_dim: 64,
                feed_forward: 10_240,
                layers: 24,
                heads: 64,
                ..tiny
            },
        }
    }
}

/// A generated umT5 encoder to write.
#[derive(Debug, Clone, Copy)]
pub struct Umt5Demo {
    pub preset: Umt5Preset,
    /// F32, F16 or BF16.
    pub dtype: DType,
    pub seed: u64,
}

impl Umt5Demo {
    /// The tensors in transformers' names, each from its own seed.
    fn tensors(&self) -> Vec<TensorSpec> {
        let config = self.preset.config();
        let (model, inner) = (config.model, config.heads * config.head_dim);
        let mut seed = self.seed;
        let mut list = Vec::new();
        let mut push = |name: String, shape: Vec<usize>, center: f32, spread: f32| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            list.push(TensorSpec::uniform(name, shape, seed, center, spread));
        };
        push("shared.weight".into(), vec![config.vocab, model], 0.0, 1.0);
        for block in 0..config.layers {
            let attention = format!("encoder.block.{block}.layer.0");
            for projection in ["q", "k", "v"] {
                let spread = 1.0 / (model as f32).sqrt();
                let name = format!("{attention}.SelfAttention.{projection}.weight");
                push(name, vec![inner, model], 0.0, spread);
            }
            let name = format!("{attention}.SelfAttention.o.weight");
            push(name, vec![model, inner], 0.0, 1.0 / (inner as f32).sqrt());
            let name = format!("{attention}.SelfAttention.relative_attention_bias.weight");
            push(name, vec![config.buckets, config.heads], 0.0, 0.5);
            push(
                format!("{attention}.layer_norm.weight"),
                vec![model],
                1.0,
                0.1,
            );
            let dense = format!("encoder.block.{block}.layer.1");
            for gate in ["wi_0", "wi_1"] {
                let name = format!("{dense}.DenseReluDense.{gate}.weight");
                let spread = 1.0 / (model as f32).sqrt();
                push(name, vec![config.feed_forward, model], 0.0, spread);
            }
            let spread = 1.0 / (config.feed_forward as f32).sqrt();
            let name = format!("{dense}.DenseReluDense.wo.weight");
            push(name, vec![model, config.feed_forward], 0.0, spread);
            push(format!("{dense}.layer_norm.weight"), vec![model], 1.0, 0.1);
        }
        push(
            "encoder.final_layer_norm.weight".into(),
            vec![model],
            1.0,
            0.1,
        );
        list
    }

    /// Bytes of the weights written.
    pub fn weight_bytes(&self) -> u64 {
        let tensors = self.tensors();
        tensors.iter().map(|tensor| tensor.bytes(self.dtype)).sum()
    }

    /// transformers' `config.json` of the preset (`UMT5EncoderModel`).
    pub fn config_json(&self) -> serde_json::Value {
        let config = self.preset.config();
        json!({
            "architectures": ["UMT5EncoderModel"],
            "model_type": "umt5",
            "d_model": config.model,
            "d_kv": config.head_dim,
            "d_ff": config.feed_forward,
            "num_layers": config.layers,
            "num_heads": config.heads,
            "vocab_size": config.vocab,
            "relative_attention_num_buckets": config.buckets,
            "relative_attention_max_distance": config.max_distance,
            "layer_norm_epsilon": config.eps,
            "feed_forward_proj": "gated-gelu",
            "dense_act_fn": "gelu_new",
            "is_gated_act": true,
            "is_encoder_decoder": true,
            "tie_word_embeddings": false,
            "pad_token_id": 0,
            "eos_token_id": 1,
        })
    }

    /// Writes `text_encoder/` with `config.json` and `model.safetensors` under `dir`;
    /// returns what `--model` takes.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        write_model_folder(
            &dir.join("text_encoder"),
            &self.config_json(),
            ("model.safetensors", &self.tensors()),
            (self.dtype, "umT5"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelIndex;

    #[test]
    fn umt5_xxl_has_its_published_shape_and_the_tiny_one_reads_back() {
        // Proves the XXL preset's config reads back as umT5-XXL's sizes with its
        // parameter count (5 680 910 336: embeddings, 24 blocks with a position bias
        // each, the final norm), and that the tiny preset's file, written, gives the
        // family the same config from its shapes as from its config.json.
        let demo = |preset| Umt5Demo {
            preset,
            dtype: DType::Bf16,
            seed: 1,
        };
        let xxl = demo(Umt5Preset::Xxl);
        let read =
            T5Config::from_json(Path::new("config.json"), &xxl.config_json()).expect("reads");
        assert_eq!(read, Umt5Preset::Xxl.config());
        assert_eq!(
            (
                read.model,
                read.layers,
                read.heads,
                read.head_dim,
                read.feed_forward,
                read.vocab
            ),
            (4096, 24, 64, 64, 10_240, 256_384)
        );
        assert_eq!(xxl.weight_bytes() / 2, 5_680_910_336);
        let dir = tempfile::tempdir().expect("a temporary folder");
        let tiny = demo(Umt5Preset::Tiny);
        let folder = tiny.write(dir.path()).expect("writes");
        let index = ModelIndex::open(&folder.join("model.safetensors"), None).expect("indexes");
        assert_eq!(
            T5Config::infer(&index).expect("infers"),
            Umt5Preset::Tiny.config()
        );
        let json: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(folder.join("config.json")).expect("config"),
        )
        .expect("JSON");
        let from_json = T5Config::from_json(&folder.join("config.json"), &json).expect("reads");
        assert_eq!(from_json, Umt5Preset::Tiny.config());
    }
}
