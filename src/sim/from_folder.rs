//! Model descriptions of a Hugging Face folder of a family stagehand computes: the
//! blocks the family really streams (its own layout, headers only) and the
//! floating-point operations its kernels execute per token, so a prediction and a run
//! are about the same work.

use stagehand_actors::BlockId;

use super::model::{BlockDesc, ExpertDesc, ModelDescription};
use super::output::{OutputUnit, StepOutput};
use super::SimError;
use crate::run::Prepared;
use crate::workload::driver::Model;
use crate::workload::family::Family;

impl ModelDescription {
    /// The description of a prepared decoder: one block per layer (its experts
    /// included, as the simulator's MoE layers hold them), then the head; each token
    /// is a step (`tokens_per_step` sequences decode at once).
    pub fn from_prepared(prepared: &Prepared, tokens_per_step: u64) -> Result<Self, SimError> {
        let source = prepared.index.path.display().to_string();
        let Model::Decoder(decoder) = &prepared.workload.model else {
            return Err(SimError::Profile {
                file: source,
                message: "only decoder folders are described from config.json; give the checkpoint file for others".to_string(),
            });
        };
        let layout = decoder.layout();
        let bytes = |block: BlockId| layout.block(block).map_or(0, |block| block.bytes);
        let config = &decoder.config;
        let mut blocks = Vec::with_capacity(config.layers + 1);
        let mut experts = None;
        for layer in 0..config.layers {
            let layer_block = BlockId(layer as u32);
            let expert_blocks = decoder.expert_blocks(layer);
            let expert_bytes: u64 = expert_blocks.iter().map(|&block| bytes(block)).sum();
            let active = config.experts.map_or(0.0, |experts| {
                experts.top_k as f64 * decoder.expert_flops_per_token()
            });
            if let (Some(found), Some(&first)) = (config.experts, expert_blocks.first()) {
                experts = Some(ExpertDesc {
                    per_layer: found.count as u32,
                    top_k: found.top_k as u32,
                    bytes_each: bytes(first),
                });
            }
            blocks.push(BlockDesc {
                name: layout.block(layer_block).map_or_else(
                    || format!("model.layers.{layer}"),
                    |block| block.name.clone(),
                ),
                bytes: bytes(layer_block) + expert_bytes,
                flops_per_token: decoder.layer_flops_per_token() + active,
                tensors: 1,
                work: None,
            });
        }
        let head = BlockId(config.layers as u32);
        blocks.push(BlockDesc {
            name: "lm_head".to_string(),
            bytes: bytes(head),
            flops_per_token: decoder.head_flops_per_token(),
            tensors: 1,
            work: None,
        });
        let dtypes: std::collections::BTreeSet<&str> = prepared
            .index
            .tensors
            .iter()
            .map(|tensor| tensor.dtype.as_str())
            .collect();
        let name = prepared
            .folder
            .as_ref()
            .and_then(|folder| folder.dir.file_name())
            .map_or_else(
                || source.clone(),
                |name| name.to_string_lossy().into_owned(),
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
            output: Some(StepOutput {
                unit: OutputUnit::Token,
                steps_per_output: None,
            }),
        };
        description
            .validate()
            .map_err(|message| SimError::Profile {
                file: source,
                message,
            })?;
        Ok(description)
    }
}
