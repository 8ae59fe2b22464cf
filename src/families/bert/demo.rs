//! Generated BERT folders: real `config.json` keys, real tensor names and shapes,
//! seeded weights (BERT's initialisation scale, std 0.02), a WordPiece tokenizer and a
//! sentence-transformers head (mean pooling, normalised), in f32, f16 or bf16.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::compute::DType;
use crate::model::generated::tokenizer_json;
use crate::model::generated::{write_atomically, write_checkpoint, write_single, TensorSpec};

/// Shapes of a generated encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum BertPreset {
    /// 4 layers of 128: a few MiB, for tests.
    Tiny,
    /// BERT-base: 12 layers of 768, 12 heads, MLP 3072, vocabulary 30522 (110 M weights).
    Base,
    /// BERT-large: 24 layers of 1024, 16 heads, MLP 4096, vocabulary 30522 (335 M weights).
    Large,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BertShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
}

impl BertPreset {
    pub fn shape(self) -> BertShape {
        match self {
            BertPreset::Tiny => BertShape {
                hidden: 128,
                layers: 4,
                heads: 4,
                intermediate: 512,
                vocab: 1024,
                max_positions: 512,
            },
            BertPreset::Base => BertShape {
                hidden: 768,
                layers: 12,
                heads: 12,
                intermediate: 3072,
                vocab: 30522,
                max_positions: 512,
            },
            BertPreset::Large => BertShape {
                hidden: 1024,
                layers: 24,
                heads: 16,
                intermediate: 4096,
                vocab: 30522,
                max_positions: 512,
            },
        }
    }
}

/// A generated encoder folder's recipe: same recipe, same bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BertDemo {
    pub preset: BertPreset,
    pub dtype: DType,
    pub seed: u64,
    /// Shards hold at most this many bytes (the index is written when there are more).
    pub shard_bytes: u64,
    /// A RoBERTa instead (`model_type: roberta`): positions from `pad_token_id` 1 + 1
    /// (two more position rows), one token type, RoBERTa's vocabulary size for the
    /// base and large presets (50265).
    pub roberta: bool,
}

impl Default for BertDemo {
    fn default() -> Self {
        Self {
            preset: BertPreset::Tiny,
            dtype: DType::F32,
            seed: 0x0042_4552,
            shard_bytes: 1 << 30,
            roberta: false,
        }
    }
}

/// BERT's initialisation: weights with standard deviation 0.02 (uniform of the same
/// deviation), LayerNorm weights near 1, biases near 0.
const WEIGHT_SPREAD: f32 = 0.02 * 1.732_050_8;

impl BertDemo {
    /// The preset's shape, with RoBERTa's vocabulary and position rows when it is one.
    pub fn shape(&self) -> BertShape {
        let shape = self.preset.shape();
        if !self.roberta {
            return shape;
        }
        BertShape {
            vocab: if self.preset == BertPreset::Tiny {
                shape.vocab
            } else {
                50265
            },
            max_positions: shape.max_positions + 2,
            ..shape
        }
    }

    fn tensors(&self) -> Vec<TensorSpec> {
        let shape = self.shape();
        let (hidden, inner) = (shape.hidden, shape.intermediate);
        let mut tensors = Vec::new();
        let mut add = |name: String, dims: Vec<usize>, center: f32, spread: f32| {
            let seed = self.seed ^ (tensors.len() as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407);
            tensors.push(TensorSpec::uniform(name, dims, seed, center, spread));
        };
        add(
            "embeddings.word_embeddings.weight".into(),
            vec![shape.vocab, hidden],
            0.0,
            WEIGHT_SPREAD,
        );
        add(
            "embeddings.position_embeddings.weight".into(),
            vec![shape.max_positions, hidden],
            0.0,
            WEIGHT_SPREAD,
        );
        add(
            "embeddings.token_type_embeddings.weight".into(),
            vec![if self.roberta { 1 } else { 2 }, hidden],
            0.0,
            WEIGHT_SPREAD,
        );
        add(
            "embeddings.LayerNorm.weight".into(),
            vec![hidden],
            1.0,
            0.05,
        );
        add("embeddings.LayerNorm.bias".into(), vec![hidden], 0.0, 0.02);
        for layer in 0..shape.layers {
            let at = format!("encoder.layer.{layer}");
            for (name, out, input) in [
                ("attention.self.query", hidden, hidden),
                ("attention.self.key", hidden, hidden),
                ("attention.self.value", hidden, hidden),
                ("attention.output.dense", hidden, hidden),
                ("intermediate.dense", inner, hidden),
                ("output.dense", hidden, inner),
            ] {
                add(
                    format!("{at}.{name}.weight"),
                    vec![out, input],
                    0.0,
                    WEIGHT_SPREAD,
                );
                add(format!("{at}.{name}.bias"), vec![out], 0.0, 0.02);
            }
            for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
                add(format!("{at}.{norm}.weight"), vec![hidden], 1.0, 0.05);
                add(format!("{at}.{norm}.bias"), vec![hidden], 0.0, 0.02);
            }
        }
        add(
            "pooler.dense.weight".into(),
            vec![hidden, hidden],
            0.0,
            WEIGHT_SPREAD,
        );
        add("pooler.dense.bias".into(), vec![hidden], 0.0, 0.02);
        tensors
    }

    fn config(&self) -> serde_json::Value {
        let shape = self.shape();
        let mut config = self.bert_config(shape);
        if self.roberta {
            for (key, value) in [
                ("architectures", json!(["RobertaModel"])),
                ("model_type", json!("roberta")),
                ("pad_token_id", json!(1)),
                ("bos_token_id", json!(0)),
                ("eos_token_id", json!(2)),
                ("type_vocab_size", json!(1)),
                ("layer_norm_eps", json!(1e-5)),
            ] {
                config[key] = value;
            }
        }
        config
    }

    fn bert_config(&self, shape: BertShape) -> serde_json::Value {
        json!({
            "architectures": ["BertModel"],
            "model_type": "bert",
            "attention_probs_dropout_prob": 0.1,
            "hidden_act": "gelu",
            "hidden_dropout_prob": 0.1,
            "hidden_size": shape.hidden,
            "initializer_range": 0.02,
            "intermediate_size": shape.intermediate,
            "layer_norm_eps": 1e-12,
            "max_position_embeddings": shape.max_positions,
            "num_attention_heads": shape.heads,
            "num_hidden_layers": shape.layers,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
            "torch_dtype": match self.dtype {
                DType::F32 => "float32",
                DType::F16 => "float16",
                DType::Bf16 => "bfloat16",
                DType::F8E4M3 => "float8_e4m3fn",
                DType::F8E5M2 => "float8_e5m2",
                DType::I8 | DType::U4 => "int8",
            },
            "type_vocab_size": 2,
            "vocab_size": shape.vocab,
        })
    }

    /// Bytes of the weights in the chosen dtype.
    pub fn weight_bytes(&self) -> u64 {
        let size = self.dtype.size_bytes() as u64;
        self.tensors()
            .iter()
            .map(|tensor| tensor.elements() * size)
            .sum()
    }
}

/// Writes the folder `dir` (created if missing) and returns it.
pub fn write_bert_folder(dir: &Path, demo: &BertDemo) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir.join("1_Pooling"))?;
    std::fs::create_dir_all(dir.join("2_Normalize"))?;
    let metadata = BTreeMap::from([
        ("format".to_string(), "pt".to_string()),
        (
            "stagehand.generated".to_string(),
            format!("bert {:?} seed {}", demo.preset, demo.seed),
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
    json_file("tokenizer.json", tokenizer_json(demo.shape().vocab))?;
    json_file(
        "modules.json",
        json!([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        ]),
    )?;
    json_file(
        "1_Pooling/config.json",
        json!({"word_embedding_dimension": demo.preset.shape().hidden,
               "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true,
               "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}),
    )?;
    Ok(dir.to_path_buf())
}

/// A PEFT adapter for a generated encoder: rank-`rank` factors on the attention
/// `query` and `value` projections of every layer (PEFT's usual BERT targets), with an
/// `adapter_config.json` beside it. Returns the adapter file.
pub fn write_bert_lora(
    dir: &Path,
    demo: &BertDemo,
    rank: usize,
    seed: u64,
) -> std::io::Result<PathBuf> {
    let shape = demo.preset.shape();
    let hidden = shape.hidden;
    std::fs::create_dir_all(dir)?;
    let mut tensors = Vec::new();
    for layer in 0..shape.layers {
        for target in ["query", "value"] {
            let module = format!("base_model.model.encoder.layer.{layer}.attention.self.{target}");
            let stream = seed
                ^ ((layer * 2 + usize::from(target == "value")) as u64 + 1)
                    .wrapping_mul(0x9E37_79B9);
            tensors.push(TensorSpec::uniform(
                format!("{module}.lora_A.weight"),
                vec![rank, hidden],
                stream,
                0.0,
                1.0 / (hidden as f32).sqrt(),
            ));
            tensors.push(TensorSpec::uniform(
                format!("{module}.lora_B.weight"),
                vec![hidden, rank],
                stream.rotate_left(17),
                0.0,
                0.05,
            ));
        }
    }
    let path = dir.join("adapter_model.safetensors");
    write_single(
        &path,
        &tensors,
        DType::F32,
        &BTreeMap::from([("format".to_string(), "pt".to_string())]),
    )?;
    let config = json!({
        "peft_type": "LORA", "task_type": "FEATURE_EXTRACTION", "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none",
        "target_modules": ["query", "value"],
        "base_model_name_or_path": if demo.roberta { "generated-roberta" } else { "generated-bert" }
    });
    write_atomically(&dir.join("adapter_config.json"), |file| {
        use std::io::Write;
        file.write_all(serde_json::to_string_pretty(&config)?.as_bytes())
    })?;
    Ok(path)
}
