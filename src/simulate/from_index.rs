//! Model descriptions of a bare checkpoint (a safetensors file or shard index): its
//! blocks and bytes from the header, FLOPs estimated from the shapes of its matrices,
//! and one `linear` per matrix as the kernels of a step.

use std::collections::BTreeSet;

use super::model::{BlockDesc, ExpertDesc, ModelDescription};
use crate::compute::work::{ElementOp, Kernel, Work};
use crate::compute::DType;
use crate::model::{BlockInfo, ModelIndex};
use crate::sim::SimError;

impl ModelDescription {
    /// Describes a real checkpoint from its index. FLOPs per token are estimated as
    /// 2 × the elements of every tensor of two or more dimensions (each token
    /// multiplies each weight matrix once; per output position for a convolution),
    /// leaving out token-embedding tables (a lookup, not a product) and attention's
    /// sequence-length term, which a header cannot tell. Expert tensors count
    /// `top_k / experts per layer` of their FLOPs (all of them when `top_k` is `None`).
    pub fn from_model_index(
        index: &ModelIndex,
        tokens_per_step: u64,
        top_k: Option<u32>,
    ) -> Result<Self, SimError> {
        let source = index.path.display().to_string();
        let experts = expert_desc(index, top_k);
        let active_expert_share = experts.map_or(1.0, |experts| {
            f64::from(experts.top_k) / f64::from(experts.per_layer.max(1))
        });
        let blocks = index
            .blocks
            .iter()
            .map(|block| {
                let flops_per_token = block
                    .tensors
                    .iter()
                    .filter_map(|&tensor| index.tensors.get(tensor))
                    .filter(|tensor| tensor.shape.len() >= 2 && !is_embedding_table(&tensor.name))
                    .map(|tensor| {
                        let elements: f64 = tensor.shape.iter().map(|&dim| dim as f64).product();
                        let share = if tensor.expert.is_some() {
                            active_expert_share
                        } else {
                            1.0
                        };
                        2.0 * elements * share
                    })
                    .sum();
                BlockDesc {
                    name: block.name.clone(),
                    bytes: block.bytes,
                    flops_per_token,
                    tensors: u32::try_from(block.tensors.len()).unwrap_or(u32::MAX),
                    work: Some(work_of_block(index, block, tokens_per_step)),
                    first_step_work: None,
                }
            })
            .collect();
        let dtypes: BTreeSet<&str> = index
            .tensors
            .iter()
            .map(|tensor| tensor.dtype.as_str())
            .collect();
        let name = index.path.file_stem().map_or_else(
            || source.clone(),
            |stem| stem.to_string_lossy().into_owned(),
        );
        let description = Self {
            name,
            source: source.clone(),
            dtype: dtypes
                .into_iter()
                .collect::<Vec<_>>()
                .join("+")
                .to_lowercase(),
            tokens_per_step,
            blocks,
            experts,
            output: None,
            kv_cache: None,
            activations: None,
            reserve_basis: None,
        };
        description.checked()
    }
}

/// Experts per layer = the most distinct experts in one block; bytes of one expert =
/// the tensors of one expert in that block.
fn expert_desc(index: &ModelIndex, top_k: Option<u32>) -> Option<ExpertDesc> {
    let mut best: Option<ExpertDesc> = None;
    for block in &index.blocks {
        let tensors: Vec<_> = block
            .tensors
            .iter()
            .filter_map(|&tensor| index.tensors.get(tensor))
            .filter(|tensor| tensor.expert.is_some())
            .collect();
        let experts: BTreeSet<u32> = tensors.iter().filter_map(|tensor| tensor.expert).collect();
        let Some(&first) = experts.iter().next() else {
            continue;
        };
        let per_layer = u32::try_from(experts.len()).unwrap_or(u32::MAX);
        if best.is_some_and(|best| best.per_layer >= per_layer) {
            continue;
        }
        let bytes_each = tensors
            .iter()
            .filter(|tensor| tensor.expert == Some(first))
            .map(|tensor| tensor.bytes)
            .sum();
        best = Some(ExpertDesc {
            per_layer,
            top_k: top_k.unwrap_or(per_layer).clamp(1, per_layer),
            bytes_each,
        });
    }
    best
}

/// Token-embedding tables are looked up, not multiplied.
fn is_embedding_table(name: &str) -> bool {
    [
        "embed_tokens.",
        "wte.",
        "tok_embeddings.",
        "word_embeddings.",
        "embedding.weight",
    ]
    .iter()
    .any(|pattern| name.contains(pattern))
}

/// The kernels one step of `rows` tokens runs in a block of a checkpoint: one
/// `linear` per weight matrix (an embedding table is gathered, not multiplied),
/// and, for the generated linear-stack demo model, the RMS norm after each
/// layer, exactly as `families::linear_stack` calls them. Expert weights are
/// counted as if every row went through each (an upper bound for MoE blocks).
fn work_of_block(index: &ModelIndex, block: &BlockInfo, rows: u64) -> Work {
    let linear_stack = index.metadata.get("stagehand.kind").map(String::as_str)
        == Some(crate::model::demo::LINEAR_STACK_KIND);
    let mut kernels = Vec::new();
    for tensor in block.tensors.iter().filter_map(|&t| index.tensors.get(t)) {
        let [outer, inner] = tensor.shape[..] else {
            continue;
        };
        let Some(dtype) = DType::from_safetensors(&tensor.dtype) else {
            continue;
        };
        if tensor.name.contains("embed") {
            kernels.push(Kernel::Elementwise {
                op: ElementOp::Gather,
                elements: rows * inner as u64,
            });
            continue;
        }
        kernels.push(Kernel::Linear {
            rows,
            inner: inner as u64,
            outer: outer as u64,
            dtype,
        });
        if linear_stack {
            kernels.push(Kernel::Elementwise {
                op: ElementOp::RmsNorm,
                elements: rows * outer as u64,
            });
        }
    }
    Work { kernels }
}
