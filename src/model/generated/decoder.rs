//! Generated decoder folders: Llama (Llama-3.2-1B's shapes at `1b`) and Mixtral
//! (8 experts, top-2, shapes where the experts are most of the bytes), with real
//! `config.json` keys and tensor names, seeded weights, and a byte-level tokenizer.
//! In `fp8`, every linear weight is stored as F8_E4M3 with an F32 `weight_scale`
//! (embeddings, norms, routers and `lm_head` stay bf16, as in real FP8 checkpoints).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::tokenizer::byte_level_tokenizer_json;
use super::writer::{write_atomically, write_checkpoint, TensorSpec, Values};
use crate::compute::DType;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DecoderArch {
    Llama,
    Mixtral,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum DecoderPreset {
    /// A few MiB: for tests.
    Tiny,
    /// Tens of MiB: for benchmarks on a small machine.
    Small,
    /// Llama-3.2-1B's shapes: hidden 2048, 16 layers, 32 query / 8 KV heads, MLP 8192,
    /// vocabulary 128256, tied embeddings (Llama only).
    #[cfg_attr(feature = "cli", value(name = "1b"))]
    OneB,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub tied: bool,
    pub experts: Option<(usize, usize)>,
    pub rope_theta: f64,
    pub llama3_scaling: bool,
}

impl DecoderShape {
    pub fn of(arch: DecoderArch, preset: DecoderPreset) -> Self {
        let experts = (arch == DecoderArch::Mixtral).then_some((8, 2));
        match preset {
            DecoderPreset::Tiny => Self {
                hidden: 128,
                layers: 4,
                heads: 4,
                kv_heads: 2,
                intermediate: if experts.is_some() { 256 } else { 344 },
                vocab: 512,
                tied: experts.is_none(),
                experts,
                rope_theta: 10_000.0,
                llama3_scaling: false,
            },
            DecoderPreset::Small => Self {
                hidden: 512,
                layers: 8,
                heads: 8,
                kv_heads: 4,
                intermediate: if experts.is_some() { 1024 } else { 1408 },
                vocab: 8192,
                tied: experts.is_none(),
                experts,
                rope_theta: 500_000.0,
                llama3_scaling: false,
            },
            DecoderPreset::OneB => Self {
                hidden: 2048,
                layers: 16,
                heads: 32,
                kv_heads: 8,
                intermediate: if experts.is_some() { 2048 } else { 8192 },
                vocab: 128_256,
                tied: experts.is_none(),
                experts,
                rope_theta: 500_000.0,
                llama3_scaling: true,
            },
        }
    }
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

/// Weights uniform with std 0.02, like Llama's initialisation.
const SPREAD: f32 = 0.02 * 1.732_050_8;

impl DecoderDemo {
    fn tensors(&self) -> Vec<TensorSpec> {
        let shape = DecoderShape::of(self.arch, self.preset);
        let head_dim = shape.hidden / shape.heads;
        let (q_dim, kv_dim) = (shape.heads * head_dim, shape.kv_heads * head_dim);
        let (hidden, inner) = (shape.hidden, shape.intermediate);
        let fp8 = matches!(self.dtype, DType::F8E4M3 | DType::F8E5M2);
        // Non-linear tensors of an FP8 checkpoint stay bf16.
        let plain = if fp8 { Some(DType::Bf16) } else { None };
        let mut tensors: Vec<TensorSpec> = Vec::new();
        let mut seed = self.seed;
        let mut next_seed = || {
            seed = seed.wrapping_add(0xA24B_AED4_963E_E407);
            seed
        };
        let other = |tensors: &mut Vec<TensorSpec>,
                     name: String,
                     dims: Vec<usize>,
                     center: f32,
                     spread: f32,
                     seed: u64| {
            let mut tensor = TensorSpec::uniform(name, dims, seed, center, spread);
            tensor.dtype = plain;
            tensors.push(tensor);
        };
        let linear = |tensors: &mut Vec<TensorSpec>, name: String, dims: Vec<usize>, seed: u64| {
            if !fp8 {
                tensors.push(TensorSpec::uniform(name, dims, seed, 0.0, SPREAD));
                return;
            }
            // Stored values span the format; the scale brings them back to ±SPREAD.
            let max = 448.0;
            let stem = name.trim_end_matches(".weight").to_string();
            tensors.push(TensorSpec::uniform(name, dims, seed, 0.0, max));
            tensors.push(TensorSpec {
                name: format!("{stem}.weight_scale"),
                shape: vec![],
                values: Values::Constant(SPREAD / max),
                dtype: Some(DType::F32),
            });
        };
        other(
            &mut tensors,
            "model.embed_tokens.weight".into(),
            vec![shape.vocab, hidden],
            0.0,
            SPREAD,
            next_seed(),
        );
        for layer in 0..shape.layers {
            let at = format!("model.layers.{layer}");
            other(
                &mut tensors,
                format!("{at}.input_layernorm.weight"),
                vec![hidden],
                1.0,
                0.05,
                next_seed(),
            );
            linear(
                &mut tensors,
                format!("{at}.self_attn.q_proj.weight"),
                vec![q_dim, hidden],
                next_seed(),
            );
            linear(
                &mut tensors,
                format!("{at}.self_attn.k_proj.weight"),
                vec![kv_dim, hidden],
                next_seed(),
            );
            linear(
                &mut tensors,
                format!("{at}.self_attn.v_proj.weight"),
                vec![kv_dim, hidden],
                next_seed(),
            );
            linear(
                &mut tensors,
                format!("{at}.self_attn.o_proj.weight"),
                vec![hidden, q_dim],
                next_seed(),
            );
            other(
                &mut tensors,
                format!("{at}.post_attention_layernorm.weight"),
                vec![hidden],
                1.0,
                0.05,
                next_seed(),
            );
            match shape.experts {
                None => {
                    linear(
                        &mut tensors,
                        format!("{at}.mlp.gate_proj.weight"),
                        vec![inner, hidden],
                        next_seed(),
                    );
                    linear(
                        &mut tensors,
                        format!("{at}.mlp.up_proj.weight"),
                        vec![inner, hidden],
                        next_seed(),
                    );
                    linear(
                        &mut tensors,
                        format!("{at}.mlp.down_proj.weight"),
                        vec![hidden, inner],
                        next_seed(),
                    );
                }
                Some((experts, _)) => {
                    // A router with real preferences: skewed so a few experts lead.
                    other(
                        &mut tensors,
                        format!("{at}.block_sparse_moe.gate.weight"),
                        vec![experts, hidden],
                        0.0,
                        0.5,
                        next_seed(),
                    );
                    for expert in 0..experts {
                        let moe = format!("{at}.block_sparse_moe.experts.{expert}");
                        linear(
                            &mut tensors,
                            format!("{moe}.w1.weight"),
                            vec![inner, hidden],
                            next_seed(),
                        );
                        linear(
                            &mut tensors,
                            format!("{moe}.w2.weight"),
                            vec![hidden, inner],
                            next_seed(),
                        );
                        linear(
                            &mut tensors,
                            format!("{moe}.w3.weight"),
                            vec![inner, hidden],
                            next_seed(),
                        );
                    }
                }
            }
        }
        other(
            &mut tensors,
            "model.norm.weight".into(),
            vec![hidden],
            1.0,
            0.05,
            next_seed(),
        );
        if !shape.tied {
            other(
                &mut tensors,
                "lm_head.weight".into(),
                vec![shape.vocab, hidden],
                0.0,
                SPREAD,
                next_seed(),
            );
        }
        tensors
    }

    fn config(&self) -> serde_json::Value {
        let shape = DecoderShape::of(self.arch, self.preset);
        let mut config = json!({
            "architectures": [match self.arch {
                DecoderArch::Llama => "LlamaForCausalLM",
                DecoderArch::Mixtral => "MixtralForCausalLM",
            }],
            "model_type": match self.arch {
                DecoderArch::Llama => "llama",
                DecoderArch::Mixtral => "mixtral",
            },
            "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate,
            "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads,
            "num_key_value_heads": shape.kv_heads,
            "head_dim": shape.hidden / shape.heads,
            "hidden_act": "silu",
            "max_position_embeddings": if shape.llama3_scaling { 131_072 } else { 8192 },
            "rms_norm_eps": 1e-5,
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
        if let Some((experts, top_k)) = shape.experts {
            config["num_local_experts"] = json!(experts);
            config["num_experts_per_tok"] = json!(top_k);
        }
        if matches!(self.dtype, DType::F8E4M3 | DType::F8E5M2) {
            config["quantization_config"] = json!({"quant_method": "fp8",
                "activation_scheme": "dynamic", "fmt": "e4m3"});
        }
        config
    }

    /// Bytes of the weights as stored.
    pub fn weight_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|tensor| {
                tensor.elements() * tensor.dtype.unwrap_or(self.dtype).size_bytes() as u64
            })
            .sum()
    }
}

/// Writes the decoder folder `dir` (created if missing) and returns it.
pub fn write_decoder_folder(dir: &Path, demo: &DecoderDemo) -> std::io::Result<PathBuf> {
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
        &demo.tensors(),
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
    json_file("config.json", demo.config())?;
    json_file("tokenizer.json", byte_level_tokenizer_json())?;
    Ok(dir.to_path_buf())
}
