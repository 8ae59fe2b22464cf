//! A Llama-family `config.json` (`llama`, `mistral`, `qwen2`, `qwen3`, and the
//! mixtures of experts `mixtral`, `qwen2_moe`, `qwen3_moe`), read and checked in the
//! layouts transformers 4 and 5 write: sizes, grouped-query heads, the rotary
//! embedding (`rope.rs`), biases, per-head q/k norms, experts, the sliding window
//! (`window.rs`). Every key that changes the computation is implemented or refused
//! naming the key and its value; the keys that change nothing are listed in
//! `keys.rs`; any other key is one the family's transformers class does not read
//! either, and is named in a warning.

use std::path::Path;

use serde_json::Value;

use super::keys::{check_dtype, check_quantization, Keys};
use super::rope::Rope;
use super::window::{sliding_window, SlidingWindow};
use crate::families::FamilyError;

/// The decoder families stagehand computes, by `model_type`.
pub const DECODER_FAMILIES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
];

/// Which transformers class a config is for: what it reads, and its defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Mixtral,
    Qwen2Moe,
    Qwen3Moe,
}

/// Keys every variant reads.
const COMMON_KEYS: &[&str] = &[
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "rms_norm_eps",
    "hidden_act",
    "tie_word_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "original_max_position_embeddings",
    "quantization_config",
];

const QWEN_WINDOW_KEYS: &[&str] = &[
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
    "layer_types",
];

const QWEN_MOE_KEYS: &[&str] = &[
    "num_experts",
    "num_local_experts",
    "num_experts_per_tok",
    "norm_topk_prob",
    "moe_intermediate_size",
    "decoder_sparse_step",
    "mlp_only_layers",
];

impl Variant {
    pub fn of(model_type: &str) -> Option<Self> {
        Some(match model_type {
            "llama" => Variant::Llama,
            "mistral" => Variant::Mistral,
            "qwen2" => Variant::Qwen2,
            "qwen3" => Variant::Qwen3,
            "mixtral" => Variant::Mixtral,
            "qwen2_moe" => Variant::Qwen2Moe,
            "qwen3_moe" => Variant::Qwen3Moe,
            _ => return None,
        })
    }

    /// What runs, for summaries.
    pub fn describe(self) -> &'static str {
        match self {
            Variant::Llama => "llama decoder",
            Variant::Mistral => "mistral decoder",
            Variant::Qwen2 => "qwen2 decoder",
            Variant::Qwen3 => "qwen3 decoder",
            Variant::Mixtral => "mixtral decoder",
            Variant::Qwen2Moe => "qwen2-moe decoder",
            Variant::Qwen3Moe => "qwen3-moe decoder",
        }
    }

    /// The keys this variant's transformers class reads beside [`COMMON_KEYS`].
    fn own_keys(self) -> Vec<&'static str> {
        let mut keys = match self {
            Variant::Llama => vec!["attention_bias", "mlp_bias"],
            Variant::Mistral => vec!["sliding_window"],
            Variant::Mixtral => vec![
                "sliding_window",
                "num_local_experts",
                "num_experts",
                "num_experts_per_tok",
            ],
            Variant::Qwen2 => QWEN_WINDOW_KEYS.to_vec(),
            Variant::Qwen3 => [QWEN_WINDOW_KEYS, &["attention_bias"]].concat(),
            // Qwen3-MoE slides every layer when use_sliding_window; real configs carry
            // max_window_layers too, which its class does not read.
            Variant::Qwen3Moe => [QWEN_WINDOW_KEYS, QWEN_MOE_KEYS, &["attention_bias"]].concat(),
            Variant::Qwen2Moe => [
                QWEN_WINDOW_KEYS,
                QWEN_MOE_KEYS,
                &["qkv_bias", "shared_expert_intermediate_size"],
            ]
            .concat(),
        };
        keys.extend_from_slice(COMMON_KEYS);
        keys
    }

    fn default_rope_theta(self) -> f64 {
        match self {
            Variant::Mixtral => 1_000_000.0,
            _ => 10_000.0,
        }
    }

    fn default_rms_eps(self) -> f64 {
        match self {
            Variant::Mixtral => 1e-5,
            _ => 1e-6,
        }
    }

    /// Qwen3 normalises each head of q and k (`q_norm`, `k_norm`) before the rotation.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Variant::Qwen3 | Variant::Qwen3Moe)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
    pub variant: Variant,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The dense MLP's width (`intermediate_size`).
    pub intermediate: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub rms_eps: f32,
    pub rope: Rope,
    pub tie_embeddings: bool,
    pub biases: Biases,
    /// Experts per layer, how many each token uses, and which layers have them.
    pub experts: Option<Experts>,
    /// The window the sliding layers attend through (never exceeded: see `window.rs`).
    pub sliding_window: Option<SlidingWindow>,
    /// Keys no list accounts for: the family's transformers class ignores them too.
    pub unread_keys: Vec<String>,
}

/// Which projections carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Biases {
    /// q, k and v (Qwen2 always; `attention_bias` in Llama and Qwen3; `qkv_bias` in
    /// Qwen2-MoE).
    pub qkv: bool,
    /// The output projection (`attention_bias` in Llama and Qwen3).
    pub o: bool,
    /// gate, up and down of the dense MLP (`mlp_bias` in Llama).
    pub mlp: bool,
}

/// A mixture of experts.
#[derive(Debug, Clone, PartialEq)]
pub struct Experts {
    pub count: usize,
    pub top_k: usize,
    /// One expert's MLP width (Mixtral: `intermediate_size`; Qwen: `moe_intermediate_size`).
    pub intermediate: usize,
    /// Whether the top-k routing weights are renormalised to sum to one (Mixtral
    /// always; Qwen when `norm_topk_prob`).
    pub renormalise: bool,
    /// Qwen2-MoE: the shared expert's width (it runs for every token, scaled by the
    /// sigmoid of its own gate).
    pub shared_intermediate: Option<usize>,
    /// Per layer: whether its MLP is the experts (else the dense MLP).
    pub sparse: Vec<bool>,
    pub names: ExpertNames,
}

/// How a family names its router and experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertNames {
    /// `block_sparse_moe.gate`, `block_sparse_moe.experts.N.{w1,w3,w2}`.
    Mixtral,
    /// `mlp.gate`, `mlp.experts.N.{gate_proj,up_proj,down_proj}`, `mlp.shared_expert*`.
    Qwen,
}

impl Experts {
    /// Layers whose MLP is the experts.
    pub fn sparse_layers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.sparse.len()).filter(|&layer| self.sparse[layer])
    }
}

impl DecoderConfig {
    pub fn from_json(path: &Path, model_type: &str, config: &Value) -> Result<Self, FamilyError> {
        let keys = Keys::new(path, config);
        let variant = Variant::of(model_type).ok_or_else(|| {
            keys.bad(
                "model_type",
                format!(
                    "is \"{model_type}\"; decoders are {}",
                    DECODER_FAMILIES.join(", ")
                ),
            )
        })?;
        check_dtype(&keys)?;
        check_quantization(&keys)?;
        let activation = keys.text("hidden_act")?.unwrap_or("silu");
        if !matches!(activation, "silu" | "swish") {
            return Err(keys.bad(
                "hidden_act",
                format!("is \"{activation}\"; Llama-family decoders are implemented with \"silu\""),
            ));
        }
        let geometry = Geometry::read(&keys, variant)?;
        let layers = keys.size("num_hidden_layers")?;
        let max_positions = keys.size("max_position_embeddings")?;
        let rope = Rope::from_config(
            &keys,
            variant.default_rope_theta(),
            geometry.head_dim,
            max_positions,
        )?;
        Ok(Self {
            variant,
            hidden: geometry.hidden,
            layers,
            heads: geometry.heads,
            kv_heads: geometry.kv_heads,
            head_dim: geometry.head_dim,
            intermediate: keys.size("intermediate_size")?,
            vocab: keys.size("vocab_size")?,
            max_positions,
            rms_eps: keys.positive("rms_norm_eps", variant.default_rms_eps())? as f32,
            rope,
            tie_embeddings: keys.flag("tie_word_embeddings", false)?,
            biases: biases(&keys, variant)?,
            experts: experts(&keys, variant, layers)?,
            sliding_window: sliding_window(&keys, variant, layers)?,
            unread_keys: keys.unread(&variant.own_keys()),
        })
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// KV-cache bytes per token: keys and values of every layer, held in f32.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * self.kv_dim() * 4 * self.layers) as u64
    }

    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The longest sequence this model runs: its positions, and its sliding window.
    pub fn sequence_limit(&self) -> usize {
        let window = self
            .sliding_window
            .as_ref()
            .map_or(usize::MAX, |w| w.tokens);
        self.rope.position_limit().min(window)
    }

    /// Why a sequence of `tokens` tokens cannot run; `None` when it can.
    pub fn refuse_sequence(&self, tokens: usize) -> Option<String> {
        if let Some(window) = self.sliding_window.as_ref().filter(|w| tokens > w.tokens) {
            return Some(window.refusal(tokens));
        }
        let limit = self.rope.position_limit();
        (tokens > limit).then(|| {
            format!(
                "a sequence of {tokens} tokens is longer than the model's {limit} positions (max_position_embeddings{})",
                if self.rope.depends_on_length() { " × the dynamic rope factor" } else { "" }
            )
        })
    }

    /// Whether layer `layer`'s MLP is the experts.
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.experts
            .as_ref()
            .is_some_and(|experts| experts.sparse.get(layer).copied().unwrap_or(false))
    }
}

/// Sizes of the attention.
struct Geometry {
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Geometry {
    fn read(keys: &Keys<'_>, variant: Variant) -> Result<Self, FamilyError> {
        let hidden = keys.size("hidden_size")?;
        let heads = keys.size("num_attention_heads")?;
        let kv_heads = keys.optional_size("num_key_value_heads")?.unwrap_or(heads);
        if kv_heads > heads || heads % kv_heads != 0 {
            return Err(keys.bad(
                "num_key_value_heads",
                format!("is {kv_heads}, which does not divide num_attention_heads {heads}"),
            ));
        }
        let head_dim = match keys.optional_size("head_dim")? {
            Some(head_dim) => head_dim,
            // transformers' Qwen3Config defaults head_dim to 128, not hidden / heads.
            None if variant == Variant::Qwen3 => 128,
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(keys.bad(
                    "num_attention_heads",
                    format!("is {heads}, which does not divide hidden_size {hidden} (and no head_dim is given)"),
                ))
            }
        };
        if head_dim % 2 != 0 {
            return Err(keys.bad(
                "head_dim",
                format!("is {head_dim}; rotary embedding needs it even"),
            ));
        }
        Ok(Self {
            hidden,
            heads,
            kv_heads,
            head_dim,
        })
    }
}

fn biases(keys: &Keys<'_>, variant: Variant) -> Result<Biases, FamilyError> {
    Ok(match variant {
        Variant::Llama => {
            let attention = keys.flag("attention_bias", false)?;
            Biases {
                qkv: attention,
                o: attention,
                mlp: keys.flag("mlp_bias", false)?,
            }
        }
        Variant::Qwen3 | Variant::Qwen3Moe => {
            let attention = keys.flag("attention_bias", false)?;
            Biases {
                qkv: attention,
                o: attention,
                mlp: false,
            }
        }
        Variant::Qwen2 => Biases {
            qkv: true,
            ..Biases::default()
        },
        Variant::Qwen2Moe => Biases {
            qkv: keys.flag("qkv_bias", true)?,
            ..Biases::default()
        },
        Variant::Mistral | Variant::Mixtral => Biases::default(),
    })
}

/// An expert count under either of its names (transformers 5 writes Qwen3-MoE's
/// `num_experts` as `num_local_experts`); both must agree.
fn expert_count(keys: &Keys<'_>, default: Option<usize>) -> Result<usize, FamilyError> {
    let local = keys.optional_size("num_local_experts")?;
    let plain = keys.optional_size("num_experts")?;
    match (local, plain) {
        (Some(local), Some(plain)) if local != plain => Err(keys.bad(
            "num_experts",
            format!("is {plain} but `num_local_experts` is {local}; give one"),
        )),
        (Some(count), _) | (None, Some(count)) => Ok(count),
        (None, None) => default.ok_or_else(|| keys.bad("num_local_experts", "is missing")),
    }
}

/// The experts of an MoE variant (transformers' defaults where a key is unset);
/// `None` for a dense model, or one whose every layer is in `mlp_only_layers`.
fn experts(
    keys: &Keys<'_>,
    variant: Variant,
    layers: usize,
) -> Result<Option<Experts>, FamilyError> {
    let (count, top_k, intermediate, renormalise, shared) = match variant {
        Variant::Mixtral => (
            expert_count(keys, None)?,
            keys.size("num_experts_per_tok")?,
            keys.size("intermediate_size")?,
            true,
            None,
        ),
        Variant::Qwen3Moe | Variant::Qwen2Moe => {
            let qwen3 = variant == Variant::Qwen3Moe;
            let shared = match qwen3 {
                true => None,
                false => Some(
                    keys.optional_size("shared_expert_intermediate_size")?
                        .unwrap_or(5632),
                ),
            };
            (
                expert_count(keys, Some(if qwen3 { 128 } else { 60 }))?,
                keys.optional_size("num_experts_per_tok")?
                    .unwrap_or(if qwen3 { 8 } else { 4 }),
                keys.optional_size("moe_intermediate_size")?
                    .unwrap_or(if qwen3 { 768 } else { 1408 }),
                keys.flag("norm_topk_prob", false)?,
                shared,
            )
        }
        _ => return Ok(None),
    };
    if top_k > count {
        return Err(keys.bad(
            "num_experts_per_tok",
            format!("is {top_k}, more than the {count} experts"),
        ));
    }
    let (step, dense) = match variant {
        Variant::Mixtral => (1, Vec::new()),
        _ => (
            keys.optional_size("decoder_sparse_step")?.unwrap_or(1),
            keys.layer_list("mlp_only_layers", layers)?,
        ),
    };
    // transformers: experts where `layer not in mlp_only_layers and (layer + 1) % step == 0`.
    let sparse: Vec<bool> = (0..layers)
        .map(|layer| !dense.contains(&layer) && (layer + 1) % step == 0)
        .collect();
    if !sparse.contains(&true) {
        return Ok(None);
    }
    Ok(Some(Experts {
        count,
        top_k,
        intermediate,
        renormalise,
        shared_intermediate: shared,
        sparse,
        names: match variant {
            Variant::Mixtral => ExpertNames::Mixtral,
            _ => ExpertNames::Qwen,
        },
    }))
}
