//! The tensors of a generated decoder, by their Hugging Face names, in file order:
//! seeded uniform values (std 0.02, like Llama's initialisation; norms around 1). In
//! FP8 every linear weight is stored as F8_E4M3 with an F32 `weight_scale`, while
//! embeddings, norms, biases, routers and `lm_head` stay bf16, as in real FP8
//! checkpoints.

use super::shape::{DecoderShape, MoeShape};
use super::{DecoderArch, DecoderDemo};
use crate::compute::DType;
use crate::model::generated::{TensorSpec, Values};

/// Weights uniform with std 0.02, like Llama's initialisation.
const SPREAD: f32 = 0.02 * 1.732_050_8;

/// The tensor list being written, and the seed sequence that fills it.
struct Tensors {
    list: Vec<TensorSpec>,
    seed: u64,
    fp8: bool,
}

impl Tensors {
    fn next_seed(&mut self) -> u64 {
        self.seed = self.seed.wrapping_add(0xA24B_AED4_963E_E407);
        self.seed
    }

    /// A tensor that stays in a plain float dtype (bf16 beside FP8 weights).
    fn other(&mut self, name: String, dims: Vec<usize>, center: f32, spread: f32) {
        let seed = self.next_seed();
        let mut tensor = TensorSpec::uniform(name, dims, seed, center, spread);
        tensor.dtype = self.fp8.then_some(DType::Bf16);
        self.list.push(tensor);
    }

    fn norm(&mut self, name: String, width: usize) {
        self.other(name, vec![width], 1.0, 0.05);
    }

    fn linear(&mut self, name: String, dims: Vec<usize>) {
        let seed = self.next_seed();
        if !self.fp8 {
            self.list
                .push(TensorSpec::uniform(name, dims, seed, 0.0, SPREAD));
            return;
        }
        // Stored values span the format; the scale brings them back to ±SPREAD.
        let max = 448.0;
        let stem = name.trim_end_matches(".weight").to_string();
        self.list
            .push(TensorSpec::uniform(name, dims, seed, 0.0, max));
        self.list.push(TensorSpec {
            name: format!("{stem}.weight_scale"),
            shape: vec![],
            values: Values::Constant(SPREAD / max),
            dtype: Some(DType::F32),
        });
    }

    /// A SwiGLU MLP under `at`, its projections in the order given.
    fn mlp(&mut self, at: &str, names: [(&str, bool); 3], hidden: usize, inner: usize) {
        for (name, widening) in names {
            let dims = match widening {
                true => vec![inner, hidden],
                false => vec![hidden, inner],
            };
            self.linear(format!("{at}.{name}.weight"), dims);
        }
    }
}

/// gate, up, down (`true`: hidden → inner).
const QWEN_MLP: [(&str, bool); 3] = [("gate_proj", true), ("up_proj", true), ("down_proj", false)];
/// Mixtral's experts, written w1, w2, w3.
const MIXTRAL_EXPERT: [(&str, bool); 3] = [("w1", true), ("w2", false), ("w3", true)];

impl DecoderDemo {
    pub(super) fn tensors(&self, shape: &DecoderShape) -> Vec<TensorSpec> {
        let mut tensors = Tensors {
            list: Vec::new(),
            seed: self.seed,
            fp8: matches!(self.dtype, DType::F8E4M3 | DType::F8E5M2),
        };
        let hidden = shape.hidden;
        tensors.other(
            "model.embed_tokens.weight".into(),
            vec![shape.vocab, hidden],
            0.0,
            SPREAD,
        );
        for layer in 0..shape.layers {
            let at = format!("model.layers.{layer}");
            self.attention(&mut tensors, shape, &at);
            tensors.norm(format!("{at}.post_attention_layernorm.weight"), hidden);
            match &shape.experts {
                None => tensors.mlp(&format!("{at}.mlp"), QWEN_MLP, hidden, shape.intermediate),
                Some(moe) => self.experts(&mut tensors, moe, hidden, &at),
            }
        }
        tensors.norm("model.norm.weight".into(), hidden);
        if !shape.tied {
            tensors.other(
                "lm_head.weight".into(),
                vec![shape.vocab, hidden],
                0.0,
                SPREAD,
            );
        }
        tensors.list
    }

    /// A layer's input norm and attention (Qwen2-MoE's q/k/v biases, Qwen3's q/k norms).
    fn attention(&self, tensors: &mut Tensors, shape: &DecoderShape, at: &str) {
        let hidden = shape.hidden;
        let (q_dim, kv_dim) = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
        );
        tensors.norm(format!("{at}.input_layernorm.weight"), hidden);
        let attention = format!("{at}.self_attn");
        for (name, rows) in [("q_proj", q_dim), ("k_proj", kv_dim), ("v_proj", kv_dim)] {
            tensors.linear(format!("{attention}.{name}.weight"), vec![rows, hidden]);
            if self.arch == DecoderArch::Qwen2Moe {
                tensors.other(format!("{attention}.{name}.bias"), vec![rows], 0.0, SPREAD);
            }
        }
        tensors.linear(format!("{attention}.o_proj.weight"), vec![hidden, q_dim]);
        if matches!(self.arch, DecoderArch::Qwen3 | DecoderArch::Qwen3Moe) {
            tensors.norm(format!("{attention}.q_norm.weight"), shape.head_dim);
            tensors.norm(format!("{attention}.k_norm.weight"), shape.head_dim);
        }
    }

    /// A layer's router (skewed so a few experts lead, like a trained one), experts,
    /// and Qwen2-MoE's shared expert and its gate.
    fn experts(&self, tensors: &mut Tensors, moe: &MoeShape, hidden: usize, at: &str) {
        let (router, experts, names) = match self.arch {
            DecoderArch::Mixtral => (
                format!("{at}.block_sparse_moe.gate.weight"),
                format!("{at}.block_sparse_moe.experts"),
                MIXTRAL_EXPERT,
            ),
            _ => (
                format!("{at}.mlp.gate.weight"),
                format!("{at}.mlp.experts"),
                QWEN_MLP,
            ),
        };
        tensors.other(router, vec![moe.experts, hidden], 0.0, 0.5);
        for expert in 0..moe.experts {
            tensors.mlp(
                &format!("{experts}.{expert}"),
                names,
                hidden,
                moe.intermediate,
            );
        }
        if let Some(inner) = moe.shared_intermediate {
            tensors.mlp(&format!("{at}.mlp.shared_expert"), QWEN_MLP, hidden, inner);
            tensors.other(
                format!("{at}.mlp.shared_expert_gate.weight"),
                vec![1, hidden],
                0.0,
                0.5,
            );
        }
    }
}
