//! From what the user pointed at to a workload: a Hugging Face folder of a supported
//! family (computed), a generated demo model (computed), or a bare checkpoint (its
//! bytes checked, nothing computed).

use std::path::Path;

use crate::families::bert::{self, EmbeddingPlacement, Encoder, Tokens};
use crate::families::linear_stack::LinearStack;
use crate::families::llama::{Decoder, DecoderConfig, ExpertHint, Sampling, DECODER_FAMILIES};
use crate::families::lora_set::LoraSet;
use crate::families::moe::MoeLayout;
use crate::families::moe::MoeRun;
use crate::families::stream_verify::StreamVerify;
use crate::lora::LoraSpec;
use crate::model::demo::DemoSpec;
use crate::model::demo_moe::MoeSpec;
use crate::model::{ModelFolder, ModelIndex};
use crate::run::driver::{LoraPhase, Model, Workload};
use crate::settings::Settings;

use super::{Extras, RunError, WorkloadKind};

/// The model families stagehand computes, by `config.json` `model_type`.
pub const SUPPORTED_FAMILIES: &[&str] = &["bert", "llama", "mistral", "qwen2", "mixtral"];

/// The prompt `stagehand run` gives a decoder when none is given.
pub const BUILT_IN_PROMPT: &str = "The quick brown fox jumps over the lazy dog. Then it";

/// What a decoder run generates from.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderInput {
    pub prompt: PromptInput,
    pub sampling: Sampling,
    pub hint: ExpertHint,
}

#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    Text(String),
    /// Token ids given directly (`--token-ids`), for folders without `tokenizer.json`.
    TokenIds(Vec<u32>),
}

/// Sentences `stagehand run` embeds with an encoder when no text is given: the two
/// of the sentence-transformers similarity example first.
pub const BUILT_IN_SENTENCES: &[&str] = &[
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome.",
    "A man is riding a horse.",
    "Two men pushed carts through the woods.",
    "A woman is playing violin.",
    "The cat sits outside.",
    "Weights stream from disk to pinned memory to the device just ahead of compute.",
];

/// What an encoder run embeds.
#[derive(Debug, Clone, PartialEq)]
pub enum EncoderInput {
    Texts(Vec<String>),
    /// Token ids given directly (`--token-ids`), for folders without `tokenizer.json`.
    TokenIds(Vec<Vec<u32>>),
}

/// A model opened for a run, with its workload.
pub struct Prepared {
    pub index: ModelIndex,
    pub workload: Workload,
    pub is_demo: bool,
    pub folder: Option<ModelFolder>,
    /// Texts that were longer than the model takes, by position (encoders).
    pub truncated_texts: Vec<usize>,
}

impl Prepared {
    /// Bytes the session streams: the layout's, which may leave out tensors the
    /// forward pass never reads or keeps on the host.
    pub fn streamed_model_bytes(&self) -> u64 {
        self.workload.layout().total_bytes()
    }

    /// Device memory a run of `steps` steps reserves beside the weights: a decoder's KV
    /// cache for its prompt and tokens, in whole pages.
    pub fn activation_bytes(&self, steps: u64) -> u64 {
        match &self.workload.model {
            Model::Decoder(decoder) => {
                let tokens = decoder.prompt.len() as u64 + steps;
                let page = crate::families::llama::KV_PAGE_TOKENS as u64;
                tokens.div_ceil(page) * page * decoder.kv_bytes_per_token()
            }
            _ => 0,
        }
    }

    /// The least VRAM budget the plan accepts at prefetch depth `depth` under
    /// `policy` (the planner's own minimum: a ring of `depth + 1` slots of the largest
    /// streamed block beside the blocks too large to stream — an `lm_head` many times
    /// a layer's size stays resident rather than size every slot — plus an expert
    /// cache of 2 × top-k slots for MoE models), and the budget that holds every block.
    pub fn plan_minimum_bytes(
        &self,
        depth: u32,
        policy: stagehand_actors::ResidencyPolicy,
    ) -> (u64, u64) {
        let align = |bytes: u64| bytes.div_ceil(256) * 256;
        let layout = self.workload.layout();
        let order = self.workload.order();
        let in_order = |index: usize| order.contains(&stagehand_actors::BlockId(index as u32));
        let experts: Vec<u64> = layout
            .blocks
            .iter()
            .enumerate()
            .filter(|(index, _)| !in_order(*index))
            .map(|(_, block)| align(block.bytes))
            .collect();
        let expert_floor = match &self.workload.model {
            Model::Moe(run) => 2 * u64::from(run.model.spec.top_k),
            Model::Decoder(decoder) => decoder.config.experts.map_or(0, |e| 2 * e.top_k as u64),
            _ => 0,
        } * experts.iter().copied().max().unwrap_or(0);
        let total: u64 = layout.blocks.iter().map(|block| align(block.bytes)).sum();
        let dense_minimum = stagehand_actors::StepOrder::new(order.clone(), layout.blocks.len())
            .map_or(0, |steps| {
                stagehand_actors::VramPlan::minimum_capacity_bytes(layout, &steps, depth, policy)
            });
        ((dense_minimum + expert_floor).min(total), total)
    }

    /// A one-line name of what runs, for summaries.
    pub fn describe(&self) -> &'static str {
        match &self.workload.model {
            Model::LinearStack(_) => "linear-stack",
            Model::Moe(_) => "moe",
            Model::StreamVerify(_) => "stream-verify",
            Model::Encoder(_) => "bert encoder",
            Model::Decoder(decoder) if decoder.config.experts.is_some() => "mixtral decoder",
            Model::Decoder(_) => "llama decoder",
        }
    }
}

pub fn prepare(
    model: &Path,
    kind: WorkloadKind,
    batch: usize,
    settings: &Settings,
    is_demo: bool,
) -> Result<Prepared, RunError> {
    prepare_with(model, kind, batch, settings, is_demo, &Extras::default())
}

/// As [`prepare`], with LoRA adapters, MoE options or an encoder's texts.
pub fn prepare_with(
    model: &Path,
    kind: WorkloadKind,
    batch: usize,
    settings: &Settings,
    is_demo: bool,
    extras: &Extras,
) -> Result<Prepared, RunError> {
    let bad = |error: &dyn std::fmt::Display| RunError::BadInput(error.to_string());
    let folder = ModelFolder::find(model).map_err(|error| bad(&error))?;
    let checkpoint = folder
        .as_ref()
        .map_or(model, |folder| folder.checkpoint.as_path());
    let index = ModelIndex::open(checkpoint, settings.block_pattern.as_deref())
        .map_err(|error| bad(&error))?;
    if index.blocks.is_empty() {
        return Err(RunError::BadInput(format!(
            "{}: the model has no tensors to stream",
            model.display()
        )));
    }
    let kind = resolve_kind(kind, &index, folder.as_ref())?;
    super::memory::check_largest_block(&index, settings)?;
    // The activations a batch needs, checked before they are allocated.
    let width = match kind {
        WorkloadKind::LinearStack => crate::model::demo::DemoSpec::from_metadata(&index.metadata)
            .map(|spec| u64::from(spec.dim)),
        WorkloadKind::Moe => {
            MoeSpec::from_metadata(&index.metadata).map(|spec| u64::from(spec.dim))
        }
        _ => None,
    };
    if let Some(dim) = width {
        super::memory::check_batch(batch, dim, settings)?;
    }
    if !extras.loras.is_empty() && matches!(kind, WorkloadKind::StreamVerify | WorkloadKind::Moe) {
        return Err(RunError::BadInput(
            "--lora applies to models stagehand computes with dense layers (the demo linear stack, BERT encoders); drop --lora for this model".to_string(),
        ));
    }
    let mut truncated_texts = Vec::new();
    let (model, lora) = match kind {
        WorkloadKind::LinearStack => {
            let stack = LinearStack::from_index(&index, batch).map_err(|error| bad(&error))?;
            let lora = lora_phase(&index, &extras.loras, stack.blocks(), &|tensor| {
                stack.place(&index, tensor)
            })?;
            (Model::LinearStack(stack), lora)
        }
        WorkloadKind::Moe => {
            let spec = MoeSpec::from_metadata(&index.metadata).ok_or_else(|| {
                RunError::BadInput(format!(
                    "{} is not a generated MoE model (no stagehand.kind = moe metadata); run `stagehand run --workload moe` without --model to use the demo one",
                    model.display()
                ))
            })?;
            let layout = MoeLayout::new(&index, spec).map_err(|error| bad(&error))?;
            let mut run =
                MoeRun::new(layout, batch, extras.moe.hint).map_err(|error| bad(&error))?;
            run.policy = extras.moe.policy;
            run.slots = extras.moe.slots;
            (Model::Moe(run), Vec::new())
        }
        WorkloadKind::Encoder => {
            let Some(folder) = folder.as_ref() else {
                return Err(RunError::BadInput(format!(
                    "{}: an encoder needs its Hugging Face folder (config.json beside the weights)",
                    model.display()
                )));
            };
            let (encoder, truncated) = open_encoder(folder, &index, batch, extras)?;
            truncated_texts = truncated;
            let lora = lora_phase(&index, &extras.loras, encoder.layout_len(), &|tensor| {
                encoder.place(tensor)
            })?;
            (Model::Encoder(Box::new(encoder)), lora)
        }
        WorkloadKind::Decoder => {
            let Some(folder) = folder.as_ref() else {
                return Err(RunError::BadInput(format!(
                    "{}: a decoder needs its Hugging Face folder (config.json beside the weights)",
                    model.display()
                )));
            };
            let decoder = open_decoder(folder, &index, extras)?;
            let lora = lora_phase(&index, &extras.loras, decoder.layout_len(), &|tensor| {
                decoder.place(tensor)
            })?;
            (Model::Decoder(Box::new(decoder)), lora)
        }
        WorkloadKind::StreamVerify | WorkloadKind::Auto => (
            Model::StreamVerify(
                StreamVerify::new(&index).map_err(|error| RunError::Failed(error.to_string()))?,
            ),
            Vec::new(),
        ),
    };
    // A generated demo model gets the demo's defaults (budgets that make both tiers
    // stream) however it was named: plainly or with --model.
    let is_demo = is_demo
        || DemoSpec::from_metadata(&index.metadata).is_some()
        || MoeSpec::from_metadata(&index.metadata).is_some();
    Ok(Prepared {
        index,
        workload: Workload { model, lora },
        is_demo,
        folder,
        truncated_texts,
    })
}

/// What `--workload auto` means for this model, and whether an explicit choice fits.
fn resolve_kind(
    kind: WorkloadKind,
    index: &ModelIndex,
    folder: Option<&ModelFolder>,
) -> Result<WorkloadKind, RunError> {
    let family_kind = matches!(kind, WorkloadKind::Encoder | WorkloadKind::Decoder);
    if kind != WorkloadKind::Auto && !family_kind {
        return Ok(kind);
    }
    if kind == WorkloadKind::Auto && MoeSpec::from_metadata(&index.metadata).is_some() {
        return Ok(WorkloadKind::Moe);
    }
    if kind == WorkloadKind::Auto && DemoSpec::from_metadata(&index.metadata).is_some() {
        return Ok(WorkloadKind::LinearStack);
    }
    let Some(folder) = folder else {
        if family_kind {
            return Err(RunError::BadInput(format!(
                "{}: no config.json beside the weights, so this is a bare checkpoint; a model family needs its Hugging Face folder (config.json, weights, tokenizer.json)",
                index.path.display()
            )));
        }
        return Ok(WorkloadKind::StreamVerify);
    };
    let found = match folder.model_type().as_deref() {
        Some("bert") => Some(WorkloadKind::Encoder),
        Some(kind) if DECODER_FAMILIES.contains(&kind) => Some(WorkloadKind::Decoder),
        _ => None,
    };
    match found {
        Some(found) if kind == WorkloadKind::Auto || kind == found => Ok(found),
        Some(found) => Err(RunError::BadInput(format!(
            "{}: this is {} model, not {}; use the command for its family (`embed` for encoders, `generate` for decoders)",
            folder.config_path().display(),
            if found == WorkloadKind::Encoder { "an encoder" } else { "a decoder" },
            if kind == WorkloadKind::Encoder { "an encoder" } else { "a decoder" }
        ))),
        None => Err(RunError::BadInput(format!(
            "{}: model_type {} is not a family stagehand computes yet (supported: {}); pass --workload stream-verify to stream and check its bytes without computing",
            folder.config_path().display(),
            folder.model_type().map_or("(none)".to_string(), |kind| format!("\"{kind}\"")),
            SUPPORTED_FAMILIES.join(", ")
        ))),
    }
}

/// The encoder over a folder, for the texts in `extras` (or the built-in sentences),
/// and which texts were truncated.
fn open_encoder(
    folder: &ModelFolder,
    index: &ModelIndex,
    batch: usize,
    extras: &Extras,
) -> Result<(Encoder, Vec<usize>), RunError> {
    let bad = |error: &dyn std::fmt::Display| RunError::BadInput(error.to_string());
    let config =
        bert::bert_config(&folder.config_path(), &folder.config).map_err(|error| bad(&error))?;
    let input = extras.encoder.clone().unwrap_or_else(|| {
        EncoderInput::Texts(BUILT_IN_SENTENCES.iter().map(|s| s.to_string()).collect())
    });
    let tokens: Vec<Tokens> = match &input {
        EncoderInput::Texts(texts) => {
            if texts.is_empty() {
                return Err(RunError::BadInput(
                    "no text to embed: give one or more texts, or --file".to_string(),
                ));
            }
            let Some(tokenizer) = &folder.tokenizer else {
                return Err(RunError::BadInput(format!(
                    "{}: no tokenizer.json in the folder; add it, or give token ids with --token-ids 101,7592,102",
                    folder.dir.display()
                )));
            };
            bert::tokenize(tokenizer, texts, config.max_positions).map_err(|error| bad(&error))?
        }
        EncoderInput::TokenIds(ids) => {
            if ids.is_empty() || ids.iter().any(Vec::is_empty) {
                return Err(RunError::BadInput(
                    "--token-ids: every text needs at least one id".to_string(),
                ));
            }
            bert::from_ids(ids, config.max_positions)
        }
    };
    let truncated = tokens
        .iter()
        .enumerate()
        .filter(|(_, text)| text.truncated)
        .map(|(position, _)| position)
        .collect();
    let embeddings = extras.embeddings;
    let encoder = Encoder::new(index, config, folder.sentence, &tokens, batch, embeddings)
        .map_err(|error| bad(&error))?;
    Ok((encoder, truncated))
}

/// The decoder over a folder, for the prompt in `extras` (or the built-in prompt).
fn open_decoder(
    folder: &ModelFolder,
    index: &ModelIndex,
    extras: &Extras,
) -> Result<Decoder, RunError> {
    let bad = |error: &dyn std::fmt::Display| RunError::BadInput(error.to_string());
    let model_type = folder.model_type().unwrap_or_default();
    let config = DecoderConfig::from_json(&folder.config_path(), &model_type, &folder.config)
        .map_err(|error| bad(&error))?;
    let input = extras.decoder.clone().unwrap_or(DecoderInput {
        prompt: PromptInput::Text(BUILT_IN_PROMPT.to_string()),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    });
    let prompt = match &input.prompt {
        PromptInput::TokenIds(ids) => ids.clone(),
        PromptInput::Text(text) => {
            let Some(tokenizer) = &folder.tokenizer else {
                return Err(RunError::BadInput(format!(
                    "{}: no tokenizer.json in the folder; add it, or give the prompt as --token-ids 1,2,3",
                    folder.dir.display()
                )));
            };
            encode_prompt(tokenizer, text).map_err(|error| bad(&error))?
        }
    };
    let mut decoder = Decoder::new(index, config, prompt, input.sampling, extras.headers_only)
        .map_err(|error| bad(&error))?;
    decoder.hint = input.hint;
    decoder.expert_policy = extras.moe.policy;
    decoder.expert_slots = extras.moe.slots;
    Ok(decoder)
}

/// A prompt's token ids, as the folder's tokenizer makes them (special tokens such as
/// a beginning-of-text marker included, as the file configures).
fn encode_prompt(path: &Path, text: &str) -> Result<Vec<u32>, String> {
    let tokenizer = tokenizers::Tokenizer::from_file(path).map_err(|error| {
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

/// One LoRA phase from step 0 with `specs` placed by `place`, or none.
fn lora_phase(
    index: &ModelIndex,
    specs: &[LoraSpec],
    blocks: usize,
    place: &crate::families::lora_set::Placement<'_>,
) -> Result<Vec<LoraPhase>, RunError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let set = LoraSet::load(index, specs, blocks, place)
        .map_err(|error| RunError::BadInput(error.to_string()))?;
    Ok(vec![LoraPhase { from_step: 0, set }])
}

/// Texts read from `--file`: one per line, blank lines skipped.
pub fn texts_from_file(path: &Path) -> Result<Vec<String>, RunError> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| RunError::BadInput(format!("{}: {error}", path.display())))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect())
}

/// `--token-ids 101,2023,102` (one text; repeat the flag for more).
pub fn parse_token_ids(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(|id| {
            id.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{id}` is not a token id; write ids as 101,2023,102"))
        })
        .collect()
}

impl EmbeddingPlacement {
    pub fn describe(self) -> &'static str {
        match self {
            EmbeddingPlacement::Auto => "auto",
            EmbeddingPlacement::Host => "host",
            EmbeddingPlacement::Device => "device",
        }
    }
}
