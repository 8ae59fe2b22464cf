//! The shapes of the generated decoder presets: real configurations' proportions at
//! `tiny` and `small`, and real models' shapes at `1b` (Llama-3.2-1B; Qwen3-0.6B).

use super::{DecoderArch, DecoderPreset};

/// A mixture of experts in a generated decoder.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeShape {
    pub experts: usize,
    pub top_k: usize,
    /// One expert's width.
    pub intermediate: usize,
    /// Qwen2-MoE's shared expert's width.
    pub shared_intermediate: Option<usize>,
    /// Qwen: whether the top-k routing weights are renormalised.
    pub norm_topk_prob: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecoderShape {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The dense MLP's width (Mixtral: each expert's).
    pub intermediate: usize,
    pub vocab: usize,
    pub tied: bool,
    pub experts: Option<MoeShape>,
    pub rope_theta: f64,
    pub llama3_scaling: bool,
    pub max_positions: usize,
}

/// `(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab)` of a preset.
type Sizes = (usize, usize, usize, usize, usize, usize, usize);

impl DecoderShape {
    /// The shape of `arch` at `preset`; `None` where the preset has no such model
    /// (`1b` of a Qwen mixture of experts: the smallest real one is 14B).
    pub fn of(arch: DecoderArch, preset: DecoderPreset) -> Option<Self> {
        use DecoderArch::*;
        use DecoderPreset::*;
        let (hidden, layers, heads, kv_heads, head_dim, intermediate, vocab): Sizes =
            match (arch, preset) {
                (Llama, Tiny) => (128, 4, 4, 2, 32, 344, 512),
                (Mixtral, Tiny) => (128, 4, 4, 2, 32, 256, 512),
                // Qwen3's heads are wider than hidden / heads, as in the real models.
                (Qwen3 | Qwen3Moe, Tiny) => (128, 4, 4, 2, 64, 384, 512),
                (Qwen2Moe, Tiny) => (128, 4, 4, 2, 32, 384, 512),
                (Llama, Small) => (512, 8, 8, 4, 64, 1408, 8192),
                (Mixtral, Small) => (512, 8, 8, 4, 64, 1024, 8192),
                (Qwen3 | Qwen3Moe, Small) => (512, 8, 8, 4, 128, 1408, 8192),
                (Qwen2Moe, Small) => (512, 8, 8, 4, 64, 1408, 8192),
                (Llama, OneB) => (2048, 16, 32, 8, 64, 8192, 128_256),
                (Mixtral, OneB) => (2048, 16, 32, 8, 64, 2048, 128_256),
                // Qwen3-0.6B.
                (Qwen3, OneB) => (1024, 28, 16, 8, 128, 3072, 151_936),
                (Qwen3Moe | Qwen2Moe, OneB) => return None,
            };
        let small = preset != Tiny;
        let experts = match arch {
            Mixtral => Some(MoeShape {
                experts: 8,
                top_k: 2,
                intermediate,
                shared_intermediate: None,
                norm_topk_prob: true,
            }),
            // Qwen3-30B-A3B routes 8 of 128 experts of width 768 (a quarter of its
            // dense width), renormalised.
            Qwen3Moe => Some(MoeShape {
                experts: if small { 32 } else { 16 },
                top_k: 4,
                intermediate: hidden / 2,
                shared_intermediate: None,
                norm_topk_prob: true,
            }),
            // Qwen1.5-MoE-A2.7B: 4 of 60, a shared expert 4× as wide, no renormalising.
            Qwen2Moe => Some(MoeShape {
                experts: if small { 20 } else { 12 },
                top_k: 4,
                intermediate: hidden / 2,
                shared_intermediate: Some(2 * hidden),
                norm_topk_prob: false,
            }),
            Llama | Qwen3 => None,
        };
        let rope_theta = match (arch, preset) {
            (Llama | Mixtral, Tiny) => 10_000.0,
            (Llama | Mixtral, _) => 500_000.0,
            _ => 1_000_000.0,
        };
        let llama3_scaling = arch == Llama && preset == OneB;
        Some(Self {
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim,
            intermediate,
            vocab,
            tied: matches!(arch, Llama | Qwen3),
            experts,
            rope_theta,
            llama3_scaling,
            max_positions: match arch {
                _ if llama3_scaling => 131_072,
                Llama | Mixtral => 8192,
                _ => 40_960,
            },
        })
    }
}
