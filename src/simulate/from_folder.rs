//! Model descriptions of a Hugging Face folder of a family stagehand computes: the
//! blocks the family really streams (its own layout, headers only), the kernels one
//! step of it calls block by block (what a calibrated profile times), the FLOPs those
//! execute per token (the roofline of uncalibrated profiles), and what it reserves
//! beside the weights, so a prediction and a run are about the same work and bytes.

use stagehand_actors::BlockId;

use super::decoder_work::{DecoderWork, StepShape};
use super::encoder_work::EncoderWork;
use super::kv_cache::KvCache;
use super::model::{BlockDesc, ExpertDesc, ModelDescription};
use super::output::{OutputUnit, StepOutput};
use crate::families::bert::Encoder;
use crate::families::family::Family;
use crate::families::llama::{Decoder, KV_PAGE_TOKENS};
use crate::run::driver::Model;
use crate::run::Prepared;
use crate::sim::SimError;

impl ModelDescription {
    /// The description of a prepared model folder: a decoder (see
    /// [`Self::from_decoder`]) or an encoder (see [`Self::from_encoder`]); a decoder's
    /// step decodes `tokens_per_step` sequences, an encoder's is its prepared batch.
    pub fn from_prepared(prepared: &Prepared, tokens_per_step: u64) -> Result<Self, SimError> {
        let source = prepared.index.path.display().to_string();
        match &prepared.workload.model {
            Model::Decoder(decoder) => Self::from_decoder(prepared, decoder, tokens_per_step),
            Model::Encoder(encoder) => Self::from_encoder(prepared, encoder),
            _ => {
                return Err(SimError::Profile {
                    file: source,
                    message: "only decoder and encoder folders are described from config.json; give the checkpoint file for others".to_string(),
                })
            }
        }
        .checked()
    }

    /// A decoder: one block per layer (its experts included, as the simulator's MoE
    /// layers hold them), then the head; each token is a step (`tokens_per_step`
    /// sequences decode at once, each with its own KV cache). The first step prefills
    /// the prepared prompt; the KV cache is reserved as `run` reserves it.
    fn from_decoder(prepared: &Prepared, decoder: &Decoder, tokens_per_step: u64) -> Self {
        let layout = decoder.layout();
        let bytes = |block: BlockId| layout.block(block).map_or(0, |block| block.bytes);
        let config = &decoder.config;
        let prompt = decoder.prompt.len() as u64;
        let kernels = DecoderWork {
            config,
            index: &prepared.index,
            host_table: !config.tie_embeddings,
        };
        let (prefill, decode) = (
            StepShape::prefill(prompt),
            StepShape::decode(tokens_per_step, prompt),
        );
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
                work: Some(kernels.layer(layer, decode)),
                first_step_work: Some(kernels.layer(layer, prefill)),
            });
        }
        let head = BlockId(config.layers as u32);
        blocks.push(BlockDesc {
            name: "lm_head".to_string(),
            bytes: bytes(head),
            flops_per_token: decoder.head_flops_per_token(),
            tensors: 1,
            work: Some(kernels.head(decode)),
            first_step_work: Some(kernels.head(prefill)),
        });
        Self {
            experts,
            output: Some(StepOutput {
                unit: OutputUnit::Token,
                steps_per_output: None,
            }),
            kv_cache: Some(KvCache {
                bytes_per_token: decoder.kv_bytes_per_token() * tokens_per_step,
                prompt_tokens: prompt,
                page_tokens: KV_PAGE_TOKENS as u64,
            }),
            ..Self::of_folder(prepared, tokens_per_step, blocks)
        }
    }

    /// `blocks` of the prepared folder's model: named after the folder, with its
    /// dtypes; no experts, output unit or KV cache.
    fn of_folder(prepared: &Prepared, tokens_per_step: u64, blocks: Vec<BlockDesc>) -> Self {
        Self {
            name: folder_name(prepared),
            source: prepared.index.path.display().to_string(),
            dtype: dtypes(prepared),
            tokens_per_step,
            blocks,
            experts: None,
            output: None,
            kv_cache: None,
        }
    }
}

impl ModelDescription {
    /// An encoder: the embeddings block (without the word table when it stays in host
    /// memory), then one block per layer, as the encoder streams them; a step is its
    /// first batch (`sequences × padded length` token rows, the description's
    /// `tokens_per_step`), the kernels those rows run through, and FLOPs per token
    /// from those kernels' GEMMs and attention. An encoder whose texts make batches
    /// of several shapes is described by its first.
    fn from_encoder(prepared: &Prepared, encoder: &Encoder) -> Self {
        let (sequences, length) = encoder.batch_shape(0);
        let kernels = EncoderWork {
            config: &encoder.config,
            index: &prepared.index,
            sequences: sequences as u64,
            length: length as u64,
            word_streams: encoder.host_table_bytes() == 0,
        };
        let tokens_per_step = (sequences * length).max(1) as u64;
        let layout = encoder.layout();
        let blocks = layout
            .blocks
            .iter()
            .enumerate()
            .map(|(index, block)| {
                let work = match index {
                    0 => kernels.embeddings(),
                    layer => kernels.layer(layer - 1),
                };
                BlockDesc {
                    name: block.name.clone(),
                    bytes: block.bytes,
                    flops_per_token: work.gemm_flops() / tokens_per_step as f64,
                    tensors: u32::try_from(block.extents.len()).unwrap_or(u32::MAX),
                    work: Some(work),
                    first_step_work: None,
                }
            })
            .collect();
        Self::of_folder(prepared, tokens_per_step, blocks)
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
