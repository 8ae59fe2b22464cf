//! Generated decoder folders: Llama (Llama-3.2-1B's shapes at `1b`), Mixtral (8
//! experts, top-2, shapes where the experts are most of the bytes), Qwen3 (per-head
//! q/k norms; Qwen3-0.6B's shapes at `1b`), Qwen3-MoE and Qwen2-MoE (with its shared
//! expert), with real `config.json` keys (transformers 4's layout, as the Hub ships
//! them) and tensor names, seeded weights (`tensors.rs`), and a byte-level
//! tokenizer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

mod shape;
mod tensors;

pub use shape::{DecoderShape, MoeShape};

use crate::compute::DType;
use crate::model::generated::{byte_level_tokenizer_json, chat_tokenizer_config_json};
use crate::model::generated::{write_atomically, write_checkpoint, TensorSpec};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DecoderArch {
    Llama,
    Mixtral,
    Qwen3,
    Qwen3Moe,
    Qwen2Moe,
}

impl DecoderArch {
    /// `config.json`'s `model_type` and `architectures`.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            DecoderArch::Llama => ("llama", "LlamaForCausalLM"),
            DecoderArch::Mixtral => ("mixtral", "MixtralForCausalLM"),
            DecoderArch::Qwen3 => ("qwen3", "Qwen3ForCausalLM"),
            DecoderArch::Qwen3Moe => ("qwen3_moe", "Qwen3MoeForCausalLM"),
            DecoderArch::Qwen2Moe => ("qwen2_moe", "Qwen2MoeForCausalLM"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DecoderPreset {
    /// A few MiB: for tests.
    Tiny,
    /// Tens of MiB: for benchmarks on a small machine.
    Small,
    /// Real shapes: Llama-3.2-1B's (hidden 2048, 16 layers, 32 query / 8 KV heads,
    /// MLP 8192, vocabulary 128256, tied embeddings) for Llama and Mixtral's layers;
    /// Qwen3-0.6B's for Qwen3. Not for the Qwen mixtures of experts.
    #[cfg_attr(feature = "cli", value(name = "1b"))]
    OneB,
}

/// A generated decoder's recipe: same recipe, same bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderDemo {
    pub arch: DecoderArch,
    pub preset: DecoderPreset,
    /// The weights' dtype; `F8E4M3` stores linear weights in FP8 with scales.
    pub dtype: DType,
    pub seed: u64,
    pub shard_bytes: u64,
}

impl DecoderDemo {
    /// The recipe's shape, or why there is none.
    pub fn shape(&self) -> std::io::Result<DecoderShape> {
        DecoderShape::of(self.arch, self.preset).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "--decoder-preset {:?} has no {:?} shape; use tiny or small",
                    self.preset, self.arch
                ),
            )
        })
    }

    fn config(&self, shape: &DecoderShape) -> serde_json::Value {
        let (model_type, architecture) = self.arch.names();
        let mut config = json!({
            "architectures": [architecture],
            "model_type": model_type,
            "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": shape.max_positions,
            "rms_norm_eps": if self.arch == DecoderArch::Llama || self.arch == DecoderArch::Mixtral { 1e-5 } else { 1e-6 },
            "rope_theta": shape.rope_theta,
            "tie_word_embeddings": shape.tied,
            "vocab_size": shape.vocab,
            "bos_token_id": 256,
            "eos_token_id": 257,
            "torch_dtype": match self.dtype {
                DType::F32 => "float32",
                DType::F16 => "float16",
                _ => "bfloat16",
            },
        });
        if shape.llama3_scaling {
            config["rope_scaling"] = json!({"rope_type": "llama3", "factor": 32.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192});
        }
        if !matches!(self.arch, DecoderArch::Llama | DecoderArch::Mixtral) {
            config["use_sliding_window"] = json!(false);
            config["sliding_window"] = json!(null);
            config["max_window_layers"] = json!(shape.layers);
        }
        if matches!(self.arch, DecoderArch::Qwen3 | DecoderArch::Qwen3Moe) {
            config["attention_bias"] = json!(false);
        }
        if let Some(moe) = &shape.experts {
            config["num_experts_per_tok"] = json!(moe.top_k);
            if self.arch == DecoderArch::Mixtral {
                config["num_local_experts"] = json!(moe.experts);
                return config;
            }
            config["num_experts"] = json!(moe.experts);
            config["moe_intermediate_size"] = json!(moe.intermediate);
            config["norm_topk_prob"] = json!(moe.norm_topk_prob);
            config["decoder_sparse_step"] = json!(1);
            config["mlp_only_layers"] = json!([]);
            if let Some(shared) = moe.shared_intermediate {
                config["shared_expert_intermediate_size"] = json!(shared);
            }
        }
        config
    }

    /// Bytes of the weights as stored.
    pub fn weight_bytes(&self) -> u64 {
        let Ok(shape) = self.shape() else {
            return 0;
        };
        self.tensors(&shape)
            .iter()
            .map(|tensor: &TensorSpec| {
                tensor.elements() * tensor.dtype.unwrap_or(self.dtype).size_bytes() as u64
            })
            .sum()
    }
}

/// Writes the decoder folder `dir` (created if missing) and returns it.
pub fn write_decoder_folder(dir: &Path, demo: &DecoderDemo) -> std::io::Result<PathBuf> {
    let shape = demo.shape()?;
    std::fs::create_dir_all(dir)?;
    let metadata = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        (
            "stagehand.generated".to_string(),
            format!("{:?} {:?} seed {}", demo.arch, demo.preset, demo.seed),
        ),
    ]);
    write_checkpoint(
        dir,
        &demo.tensors(&shape),
        demo.dtype,
        &metadata,
        demo.shard_bytes,
    )?;
    let json_file = |name: &str, value: serde_json::Value| {
        write_atomically(&dir.join(name), |file| {
            use std::io::Write;
            file.write_all(serde_json::to_string_pretty(&value)?.as_bytes())
        })
    };
    json_file("config.json", demo.config(&shape))?;
    json_file("tokenizer.json", byte_level_tokenizer_json())?;
    json_file("tokenizer_config.json", chat_tokenizer_config_json())?;
    Ok(dir.to_path_buf())
}
