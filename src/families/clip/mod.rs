//! CLIP's text encoder (`CLIPTextModel`, `model_type: clip_text_model`): the pooled
//! prompt vector Flux conditions on, and the last hidden states. Written once
//! against the compute port.
//!
//! One step encodes a batch of prompts, each cut and padded to the model's positions
//! (77) as diffusers pads them: token + position embeddings; per layer, pre-LayerNorm
//! causal self-attention (scale 1/√head_dim) and a pre-LayerNorm MLP with quick GELU
//! (`x·σ(1.702x)`), each added to the residual; the final LayerNorm. The pooled
//! output is the final state at the end-of-text token: the first position of
//! `eos_token_id`, or — for configs that carry the legacy `eos_token_id: 2`, as
//! CLIP-L's does — of the largest id (`<|endoftext|>` is the last of the vocabulary).
//!
//! Blocks: the embeddings (token table and positions), one per layer, and the final
//! norm. A step's output, per prompt, is the pooled vector then the hidden states.

mod open;

use stagehand_actors::{BlockId, ModelLayout};

use super::blocks::{Blocks, Held};
use super::family::{Facts, Family, StepOutput};
use super::inputs::WorkloadKind;
use super::placement::Placement;
use super::prompt_tokens::{PromptBatches, PromptIds};
use super::walk::{self, Tensors};
use super::FamilyError;
use crate::compute::{Attention, Compute, Mask, TensorSlot};
use crate::model::ModelIndex;

/// The sizes of a CLIP text encoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ClipConfig {
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub heads: usize,
    pub positions: usize,
    pub eps: f32,
    /// `eos_token_id` of the config: 2 (legacy) pools at the largest id.
    pub eos_token_id: i64,
    /// The MLP's activation: quick GELU (CLIP-L, every Flux) or the erf GELU.
    pub quick_gelu: bool,
}

/// Where a CLIP text encoder's checkpoint keeps its layers: under `text_model.` as the
/// published CLIP-L and ComfyUI's `clip_l.safetensors` have them, or at the top as
/// transformers 5 saves a `CLIPTextModel`.
pub(crate) const PREFIXES: [&str; 2] = ["text_model.", ""];

/// The prefix of a CLIP text encoder's tensors in `index`, if it is one.
pub(crate) fn prefix_of(index: &crate::model::ModelIndex) -> Option<&'static str> {
    PREFIXES.into_iter().find(|prefix| {
        index
            .tensor(&format!("{prefix}embeddings.token_embedding.weight"))
            .is_some()
    })
}

#[derive(Debug, Clone, Copy)]
struct Linear {
    weight: TensorSlot,
    bias: TensorSlot,
}

#[derive(Debug, Clone, Copy)]
struct LayerSlots {
    norm1: Linear,
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    norm2: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// Where every weight is.
struct Slots {
    token: TensorSlot,
    position: TensorSlot,
    layers: Vec<LayerSlots>,
    final_norm: Linear,
}

/// The encoder's structure, by transformers' names (with `text_model.` in a full
/// CLIPModel checkpoint): the embeddings, a block per layer, the final norm.
struct Walk<'w> {
    tensors: &'w mut dyn Tensors,
    prefix: &'w str,
    config: &'w ClipConfig,
}

impl Walk<'_> {
    fn pair(
        &mut self,
        stem: &str,
        out: usize,
        input: Option<usize>,
    ) -> Result<Linear, FamilyError> {
        let stem = format!("{}{stem}", self.prefix);
        let shape: Vec<usize> = match input {
            Some(input) => vec![out, input],
            None => vec![out],
        };
        Ok(Linear {
            weight: self.tensors.tensor(&format!("{stem}.weight"), &shape)?,
            bias: self.tensors.tensor(&format!("{stem}.bias"), &[out])?,
        })
    }

    fn layer(&mut self, layer: usize) -> Result<LayerSlots, FamilyError> {
        let (hidden, inner) = (self.config.hidden, self.config.intermediate);
        let at = format!("encoder.layers.{layer}");
        self.tensors.block(&at);
        let attention = format!("{at}.self_attn");
        Ok(LayerSlots {
            norm1: self.pair(&format!("{at}.layer_norm1"), hidden, None)?,
            q: self.pair(&format!("{attention}.q_proj"), hidden, Some(hidden))?,
            k: self.pair(&format!("{attention}.k_proj"), hidden, Some(hidden))?,
            v: self.pair(&format!("{attention}.v_proj"), hidden, Some(hidden))?,
            out: self.pair(&format!("{attention}.out_proj"), hidden, Some(hidden))?,
            norm2: self.pair(&format!("{at}.layer_norm2"), hidden, None)?,
            fc1: self.pair(&format!("{at}.mlp.fc1"), inner, Some(hidden))?,
            fc2: self.pair(&format!("{at}.mlp.fc2"), hidden, Some(inner))?,
        })
    }

    fn slots(mut self) -> Result<Slots, FamilyError> {
        let config = self.config;
        self.tensors.block("embeddings");
        let name = |rest: &str| format!("{}embeddings.{rest}.weight", self.prefix);
        let token = self
            .tensors
            .tensor(&name("token_embedding"), &[config.vocab, config.hidden])?;
        let position = self.tensors.tensor(
            &name("position_embedding"),
            &[config.positions, config.hidden],
        )?;
        let layers = (0..config.layers)
            .map(|layer| self.layer(layer))
            .collect::<Result<_, _>>()?;
        self.tensors.block("final_layer_norm");
        Ok(Slots {
            token,
            position,
            layers,
            final_norm: self.pair("final_layer_norm", config.hidden, None)?,
        })
    }
}

/// A CLIP text encoder over its prompts.
pub struct ClipText {
    pub config: ClipConfig,
    placement: Placement,
    slots: Slots,
    prompts: PromptBatches,
}

/// A step's activations.
pub struct ClipState<C: Compute> {
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
    hidden: C::Tensor,
}

impl ClipText {
    fn new(
        index: &ModelIndex,
        config: ClipConfig,
        prompts: Vec<PromptIds>,
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
        let prefix = prefix_of(index).unwrap_or("");
        let (placement, slots) = walk::place(index, |tensors| {
            Walk {
                tensors,
                prefix,
                config: &config,
            }
            .slots()
        })?;
        Ok(Self {
            slots,
            placement,
            config,
            prompts,
        })
    }

    /// The prompts of step `step`'s batch.
    /// Where prompt `ids` is pooled: the end-of-text token (see the module docs).
    fn pooled_position(&self, ids: &[u32]) -> usize {
        if self.config.eos_token_id == 2 {
            let max = ids.iter().copied().max().unwrap_or(0);
            return ids.iter().position(|&id| id == max).unwrap_or(0);
        }
        let eos = self.config.eos_token_id;
        ids.iter()
            .position(|&id| i64::from(id) == eos)
            .unwrap_or(ids.len().saturating_sub(1))
    }

    /// Values of one prompt's output: the pooled vector and every position's state.
    pub fn output_values(&self) -> usize {
        (1 + self.config.positions) * self.config.hidden
    }

    fn tensors<C: Compute>(&self, compute: &C, rows: usize) -> Result<Activations<C>, FamilyError> {
        let hidden = self.config.hidden;
        Ok(Activations {
            x: compute.tensor(rows, hidden)?,
            normed: compute.tensor(rows, hidden)?,
            q: compute.tensor(rows, hidden)?,
            k: compute.tensor(rows, hidden)?,
            v: compute.tensor(rows, hidden)?,
            context: compute.tensor(rows, hidden)?,
            out: compute.tensor(rows, hidden)?,
            hidden: compute.tensor(rows, self.config.intermediate)?,
        })
    }

    fn layer<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        layer: usize,
        sequences: usize,
        t: &mut Activations<C>,
        blocks: &mut B,
    ) -> Result<(), FamilyError> {
        let slots = &self.slots.layers[layer];
        let eps = self.config.eps;
        let held = blocks.acquire(compute, BlockId(layer as u32 + 1))?;
        let outcome = (|| {
            let pipeline = compute.pipeline()?;
            norm(compute, &held, &slots.norm1, eps, &t.x, &mut t.normed)?;
            linear(compute, &held, &slots.q, &t.normed, &mut t.q)?;
            linear(compute, &held, &slots.k, &t.normed, &mut t.k)?;
            linear(compute, &held, &slots.v, &t.normed, &mut t.v)?;
            let head_dim = self.config.hidden / self.config.heads;
            let shape = Attention {
                sequences,
                sequence_length: self.config.positions,
                heads: self.config.heads,
                kv_heads: self.config.heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                mask: Mask::Causal,
            };
            compute.attention(&t.q, &t.k, &t.v, &shape, &mut t.context)?;
            linear(compute, &held, &slots.out, &t.context, &mut t.out)?;
            compute.add(&mut t.x, &t.out)?;
            norm(compute, &held, &slots.norm2, eps, &t.x, &mut t.normed)?;
            linear(compute, &held, &slots.fc1, &t.normed, &mut t.hidden)?;
            if self.config.quick_gelu {
                pipeline.quick_gelu(&mut t.hidden)?;
            } else {
                compute.gelu_erf(&mut t.hidden)?;
            }
            linear(compute, &held, &slots.fc2, &t.hidden, &mut t.out)?;
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
    slots: &Linear,
    x: &C::Tensor,
    y: &mut C::Tensor,
) -> Result<(), FamilyError> {
    let view = held.view(compute);
    compute.linear(
        x,
        &view.weight(&slots.weight)?,
        Some(&view.weight(&slots.bias)?),
        y,
    )?;
    Ok(())
}

fn norm<C: Compute>(
    compute: &C,
    held: &Held<C::Block>,
    slots: &Linear,
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

impl Facts for ClipText {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::TextEncoder
    }

    fn describe(&self) -> &'static str {
        "clip text encoder"
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
        (self.prompts.of_step(0).len() * self.config.positions) as u64
    }
}

impl Family for ClipText {
    type State<C: Compute> = ClipState<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<ClipState<C>, FamilyError> {
        compute.pipeline()?;
        Ok(ClipState {
            sequences: 0,
            tensors: None,
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut ClipState<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let prompts = self.prompts.of_step(step);
        let sequences = prompts.len();
        let positions = self.config.positions;
        let rows = sequences * positions;
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
        let position_ids: Vec<u32> = (0..rows).map(|row| (row % positions) as u32).collect();
        compute.write(&mut t.x, &vec![0.0; rows * self.config.hidden])?;
        let held = blocks.acquire(compute, BlockId(0))?;
        let outcome = (|| {
            let view = held.view(compute);
            compute.gather_add(&view.weight(&self.slots.token)?, &ids, &mut t.x)?;
            compute.gather_add(&view.weight(&self.slots.position)?, &position_ids, &mut t.x)?;
            Ok::<_, FamilyError>(())
        })();
        blocks.release(compute, held)?;
        outcome?;
        for layer in 0..self.config.layers {
            self.layer(compute, layer, sequences, t, blocks)?;
        }
        let last = BlockId(self.config.layers as u32 + 1);
        let held = blocks.acquire(compute, last)?;
        let outcome = norm(
            compute,
            &held,
            &self.slots.final_norm,
            self.config.eps,
            &t.x,
            &mut t.normed,
        );
        blocks.release(compute, held)?;
        outcome?;
        let states = compute.read(&t.normed)?;
        let hidden = self.config.hidden;
        let mut output = Vec::with_capacity(sequences * self.output_values());
        for (sequence, prompt) in prompts.iter().enumerate() {
            let rows = &states[sequence * positions * hidden..][..positions * hidden];
            let pooled = self.pooled_position(&prompt.ids);
            output.extend_from_slice(&rows[pooled * hidden..][..hidden]);
            output.extend_from_slice(rows);
        }
        Ok(StepOutput {
            output: Some(output),
            ..StepOutput::default()
        })
    }
}
