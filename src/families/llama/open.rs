//! How a decoder folder is recognised and opened, and what the run asks of a decoder.

use std::path::Path;

use stagehand_actors::{arena_bytes, BlockId, ModelLayout};

use super::{Decoder, DecoderConfig, ExpertHint, Sampling, DECODER_FAMILIES, KV_PAGE_TOKENS};
use super::{DecoderInput, PromptInput, BUILT_IN_PROMPT};
use crate::compute::TensorSlot;
use crate::families::family::{ExpertNeeds, Facts};
use crate::families::inputs::WorkloadKind;
use crate::families::kv_cache::KvCache;
use crate::families::registry::{Endpoints, Found, Open, Request, StepUnit};
use crate::families::FamilyError;
use crate::model::ModelIndex;

impl Open for Decoder {
    const NAME: &'static str = "llama";
    const KIND: WorkloadKind = WorkloadKind::Decoder;
    const STEP: StepUnit = StepUnit::Token;
    const ENDPOINTS: Endpoints = Endpoints::Completions;
    const MODEL_TYPES: &'static [&'static str] = DECODER_FAMILIES;

    /// A described step decodes one token of each sequence, from the built-in prompt;
    /// the description batches it over `tokens_per_step` sequences.
    fn described_step(
        _: &Found<'_>,
        _: u64,
        _: &mut crate::families::Extras,
    ) -> Result<Option<usize>, FamilyError> {
        Ok(Some(1))
    }

    /// The KV cache of one sequence at `context_tokens` tokens, for a `config.json`
    /// (its `model_type` picks the variant): the pages a run reserves.
    fn described_reserve(
        config: &serde_json::Value,
        workload: &crate::families::DescribedWorkload,
    ) -> Result<Option<crate::families::DescribedReserve>, FamilyError> {
        let path = Path::new("[activations] config");
        let model_type = config
            .get("model_type")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let config = DecoderConfig::from_json(path, model_type, config)?;
        let context_tokens = crate::families::DescribedWorkload::needs(
            workload.context_tokens,
            "context_tokens",
            "llama",
        )
        .map_err(|message| FamilyError::request("context_tokens", message))?;
        if let Some(refusal) = config.refuse_sequence(context_tokens as usize + 1) {
            return Err(FamilyError::request(
                "context_tokens",
                format!("context_tokens: {refusal}"),
            ));
        }
        Ok(Some(crate::families::DescribedReserve {
            kv_cache: Some(KvCache {
                bytes_per_token: config.kv_bytes_per_token(),
                prompt_tokens: context_tokens,
                page_tokens: KV_PAGE_TOKENS as u64,
            }),
            activations: None,
        }))
    }

    /// The decoder over a folder, for the prompt the run gives (or the built-in one),
    /// tokenized by the folder's `tokenizer.json`, or for token ids.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let folder = request.folder("a decoder")?;
        let model_type = folder.model_type().unwrap_or_default();
        let config = DecoderConfig::from_json(&folder.config_path(), &model_type, &folder.config)?;
        let extras = request.extras;
        let input = extras
            .input::<DecoderInput>()
            .cloned()
            .unwrap_or(DecoderInput {
                prompt: PromptInput::Text(BUILT_IN_PROMPT.to_string()),
                sampling: Sampling::default(),
                hint: ExpertHint::NextLayer,
            });
        let prompt = match &input.prompt {
            PromptInput::TokenIds(ids) => ids.clone(),
            PromptInput::Text(text) => {
                let Some(tokenizer) = &folder.tokenizer else {
                    return Err(FamilyError::missing_file(&folder.dir.join("tokenizer.json"), format!(
                        "{}: no tokenizer.json in the folder; add it, or give the prompt as --token-ids 1,2,3",
                        folder.dir.display()
                    )));
                };
                encode_prompt(tokenizer, text)
                    .map_err(|message| FamilyError::request("prompt", message))?
            }
        };
        if !config.unread_keys.is_empty() {
            tracing::warn!(
                "{}: keys {} are not read by transformers' {} class either, so they change nothing here",
                folder.config_path().display(),
                config.unread_keys.join(", "),
                model_type
            );
        }
        let mut decoder = Decoder::new(
            request.index,
            config,
            prompt,
            input.sampling,
            extras.headers_only,
        )?;
        decoder.hint = input.hint;
        decoder.expert_policy = extras.moe.policy;
        decoder.expert_slots = extras.moe.slots;
        Ok(decoder)
    }
}

/// A prompt's token ids, as the folder's tokenizer makes them (special tokens such as
/// a beginning-of-text marker included, as the file configures).
fn encode_prompt(path: &Path, text: &str) -> Result<Vec<u32>, String> {
    let tokenizer = crate::families::tokenizer_json::read(path).map_err(|error| {
        format!(
            "{}: is not a tokenizer Hugging Face's tokenizers can read ({error})",
            path.display()
        )
    })?;
    let encoding = tokenizer.encode(text, true).map_err(|error| {
        format!(
            "{}: could not tokenize the prompt ({error})",
            path.display()
        )
    })?;
    Ok(encoding.get_ids().to_vec())
}

impl Facts for Decoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Decoder
    }

    fn describe(&self) -> &'static str {
        self.config.variant.describe()
    }

    fn layout(&self) -> &ModelLayout {
        &self.weights.placement.layout
    }

    fn order(&self) -> Vec<BlockId> {
        (0..=self.weights.head_block()).map(BlockId).collect()
    }

    fn kv_cache(&self) -> Option<KvCache> {
        Some(KvCache {
            bytes_per_token: self.kv_bytes_per_token(),
            prompt_tokens: self.prompt.len() as u64,
            page_tokens: KV_PAGE_TOKENS as u64,
        })
    }

    /// The sequence of a run of `steps` steps: the prompt, then one token a step after
    /// the first.
    fn refuse_steps(&self, steps: u64) -> Option<String> {
        let tokens = self.prompt.len() + steps.saturating_sub(1) as usize;
        self.config.refuse_sequence(tokens).map(|refusal| {
            format!(
                "{refusal}; lower --max-tokens (at most {} with this prompt of {} tokens)",
                (self.config.sequence_limit() + 1).saturating_sub(self.prompt.len()),
                self.prompt.len()
            )
        })
    }

    fn host_table_bytes(&self) -> u64 {
        Decoder::host_table_bytes(self)
    }

    /// MoE: the dense blocks (layers and head, used by every token) and the experts
    /// the router picks from.
    fn experts(&self) -> Option<ExpertNeeds> {
        let experts = self.config.experts.as_ref()?;
        let layout = Facts::layout(self);
        let dense: Vec<u64> = self
            .order()
            .into_iter()
            .filter_map(|block| layout.block(block))
            .map(|block| block.bytes)
            .collect();
        Some(ExpertNeeds {
            dense_total_bytes: dense.iter().map(|&bytes| arena_bytes(bytes)).sum(),
            dense_block_bytes: dense.iter().copied().max().unwrap_or(0),
            expert_bytes: self.expert_bytes()?,
            experts: (experts.sparse_layers().count() * experts.count) as u64,
            per_layer: experts.count as u64,
            top_k: experts.top_k as u64,
            slots: self.expert_slots,
            policy: self.expert_policy,
        })
    }

    fn experts_of(&self, block: BlockId) -> Vec<BlockId> {
        let layer = block.index();
        if layer >= self.config.layers {
            return Vec::new();
        }
        self.expert_blocks(layer)
    }

    fn takes_lora(&self) -> bool {
        true
    }

    fn place(&self, _index: &ModelIndex, tensor: usize) -> Option<(usize, TensorSlot)> {
        Decoder::place(self, tensor)
    }

    fn reference_key(&self, step: u64) -> u64 {
        step
    }

    fn reference_is_sequential(&self) -> bool {
        true
    }
}
