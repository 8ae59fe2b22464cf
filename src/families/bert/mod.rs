//! BERT-family encoders (`model_type: bert`: BertModel checkpoints and
//! sentence-transformers folders such as all-MiniLM-L6-v2; `roberta` and `xlm-roberta`,
//! the same layers with positions counted past the padding id — see
//! [`config::Variant`]), written once against the compute port.
//!
//! One step embeds one batch of texts: word + position + token-type embeddings and a
//! LayerNorm; per encoder layer, multi-head self-attention under the padding mask, the
//! output projection, residual and post-LayerNorm, the exact-erf GELU MLP, residual and
//! LayerNorm; then the sentence head (mean over real tokens or CLS, L2-normalised when
//! the folder has a Normalize module).
//!
//! The word-embedding table is a gather, not a GEMM: a step needs only its tokens'
//! rows. When those rows are fewer bytes than the table (always, for real batches:
//! 256 tokens of MiniLM are 384 KiB of a 45 MiB table), the table stays in host memory
//! and only the gathered rows go to the device, as activations (what llama.cpp does
//! with token embeddings). Otherwise the table streams with the embeddings block and
//! the gather runs on the device. [`EmbeddingPlacement`] overrides the choice.

mod config;
mod demo;
mod open;
mod output;
mod pool;
mod requests;
mod sentence;
mod similarity;
mod tokens;
mod weights;

use std::path::Path;

use stagehand_actors::BlockId;

pub use config::{BertConfig, Variant};
pub use demo::{write_bert_folder, write_bert_lora, BertDemo, BertPreset, BertShape};
pub use output::embeddings_in_input_order;
pub use requests::input_tokens;
pub use sentence::{MaxLength, Pooling, SentenceFolder, SentenceHead};
pub use similarity::{cosine, similarity_table};
pub use tokens::{batches, from_ids, length_order, tokenize, TextLimits, TokenBatch, Tokens};

use self::weights::{EncoderWeights, Linear, Norm};
use super::blocks::{Blocks, Held};
use super::family::{Facts, Family, StepOutput};
use super::host_table::HostTable;
use super::FamilyError;
use crate::compute::{Attention, Compute, Mask, TensorSlot};
use crate::model::ModelIndex;

/// Where the word-embedding table lives (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum EmbeddingPlacement {
    /// Host when a batch's rows are fewer bytes than the table, else device.
    #[default]
    Auto,
    /// The table stays in host memory; gathered rows go to the device.
    Host,
    /// The table streams with the embeddings block; the gather runs on the device.
    Device,
}

/// A BERT encoder ready to run batches of texts.
pub struct Encoder {
    pub config: BertConfig,
    weights: EncoderWeights,
    head: SentenceHead,
    host_table: Option<HostTable>,
    inputs: Vec<StepInput>,
    /// The input position of each text in the order the steps embed them.
    order: Vec<usize>,
    /// Texts longer than the model takes, cut short as the tokenizer says (by position).
    truncated_texts: Vec<usize>,
    /// How the folder's texts are cut and cased (kept for texts given later: `serve`).
    limits: TextLimits,
}

/// One step's batch with its position ids.
struct StepInput {
    batch: TokenBatch,
    positions: Vec<u32>,
}

/// Activations of one batch shape, on the compute device.
pub struct EncoderState<C: Compute> {
    rows: usize,
    tensors: Option<Activations<C>>,
    /// Host scratch for gathered word rows.
    gathered: Vec<f32>,
}

struct Activations<C: Compute> {
    x: C::Tensor,
    q: C::Tensor,
    k: C::Tensor,
    v: C::Tensor,
    context: C::Tensor,
    out: C::Tensor,
    hidden: C::Tensor,
    low_rank: C::Tensor,
}

impl Encoder {
    /// An encoder over `index` (a checkpoint of `model_type: bert`), for `tokens`
    /// grouped into batches of `batch` texts.
    pub fn new(
        index: &ModelIndex,
        config: BertConfig,
        head: SentenceHead,
        tokens: &[Tokens],
        batch: usize,
        embeddings: EmbeddingPlacement,
    ) -> Result<Self, FamilyError> {
        let (inputs, order) = step_inputs(&config, tokens, batch)?;
        let largest_rows = inputs
            .iter()
            .map(|input| input.batch.ids.len())
            .max()
            .unwrap_or(0);
        let word_bytes = (config.vocab * config.hidden) as u64 * 4;
        let gathered_bytes = largest_rows as u64 * config.hidden as u64 * 4;
        let word_streams = match embeddings {
            EmbeddingPlacement::Auto => gathered_bytes >= word_bytes,
            EmbeddingPlacement::Host => false,
            EmbeddingPlacement::Device => true,
        };
        let weights = EncoderWeights::place(index, &config, word_streams)?;
        let host_table = if word_streams {
            None
        } else {
            Some(HostTable::read(index, weights.word_tensor)?)
        };
        let limits = TextLimits {
            max_positions: config.usable_positions(),
            max_length: None,
            lower_case: false,
        };
        Ok(Self {
            config,
            weights,
            head,
            host_table,
            truncated_texts: truncated(tokens),
            limits,
            inputs,
            order,
        })
    }

    /// Bytes of the word table kept in host memory (0 when it streams).
    pub fn host_table_bytes(&self) -> u64 {
        self.host_table.as_ref().map_or(0, HostTable::bytes)
    }

    /// Bytes of gathered embedding rows sent to the device per step (largest batch).
    pub fn gathered_bytes_per_step(&self) -> u64 {
        if self.host_table.is_none() {
            return 0;
        }
        let rows = self.inputs.iter().map(|input| input.batch.ids.len()).max();
        rows.unwrap_or(0) as u64 * self.config.hidden as u64 * 4
    }

    pub fn head(&self) -> &SentenceHead {
        &self.head
    }

    /// Steps needed to embed every text once.
    pub fn batches(&self) -> usize {
        self.inputs.len()
    }

    /// The shape step `step` embeds: (sequences, padded length), for descriptions of
    /// the work (`sim`). Steps cycle through the batches.
    pub fn batch_shape(&self, step: u64) -> (usize, usize) {
        self.inputs
            .get(self.reference_key(step) as usize)
            .map_or((0, 0), |input| (input.batch.sequences, input.batch.length))
    }

    /// Blocks of the encoder's layout: the embeddings, then one per layer.
    pub fn layout_len(&self) -> usize {
        self.weights.placement.layout.len()
    }

    /// Where a tensor of the index sits, for LoRA targets.
    pub fn place(&self, tensor: usize) -> Option<(usize, TensorSlot)> {
        self.weights.placement.slot_of(tensor)
    }

    /// Floating-point operations of the largest step (GEMMs and attention).
    pub fn flops_per_step(&self) -> f64 {
        let config = &self.config;
        let (hidden, inner) = (config.hidden as f64, config.intermediate as f64);
        let input = self.inputs.iter().max_by_key(|input| input.batch.ids.len());
        let Some(batch) = input.map(|input| &input.batch) else {
            return 0.0;
        };
        let rows = batch.ids.len() as f64;
        let length = batch.length as f64;
        let per_layer = 2.0 * rows * (4.0 * hidden * hidden + 2.0 * hidden * inner)
            + 4.0 * rows * length * hidden;
        per_layer * config.layers as f64
    }

    fn activations<C: Compute>(
        &self,
        compute: &C,
        rows: usize,
    ) -> Result<Activations<C>, FamilyError> {
        let hidden = self.config.hidden;
        Ok(Activations {
            x: compute.tensor(rows, hidden)?,
            q: compute.tensor(rows, hidden)?,
            k: compute.tensor(rows, hidden)?,
            v: compute.tensor(rows, hidden)?,
            context: compute.tensor(rows, hidden)?,
            out: compute.tensor(rows, hidden)?,
            hidden: compute.tensor(rows, self.config.intermediate)?,
            low_rank: compute.tensor(rows, 1)?,
        })
    }

    /// Word + position + token-type embeddings, then their LayerNorm, into `x`.
    fn embed<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        input: &StepInput,
        state: &mut EncoderState<C>,
        blocks: &mut B,
    ) -> Result<(), FamilyError> {
        let slots = self.weights.embeddings;
        let Some(acts) = state.tensors.as_mut() else {
            return Err(FamilyError::internal(
                "activations were not allocated".into(),
            ));
        };
        let batch = &input.batch;
        match &self.host_table {
            Some(table) => {
                table.gather(&batch.ids, &mut state.gathered)?;
                compute.write(&mut acts.out, &state.gathered)?;
            }
            None => {
                state.gathered.clear();
                state
                    .gathered
                    .resize(batch.ids.len() * self.config.hidden, 0.0);
                compute.write(&mut acts.out, &state.gathered)?;
            }
        }
        let held = blocks.acquire(compute, BlockId(0))?;
        let outcome = (|| {
            let view = held.view(compute);
            if let Some(word) = &slots.word {
                compute.gather_add(&view.weight(word)?, &batch.ids, &mut acts.out)?;
            }
            compute.gather_add(
                &view.weight(&slots.position)?,
                &input.positions,
                &mut acts.out,
            )?;
            compute.gather_add(
                &view.weight(&slots.token_type)?,
                &batch.type_ids,
                &mut acts.out,
            )?;
            norm(
                compute,
                &held,
                &slots.norm,
                self.config.layer_norm_eps,
                &acts.out,
                &mut acts.x,
            )
        })();
        blocks.release(compute, held)?;
        outcome
    }

    /// One encoder layer on `x`.
    fn layer<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        layer: usize,
        batch: &TokenBatch,
        acts: &mut Activations<C>,
        blocks: &mut B,
    ) -> Result<(), FamilyError> {
        let slots = &self.weights.layers[layer];
        let eps = self.config.layer_norm_eps;
        let held = blocks.acquire(compute, BlockId(layer as u32 + 1))?;
        let lora = blocks.lora();
        let outcome = (|| {
            let Activations {
                x,
                q,
                k,
                v,
                context,
                out,
                hidden,
                low_rank,
            } = acts;
            linear(compute, &held, lora, &slots.query, x, q, low_rank)?;
            linear(compute, &held, lora, &slots.key, x, k, low_rank)?;
            linear(compute, &held, lora, &slots.value, x, v, low_rank)?;
            let shape = Attention {
                sequences: batch.sequences,
                sequence_length: batch.length,
                heads: self.config.heads,
                kv_heads: self.config.heads,
                head_dim: self.config.head_dim(),
                scale: 1.0 / (self.config.head_dim() as f32).sqrt(),
                mask: Mask::Padding(&batch.lengths),
            };
            compute.attention(q, k, v, &shape, context)?;
            linear(
                compute,
                &held,
                lora,
                &slots.attention_out,
                context,
                out,
                low_rank,
            )?;
            compute.add(out, x)?;
            norm(compute, &held, &slots.attention_norm, eps, out, x)?;
            linear(
                compute,
                &held,
                lora,
                &slots.intermediate,
                x,
                hidden,
                low_rank,
            )?;
            compute.gelu_erf(hidden)?;
            linear(compute, &held, lora, &slots.output, hidden, out, low_rank)?;
            compute.add(out, x)?;
            norm(compute, &held, &slots.output_norm, eps, out, x)
        })();
        blocks.release(compute, held)?;
        outcome
    }
}

/// `y ← x·Wᵀ + b`, plus the low-rank LoRA updates of a streamed weight.
fn linear<C: Compute>(
    compute: &C,
    held: &Held<C::Block>,
    lora: Option<&super::lora_set::LoraSet>,
    slots: &Linear,
    x: &C::Tensor,
    y: &mut C::Tensor,
    scratch: &mut C::Tensor,
) -> Result<(), FamilyError> {
    let view = held.view(compute);
    compute.linear(
        x,
        &view.weight(&slots.weight)?,
        Some(&view.weight(&slots.bias)?),
        y,
    )?;
    for (factors, scale) in held.low_rank(compute, lora, &slots.weight, 0..slots.weight.rows)? {
        compute.low_rank_add(x, &factors, scale, scratch, y)?;
    }
    Ok(())
}

fn norm<C: Compute>(
    compute: &C,
    held: &Held<C::Block>,
    slots: &Norm,
    eps: f32,
    x: &C::Tensor,
    y: &mut C::Tensor,
) -> Result<(), FamilyError> {
    let view = held.view(compute);
    compute.layer_norm(
        x,
        &view.weight(&slots.weight)?,
        &view.weight(&slots.bias)?,
        eps,
        y,
    )?;
    Ok(())
}

impl Family for Encoder {
    type State<C: Compute> = EncoderState<C>;

    fn start<C: Compute>(&self, _compute: &C) -> Result<EncoderState<C>, FamilyError> {
        Ok(EncoderState {
            rows: 0,
            tensors: None,
            gathered: Vec::new(),
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut EncoderState<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let input = &self.inputs[self.reference_key(step) as usize];
        let rows = input.batch.ids.len();
        if state.tensors.is_none() || state.rows != rows {
            state.tensors = Some(self.activations(compute, rows)?);
            state.rows = rows;
        }
        self.embed(compute, input, state, blocks)?;
        let Some(acts) = state.tensors.as_mut() else {
            return Err(FamilyError::internal(
                "activations were not allocated".into(),
            ));
        };
        for layer in 0..self.config.layers {
            self.layer(compute, layer, &input.batch, acts, blocks)?;
        }
        let states = compute.read(&acts.x)?;
        Ok(StepOutput {
            output: Some(pool::pool(
                &self.head,
                &states,
                &input.batch,
                self.config.hidden,
            )),
            ..StepOutput::default()
        })
    }
}

/// Reads `config.json` of a BERT folder.
pub fn bert_config(path: &Path, config: &serde_json::Value) -> Result<BertConfig, FamilyError> {
    BertConfig::from_json(path, config)
}

/// The steps of `tokens`, `batch` texts a step: sorted shortest first (the first step,
/// which `verify = first` computes twice, is the cheapest), each batch padded to its
/// own longest text; and the input
/// position of each text in the order the steps embed them.
fn step_inputs(
    config: &BertConfig,
    tokens: &[Tokens],
    batch: usize,
) -> Result<(Vec<StepInput>, Vec<usize>), FamilyError> {
    if tokens.is_empty() {
        return Err(FamilyError::request(
            "texts",
            "no text to embed: give one or more texts (or --file)".into(),
        ));
    }
    if let Some((text, id)) = tokens.iter().enumerate().find_map(|(text, tokens)| {
        tokens
            .ids
            .iter()
            .find(|&&id| id as usize >= config.vocab)
            .map(|&id| (text, id))
    }) {
        return Err(FamilyError::request(
            "texts",
            format!(
                "text {}: token id {id} is outside the model's vocabulary of {}",
                text + 1,
                config.vocab
            ),
        ));
    }
    let order = length_order(tokens);
    let inputs = batches(tokens, &order, batch, config.pad_token_id)
        .into_iter()
        .map(|batch| {
            let positions = config.position_ids(&batch.ids, batch.length);
            StepInput { batch, positions }
        })
        .collect();
    Ok((inputs, order))
}

/// The input positions of the texts cut short.
fn truncated(tokens: &[Tokens]) -> Vec<usize> {
    (tokens.iter().enumerate())
        .filter(|(_, text)| text.truncated)
        .map(|(position, _)| position)
        .collect()
}
