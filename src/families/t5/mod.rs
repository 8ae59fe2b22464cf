//! T5's encoder (`T5EncoderModel`, `model_type: t5`, v1.1 as Flux uses T5-XXL): the
//! per-token prompt states Flux attends to. Written once against the compute port.
//!
//! One step encodes a batch of prompts, each cut and padded to the run's prompt
//! length (`max_sequence_length`, 512 for Flux dev) as diffusers pads them, with no
//! attention mask (FluxPipeline passes none: the padding is attended to), or, asked
//! for with [`PaddingMasked`](crate::families::PaddingMasked), as WanPipeline encodes
//! with umT5: the padded keys masked and the padded rows of the states zero. The token
//! embeddings (`shared`); per block, an RMS norm (no mean, no bias) before
//! self-attention with no score scaling and a learned position bias, and before the
//! gated feed-forward `wo(gelu_tanh(wi_0·x) · wi_1·x)`, each added to the residual;
//! the final RMS norm. The position bias is bucketed from the key's offset to the
//! query (half the buckets per direction, exact below a quarter of them, then
//! logarithmic up to `relative_attention_max_distance`), gathered from the first
//! block's `relative_attention_bias` table and shared by every block.
//!
//! umT5 (`UMT5EncoderModel`, `model_type: umt5`, WAN's text encoder) is the same
//! encoder with its own `relative_attention_bias` table in every block, each
//! gathered over the same buckets when its block runs.
//!
//! Blocks: the token table, one per T5 block, and the final norm. FP8 checkpoints
//! with per-tensor scales (`t5xxl_fp8_e4m3fn_scaled`) compute on their stored bytes.

mod demo;
mod open;

pub use demo::{Umt5Demo, Umt5Preset};

use stagehand_actors::{BlockId, ModelLayout};

use super::blocks::{Blocks, Held};
use super::family::{Facts, Family, StepOutput};
use super::inputs::WorkloadKind;
use super::placement::Placement;
use super::prompt_tokens::{PromptBatches, PromptIds};
use super::walk::{self, Tensors};
use super::FamilyError;
use crate::compute::pipeline::BiasedAttention;
use crate::compute::{Compute, TensorSlot};
use crate::model::ModelIndex;

/// The sizes of a T5 encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct T5Config {
    pub vocab: usize,
    pub model: usize,
    /// Per-head width (`d_kv`); heads × d_kv need not be `d_model`.
    pub head_dim: usize,
    pub feed_forward: usize,
    pub layers: usize,
    pub heads: usize,
    pub buckets: usize,
    pub max_distance: usize,
    pub eps: f32,
    /// umT5: every block has its own position bias table (T5: only the first).
    pub bias_per_layer: bool,
}

impl T5Config {
    fn inner(&self) -> usize {
        self.heads * self.head_dim
    }
}

#[derive(Debug, Clone, Copy)]
struct LayerSlots {
    attention_norm: TensorSlot,
    q: TensorSlot,
    k: TensorSlot,
    v: TensorSlot,
    o: TensorSlot,
    feed_forward_norm: TensorSlot,
    wi_0: TensorSlot,
    wi_1: TensorSlot,
    wo: TensorSlot,
    /// `[buckets, heads]`: in the first block, and in every block of umT5.
    position_bias: Option<TensorSlot>,
}

/// Where every weight is.
struct Slots {
    shared: TensorSlot,
    layers: Vec<LayerSlots>,
    final_norm: TensorSlot,
}

/// The encoder's structure, by transformers' names: the token table, a block per T5
/// block (the first with the position bias table, every one in umT5), the final norm.
struct Walk<'w> {
    tensors: &'w mut dyn Tensors,
    config: &'w T5Config,
}

impl Walk<'_> {
    fn layer(&mut self, layer: usize) -> Result<LayerSlots, FamilyError> {
        let config = self.config;
        let (model, inner, ff) = (config.model, config.inner(), config.feed_forward);
        let at = format!("encoder.block.{layer}");
        self.tensors.block(&at);
        let attention = format!("{at}.layer.0.SelfAttention");
        let feed_forward = format!("{at}.layer.1.DenseReluDense");
        let has_bias = layer == 0 || config.bias_per_layer;
        let mut weight = |name: String, shape: &[usize]| self.tensors.tensor(&name, shape);
        let slots = LayerSlots {
            attention_norm: weight(format!("{at}.layer.0.layer_norm.weight"), &[model])?,
            q: weight(format!("{attention}.q.weight"), &[inner, model])?,
            k: weight(format!("{attention}.k.weight"), &[inner, model])?,
            v: weight(format!("{attention}.v.weight"), &[inner, model])?,
            o: weight(format!("{attention}.o.weight"), &[model, inner])?,
            feed_forward_norm: weight(format!("{at}.layer.1.layer_norm.weight"), &[model])?,
            wi_0: weight(format!("{feed_forward}.wi_0.weight"), &[ff, model])?,
            wi_1: weight(format!("{feed_forward}.wi_1.weight"), &[ff, model])?,
            wo: weight(format!("{feed_forward}.wo.weight"), &[model, ff])?,
            position_bias: None,
        };
        let bias = format!("{attention}.relative_attention_bias.weight");
        let position_bias = if has_bias {
            Some(weight(bias, &[config.buckets, config.heads])?)
        } else {
            None
        };
        Ok(LayerSlots {
            position_bias,
            ..slots
        })
    }

    fn slots(mut self, shared: &str) -> Result<Slots, FamilyError> {
        let config = self.config;
        self.tensors.block("shared");
        let shared = self.tensors.tensor(shared, &[config.vocab, config.model])?;
        if config.layers == 0 {
            return Err(FamilyError::config(
                std::path::Path::new("config.json"),
                Some("num_layers"),
                "a T5 encoder needs at least one block".into(),
            ));
        }
        let layers = (0..config.layers)
            .map(|layer| self.layer(layer))
            .collect::<Result<Vec<_>, _>>()?;
        self.tensors.block("final_layer_norm");
        Ok(Slots {
            shared,
            layers,
            final_norm: self
                .tensors
                .tensor("encoder.final_layer_norm.weight", &[config.model])?,
        })
    }
}

/// A T5 encoder over its prompts.
pub struct T5Encoder {
    pub config: T5Config,
    placement: Placement,
    slots: Slots,
    prompts: PromptBatches,
    /// Every prompt's tokens.
    length: usize,
    /// The padding is masked and zeroed ([`crate::families::PaddingMasked`]).
    masked: bool,
    /// Each (query, key) pair's bucket, row-major.
    buckets: Vec<u32>,
}

/// A step's activations.
pub struct T5State<C: Compute> {
    sequences: usize,
    tensors: Option<Activations<C>>,
}

struct Activations<C: Compute> {
    x: C::Tensor,
    normed: C::Tensor,
    q: C::Tensor,
    k: C::Tensor,
    v: C::Tensor,
    context: C::Tensor,
    out: C::Tensor,
    gate: C::Tensor,
    up: C::Tensor,
    bias: C::Tensor,
}

/// The bucket of a key `offset` positions after its query (negative: before), as
/// T5's bidirectional `_relative_position_bucket` computes it — the logarithmic part
/// in f32, as PyTorch does, so the buckets agree at their edges.
pub fn bucket(offset: i64, buckets: usize, max_distance: usize) -> u32 {
    let half = (buckets / 2) as i64;
    let mut bucket = if offset > 0 { half } else { 0 };
    let distance = offset.abs();
    let max_exact = half / 2;
    if distance < max_exact {
        return (bucket + distance) as u32;
    }
    let log_ratio = (distance as f32 / max_exact as f32).ln()
        / ((max_distance as f64 / max_exact as f64).ln() as f32)
        * (half - max_exact) as f32;
    bucket += (max_exact + log_ratio as i64).min(half - 1);
    bucket as u32
}

impl T5Encoder {
    fn new(
        index: &ModelIndex,
        config: T5Config,
        prompts: Vec<PromptIds>,
        (length, masked): (usize, bool),
        batch: usize,
    ) -> Result<Self, FamilyError> {
        let prompts = PromptBatches::new(prompts, batch)?;
        if let Some(id) = prompts.outside(config.vocab) {
            return Err(FamilyError::request(
                "token_ids",
                format!(
                    "token id {id} is outside the text encoder's vocabulary of {}",
                    config.vocab
                ),
            ));
        }
        let shared = ["shared.weight", "encoder.embed_tokens.weight"]
            .into_iter()
            .find(|name| index.tensor(name).is_some())
            .unwrap_or("shared.weight");
        let (placement, slots) = walk::place(index, |tensors| {
            Walk {
                tensors,
                config: &config,
            }
            .slots(shared)
        })?;
        let buckets = (0..length * length)
            .map(|pair| {
                let (query, key) = ((pair / length) as i64, (pair % length) as i64);
                bucket(key - query, config.buckets, config.max_distance)
            })
            .collect();
        Ok(Self {
            slots,
            placement,
            config,
            prompts,
            length,
            masked,
            buckets,
        })
    }

    fn tensors<C: Compute>(&self, compute: &C, rows: usize) -> Result<Activations<C>, FamilyError> {
        let (model, inner, ff) = (
            self.config.model,
            self.config.inner(),
            self.config.feed_forward,
        );
        Ok(Activations {
            x: compute.tensor(rows, model)?,
            normed: compute.tensor(rows, model)?,
            q: compute.tensor(rows, inner)?,
            k: compute.tensor(rows, inner)?,
            v: compute.tensor(rows, inner)?,
            context: compute.tensor(rows, inner)?,
            out: compute.tensor(rows, model)?,
            gate: compute.tensor(rows, ff)?,
            up: compute.tensor(rows, ff)?,
            bias: compute.tensor(self.length * self.length, self.config.heads)?,
        })
    }

    fn layer<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        (layer, keys): (usize, &[usize]),
        t: &mut Activations<C>,
        blocks: &mut B,
    ) -> Result<(), FamilyError> {
        let slots = &self.slots.layers[layer];
        let eps = self.config.eps;
        let held = blocks.acquire(compute, BlockId(layer as u32 + 1))?;
        let outcome = (|| {
            let pipeline = compute.pipeline()?;
            let view = held.view(compute);
            // T5's first block fills the bias every block uses; umT5's each its own.
            if let Some(position_bias) = &slots.position_bias {
                compute.write(
                    &mut t.bias,
                    &vec![0.0; self.length * self.length * self.config.heads],
                )?;
                compute.gather_add(&view.weight(position_bias)?, &self.buckets, &mut t.bias)?;
            }
            compute.rms_norm(
                &t.x,
                Some(&view.weight(&slots.attention_norm)?),
                eps,
                &mut t.normed,
            )?;
            linear(compute, &held, &slots.q, &t.normed, &mut t.q)?;
            linear(compute, &held, &slots.k, &t.normed, &mut t.k)?;
            linear(compute, &held, &slots.v, &t.normed, &mut t.v)?;
            let shape = BiasedAttention {
                heads: self.config.heads,
                length: self.length,
                keys,
            };
            pipeline.attention_biased(&t.q, &t.k, &t.v, &t.bias, shape, &mut t.context)?;
            linear(compute, &held, &slots.o, &t.context, &mut t.out)?;
            compute.add(&mut t.x, &t.out)?;
            compute.rms_norm(
                &t.x,
                Some(&view.weight(&slots.feed_forward_norm)?),
                eps,
                &mut t.normed,
            )?;
            linear(compute, &held, &slots.wi_0, &t.normed, &mut t.gate)?;
            linear(compute, &held, &slots.wi_1, &t.normed, &mut t.up)?;
            pipeline.gelu_tanh_mul(&mut t.gate, &t.up)?;
            linear(compute, &held, &slots.wo, &t.gate, &mut t.out)?;
            compute.add(&mut t.x, &t.out)?;
            Ok(())
        })();
        blocks.release(compute, held)?;
        outcome
    }
}

fn linear<C: Compute>(
    compute: &C,
    held: &Held<C::Block>,
    weight: &TensorSlot,
    x: &C::Tensor,
    y: &mut C::Tensor,
) -> Result<(), FamilyError> {
    compute.linear(x, &held.view(compute).weight(weight)?, None, y)?;
    Ok(())
}

impl Facts for T5Encoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::TextEncoder
    }

    fn describe(&self) -> &'static str {
        if self.config.bias_per_layer {
            "umt5 encoder"
        } else {
            "t5 encoder"
        }
    }

    fn layout(&self) -> &ModelLayout {
        &self.placement.layout
    }

    fn truncated_inputs(&self) -> &[usize] {
        self.prompts.truncated()
    }

    fn reference_key(&self, step: u64) -> u64 {
        self.prompts.reference_key(step)
    }

    fn tokens_per_step(&self) -> u64 {
        (self.prompts.of_step(0).len() * self.length) as u64
    }
}

impl Family for T5Encoder {
    type State<C: Compute> = T5State<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<T5State<C>, FamilyError> {
        compute.pipeline()?;
        Ok(T5State {
            sequences: 0,
            tensors: None,
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut T5State<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let prompts = self.prompts.of_step(step);
        let sequences = prompts.len();
        let rows = sequences * self.length;
        if state.tensors.is_none() || state.sequences != sequences {
            state.tensors = Some(self.tensors(compute, rows)?);
            state.sequences = sequences;
        }
        let Some(t) = state.tensors.as_mut() else {
            return Err(FamilyError::internal(
                "activations were not allocated".into(),
            ));
        };
        let ids: Vec<u32> = prompts
            .iter()
            .flat_map(|prompt| prompt.ids.iter().copied())
            .collect();
        compute.write(&mut t.x, &vec![0.0; rows * self.config.model])?;
        let held = blocks.acquire(compute, BlockId(0))?;
        let outcome = (|| {
            compute.gather_add(
                &held.view(compute).weight(&self.slots.shared)?,
                &ids,
                &mut t.x,
            )?;
            Ok::<_, FamilyError>(())
        })();
        blocks.release(compute, held)?;
        outcome?;
        let keys: Vec<usize> = match self.masked {
            true => prompts
                .iter()
                .map(|prompt| prompt.tokens.min(self.length))
                .collect(),
            false => Vec::new(),
        };
        for layer in 0..self.config.layers {
            self.layer(compute, (layer, &keys), t, blocks)?;
        }
        let held = blocks.acquire(compute, BlockId(self.config.layers as u32 + 1))?;
        let outcome = (|| {
            let view = held.view(compute);
            compute.rms_norm(
                &t.x,
                Some(&view.weight(&self.slots.final_norm)?),
                self.config.eps,
                &mut t.normed,
            )?;
            Ok::<_, FamilyError>(())
        })();
        blocks.release(compute, held)?;
        outcome?;
        let mut states = compute.read(&t.normed)?;
        let model = self.config.model;
        for (sequence, &tokens) in keys.iter().enumerate() {
            let padding =
                (sequence * self.length + tokens) * model..(sequence + 1) * self.length * model;
            states[padding].fill(0.0);
        }
        Ok(StepOutput {
            output: Some(states),
            ..StepOutput::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::bucket;

    #[test]
    fn buckets_are_t5s_exact_near_and_logarithmic_far() {
        // Proves the bidirectional buckets of T5 (32 buckets, distance 128): exact
        // below 8 either way, keys after the query in the upper half, the far ones
        // logarithmic and capped; values from transformers' _relative_position_bucket.
        assert_eq!(bucket(0, 32, 128), 0);
        assert_eq!(bucket(-3, 32, 128), 3);
        assert_eq!(bucket(3, 32, 128), 19);
        assert_eq!(bucket(-8, 32, 128), 8);
        assert_eq!(bucket(-12, 32, 128), 9);
        assert_eq!(bucket(-16, 32, 128), 10);
        assert_eq!(bucket(-64, 32, 128), 14);
        assert_eq!(bucket(-127, 32, 128), 15);
        assert_eq!(bucket(-500, 32, 128), 15);
        assert_eq!(bucket(500, 32, 128), 31);
        // Every offset from -600 to 599, as transformers buckets them.
        let expected = include_str!("../../../tests/fixtures/pipeline/t5-buckets-32-128.txt");
        for (offset, want) in (-600..600).zip(expected.trim().split(',')) {
            assert_eq!(bucket(offset, 32, 128).to_string(), want, "offset {offset}");
        }
    }
}
