//! The work a block's compute is made of, kernel by kernel, exactly as a model family
//! calls the compute port: what a calibrated profile times (`crate::sim::KernelCosts`)
//! and what a model description holds block by block.

use serde::{Deserialize, Serialize};

use super::DType;

/// The element-wise and data-movement kernels, by what their cost scales with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ElementOp {
    /// Values moved: `write`, `read`, `copy`, `slice_rows`, `write_rows`, `resize_rows`.
    Move,
    /// `add`, `add_scaled_rows`.
    Add,
    /// Embedding rows gathered (`gather_add`), per output value.
    Gather,
    LayerNorm,
    RmsNorm,
    GeluErf,
    SiluMul,
    Rope,
    /// `checksum` of a block (stream-verify), per byte.
    Checksum,
}

impl ElementOp {
    pub const ALL: [ElementOp; 9] = [
        ElementOp::Move,
        ElementOp::Add,
        ElementOp::Gather,
        ElementOp::LayerNorm,
        ElementOp::RmsNorm,
        ElementOp::GeluErf,
        ElementOp::SiluMul,
        ElementOp::Rope,
        ElementOp::Checksum,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ElementOp::Move => "move",
            ElementOp::Add => "add",
            ElementOp::Gather => "gather",
            ElementOp::LayerNorm => "layer_norm",
            ElementOp::RmsNorm => "rms_norm",
            ElementOp::GeluErf => "gelu_erf",
            ElementOp::SiluMul => "silu_mul",
            ElementOp::Rope => "rope",
            ElementOp::Checksum => "checksum",
        }
    }
}

/// One call of the compute port.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kernel", rename_all = "snake_case")]
pub enum Kernel {
    /// `y[rows, outer] ← x[rows, inner]·Wᵀ (+ bias)`, `W` stored in `dtype` (widened to
    /// f32 just before use).
    Linear {
        rows: u64,
        inner: u64,
        outer: u64,
        dtype: DType,
    },
    /// A LoRA's low-rank update: two thin f32 GEMMs through a `[rows, rank]` scratch.
    LowRank {
        rows: u64,
        inner: u64,
        rank: u64,
        outer: u64,
    },
    /// Element-wise work on `elements` values.
    Elementwise { op: ElementOp, elements: u64 },
    /// Softmax attention: Σ over heads and queries of the keys each scores, × head_dim
    /// (`score_dims`), and the (query, head) pairs (`queries`): each pays a fixed cost
    /// (its softmax's start and end, its output row) beside its scores.
    Attention { score_dims: u64, queries: u64 },
    /// Attention of new tokens over a KV cache, in the same unit.
    CachedAttention { score_dims: u64 },
    /// Anything else (a LoRA merge into a resident weight), timed as moving `elements`.
    Other { elements: u64 },
}

impl Kernel {
    /// Floating-point operations of the GEMMs in this kernel (2 per multiply-add);
    /// element-wise work counts 0.
    pub fn gemm_flops(&self) -> f64 {
        match *self {
            Kernel::Linear {
                rows, inner, outer, ..
            } => 2.0 * rows as f64 * inner as f64 * outer as f64,
            Kernel::LowRank {
                rows,
                inner,
                rank,
                outer,
            } => 2.0 * rows as f64 * rank as f64 * (inner + outer) as f64,
            Kernel::Attention { score_dims, .. } | Kernel::CachedAttention { score_dims } => {
                4.0 * score_dims as f64
            }
            Kernel::Elementwise { .. } | Kernel::Other { .. } => 0.0,
        }
    }

    /// Bytes of weights this kernel reads from the device tier.
    pub fn weight_bytes(&self) -> u64 {
        match *self {
            Kernel::Linear {
                inner,
                outer,
                dtype,
                ..
            } => dtype.bytes((inner * outer) as usize) as u64,
            Kernel::LowRank {
                inner, rank, outer, ..
            } => rank * (inner + outer) * 4,
            _ => 0,
        }
    }
}

/// The kernels of one use of a block (between its acquire and its release), or of
/// compute outside any block.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Work {
    pub kernels: Vec<Kernel>,
}

impl Kernel {
    /// The same kernel over `sequences` independent sequences at once: every row,
    /// element and score of it `sequences` times (weights are read once).
    pub fn batched(&self, sequences: u64) -> Kernel {
        match *self {
            Kernel::Linear {
                rows,
                inner,
                outer,
                dtype,
            } => Kernel::Linear {
                rows: rows * sequences,
                inner,
                outer,
                dtype,
            },
            Kernel::LowRank {
                rows,
                inner,
                rank,
                outer,
            } => Kernel::LowRank {
                rows: rows * sequences,
                inner,
                rank,
                outer,
            },
            Kernel::Elementwise { op, elements } => Kernel::Elementwise {
                op,
                elements: elements * sequences,
            },
            Kernel::Attention {
                score_dims,
                queries,
            } => Kernel::Attention {
                score_dims: score_dims * sequences,
                queries: queries * sequences,
            },
            Kernel::CachedAttention { score_dims } => Kernel::CachedAttention {
                score_dims: score_dims * sequences,
            },
            Kernel::Other { elements } => Kernel::Other { elements },
        }
    }
}

impl Work {
    /// The same work over `sequences` independent sequences at once.
    pub fn batched(&self, sequences: u64) -> Work {
        Work {
            kernels: self
                .kernels
                .iter()
                .map(|kernel| kernel.batched(sequences))
                .collect(),
        }
    }

    pub fn gemm_flops(&self) -> f64 {
        self.kernels.iter().map(Kernel::gemm_flops).sum()
    }

    pub fn weight_bytes(&self) -> u64 {
        self.kernels.iter().map(Kernel::weight_bytes).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.kernels.is_empty()
    }

    /// Bytes of the f32 cast buffer its widest non-f32 weight is widened into (the
    /// CPU backend's cast buffer grows to the largest and stays: fresh memory the
    /// first step faults in).
    pub fn cast_buffer_bytes(&self) -> u64 {
        self.kernels
            .iter()
            .filter_map(|kernel| match *kernel {
                Kernel::Linear {
                    inner,
                    outer,
                    dtype,
                    ..
                } if dtype != DType::F32 => Some(inner * outer * 4),
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }
}
