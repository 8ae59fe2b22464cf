//! Model descriptions of a Hugging Face folder of a family stagehand computes, made
//! from the family itself: the blocks it really streams (its own layout, headers
//! only), the kernels its own steps call block by block (recorded over the recording
//! compute, [`crate::families::record`]), the FLOPs those execute, and what it
//! reserves beside the weights — so a prediction and a run are about the same work
//! and bytes, with no second list of what a family computes to drift from the first.

use stagehand_actors::BlockId;

use super::model::{BlockDesc, ExpertDesc, ModelDescription};
use super::output::{OutputUnit, StepOutput};
use crate::compute::work::Work;
use crate::families::record::record_model;
use crate::families::StepUnit;
use crate::run::Prepared;
use crate::sim::SimError;

/// The steps a description records: the first (a decoder's prefill) and a steady one.
const RECORDED_STEPS: u64 = 2;

impl ModelDescription {
    /// The description of a prepared model folder. A decoder's step decodes
    /// `tokens_per_step` sequences at once (each with its own KV cache, the first
    /// step prefilling the prepared prompt); an encoder's step is its prepared batch.
    pub fn from_prepared(prepared: &Prepared, tokens_per_step: u64) -> Result<Self, SimError> {
        let source = prepared.index.path.display().to_string();
        let failed = |message: String| SimError::Profile {
            file: source.clone(),
            message,
        };
        let unit = prepared.family.step;
        if unit == StepUnit::Check {
            return Err(failed(
                "its family computes nothing to describe; give the checkpoint file to describe its bytes".to_string(),
            ));
        }
        let facts = prepared.facts();
        // A decoder's step decodes a token of each sequence; another's is its batch.
        let (sequences, tokens_per_step) = match unit {
            StepUnit::Token => (tokens_per_step.max(1), tokens_per_step.max(1)),
            StepUnit::Batch | StepUnit::Denoise | StepUnit::Check => (1, facts.tokens_per_step()),
        };
        let steps = record_model(&prepared.workload.model, RECORDED_STEPS)
            .map_err(|error| failed(format!("recording a step of the family: {error}")))?;
        let [first, steady] = &steps[..] else {
            return Err(failed("the family recorded no steps".to_string()));
        };
        let blocks = facts
            .order()
            .into_iter()
            .map(|block| describe_block(prepared, block, tokens_per_step, sequences, first, steady))
            .collect();
        Self {
            name: folder_name(prepared),
            source,
            dtype: dtypes(prepared),
            tokens_per_step,
            blocks,
            experts: facts.experts().map(|experts| ExpertDesc {
                per_layer: experts.per_layer as u32,
                top_k: experts.top_k as u32,
                bytes_each: experts.expert_bytes,
            }),
            output: (unit == StepUnit::Token).then_some(StepOutput {
                unit: OutputUnit::Token,
                steps_per_output: None,
            }),
            kv_cache: facts.kv_cache().map(|kv| crate::families::KvCache {
                bytes_per_token: kv.bytes_per_token * sequences,
                ..kv
            }),
            activations: facts.activations(),
            reserve_basis: (facts.kv_cache().is_some() || facts.activations().is_some())
                .then(|| format!("computed by the {} family's own code", prepared.family.name)),
        }
        .checked()
    }
}

/// Block `block` of the order as the simulator holds it: its bytes with those of its
/// experts (an MoE layer holds them), the kernels of a steady step and of the first,
/// batched over `sequences`.
fn describe_block(
    prepared: &Prepared,
    block: BlockId,
    tokens_per_step: u64,
    sequences: u64,
    first: &[Work],
    steady: &[Work],
) -> BlockDesc {
    let facts = prepared.facts();
    let layout = facts.layout();
    let info = layout.block(block);
    let bytes = |block: BlockId| layout.block(block).map_or(0, |block| block.bytes);
    let expert_bytes: u64 = facts.experts_of(block).into_iter().map(bytes).sum();
    let work = steady[block.index()].batched(sequences);
    let first_work = first[block.index()].batched(sequences);
    BlockDesc {
        name: info.map_or_else(|| block.to_string(), |info| info.name.clone()),
        bytes: bytes(block) + expert_bytes,
        flops_per_token: work.gemm_flops() / tokens_per_step.max(1) as f64,
        tensors: info.map_or(1, |info| {
            u32::try_from(info.extents.len()).unwrap_or(u32::MAX)
        }),
        first_step_work: (first_work != work).then_some(first_work),
        work: Some(work),
    }
}

/// The folder's name, or the checkpoint's path.
fn folder_name(prepared: &Prepared) -> String {
    prepared
        .folder
        .as_ref()
        .and_then(|folder| folder.dir.file_name())
        .map_or_else(
            || prepared.index.path.display().to_string(),
            |name| name.to_string_lossy().into_owned(),
        )
}

/// The checkpoint's storage dtypes, `+`-joined.
fn dtypes(prepared: &Prepared) -> String {
    let dtypes: std::collections::BTreeSet<&str> = prepared
        .index
        .tensors
        .iter()
        .map(|tensor| tensor.dtype.as_str())
        .collect();
    dtypes
        .into_iter()
        .collect::<Vec<_>>()
        .join("+")
        .to_lowercase()
}
