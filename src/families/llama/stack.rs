//! Decode rows of several sequences stacked into one product: in a batched step, the
//! sequences that decode one token each put their rows side by side, so each
//! projection reads its weight once for all of them (memory traffic, not FLOPs, is a
//! decode step's cost). Attention stays per sequence, over its own KV cache.
//!
//! At most `Compute::stackable_rows` rows go into one product: up to that many rows,
//! the adapter computes each row in one fixed order whatever the row count (the CPU
//! adapter's few-rows product, the CUDA adapter's gemv kernel), so a stacked sequence
//! gets exactly the bits it gets alone. Norms, rotary embedding and activations are
//! row by row, so they do too.

use super::{unallocated, Activations, Decoder, DecoderState};
use crate::compute::{CachedAttention, Compute};
use crate::families::blocks::Held;
use crate::families::lora_set::LoraSet;
use crate::families::FamilyError;

/// A group of decoding sequences computed as one stack of rows.
pub(super) struct Stack<C: Compute> {
    /// Indices of the group's sequences in the batch, in row order.
    pub members: Vec<usize>,
    /// Each member's position (the row's token position).
    positions: Vec<u32>,
    acts: Activations<C>,
    /// One row of q, k, v and of the attention's output.
    q: C::Tensor,
    k: C::Tensor,
    v: C::Tensor,
    attended: C::Tensor,
}

impl Decoder {
    /// Whether a sequence at step `step` can join a stack: it decodes one row, the
    /// model's layers are dense (experts are routed per sequence), and the rotary
    /// frequencies do not depend on the sequence's length.
    pub(super) fn stacks(&self, step: u64) -> bool {
        step > 0 && self.config.experts.is_none() && !self.config.rope.depends_on_length()
    }

    /// A stack of `members`; each member's input row (the token it picked) goes in.
    pub(super) fn stack<C: Compute>(
        &self,
        compute: &C,
        members: Vec<usize>,
        states: &[&DecoderState<C>],
    ) -> Result<Stack<C>, FamilyError> {
        let config = &self.config;
        let mut acts = self.activations(compute, members.len())?;
        for (row, state) in states.iter().enumerate() {
            compute.write_rows(&mut acts.x, row, &state.next)?;
        }
        Ok(Stack {
            positions: states.iter().map(|state| state.position as u32).collect(),
            members,
            acts,
            q: compute.tensor(1, config.q_dim())?,
            k: compute.tensor(1, config.kv_dim())?,
            v: compute.tensor(1, config.kv_dim())?,
            attended: compute.tensor(1, config.q_dim())?,
        })
    }

    /// Layer `layer` of a stack while its block is held: the projections and the MLP
    /// on every row at once, attention per member over its own cache.
    pub(super) fn stacked_layer<C: Compute>(
        &self,
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        layer: usize,
        stack: &mut Stack<C>,
        states: &mut [&mut DecoderState<C>],
    ) -> Result<(), FamilyError> {
        let config = &self.config;
        let slots = &self.weights.layers[layer];
        let view = held.view(compute);
        let acts = &mut stack.acts;
        let eps = config.rms_eps;
        let input_norm = view.weight(&slots.input_norm)?;
        compute.rms_norm(&acts.x, Some(&input_norm), eps, &mut acts.normed)?;
        for (projection, y) in [
            (&slots.q, &mut acts.q),
            (&slots.k, &mut acts.k),
            (&slots.v, &mut acts.v),
        ] {
            Self::projection(
                compute,
                held,
                lora,
                projection,
                &acts.normed,
                y,
                &mut acts.low_rank,
            )?;
        }
        // Every member's frequencies are the same (they do not depend on length).
        let inv_freq = &states.first().ok_or_else(unallocated)?.inv_freq;
        for (norm, x, heads) in [
            (&slots.q_norm, &mut acts.q, config.heads),
            (&slots.k_norm, &mut acts.k, config.kv_heads),
        ] {
            if let Some(norm) = norm {
                compute.rms_norm_heads(x, heads, &view.weight(norm)?, eps)?;
            }
            compute.rope(x, heads, config.head_dim, &stack.positions, inv_freq)?;
        }
        let factor = config.rope.attention_factor();
        for (row, state) in states.iter_mut().enumerate() {
            compute.slice_rows(&acts.q, row, &mut stack.q)?;
            compute.slice_rows(&acts.k, row, &mut stack.k)?;
            compute.slice_rows(&acts.v, row, &mut stack.v)?;
            compute.write_rows(&mut state.k_cache[layer], state.position, &stack.k)?;
            compute.write_rows(&mut state.v_cache[layer], state.position, &stack.v)?;
            let shape = CachedAttention {
                heads: config.heads,
                kv_heads: config.kv_heads,
                head_dim: config.head_dim,
                scale: (factor * factor / (config.head_dim as f64).sqrt()) as f32,
                past: state.position,
                queries: 1,
            };
            compute.attention_cached(
                &stack.q,
                &state.k_cache[layer],
                &state.v_cache[layer],
                &shape,
                &mut stack.attended,
            )?;
            compute.write_rows(&mut acts.attended, row, &stack.attended)?;
        }
        Self::projection(
            compute,
            held,
            lora,
            &slots.o,
            &acts.attended,
            &mut acts.out,
            &mut acts.low_rank,
        )?;
        compute.add(&mut acts.x, &acts.out)?;
        compute.rms_norm(
            &acts.x,
            Some(&view.weight(&slots.post_norm)?),
            eps,
            &mut acts.normed,
        )?;
        match Self::feed_forward(compute, held, lora, &slots.ffn, acts)? {
            None => Ok(()),
            Some(_) => Err(FamilyError::internal("a stacked layer has experts".into())),
        }
    }

    /// The head of a stack while its block is held: the final norm and `lm_head` on
    /// every row at once, then each member picks its token with its own sampling and
    /// stream. Returns each member's logits.
    pub(super) fn stacked_head<C: Compute>(
        &self,
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        stack: &mut Stack<C>,
        states: &mut [&mut DecoderState<C>],
        samplings: &[super::Sampling],
    ) -> Result<Vec<Vec<f32>>, FamilyError> {
        let view = held.view(compute);
        let head = self.weights.head;
        let acts = &mut stack.acts;
        compute.rms_norm(
            &acts.x,
            Some(&view.weight(&head.norm)?),
            self.config.rms_eps,
            &mut acts.normed,
        )?;
        let mut logits = compute.tensor(stack.members.len(), self.config.vocab)?;
        Self::project(
            compute,
            held,
            lora,
            &head.lm_head,
            None,
            &acts.normed,
            &mut logits,
            &mut acts.low_rank,
        )?;
        let all = compute.read(&logits)?;
        let vocab = self.config.vocab;
        let mut picked = Vec::with_capacity(states.len());
        for ((state, sampling), row) in states
            .iter_mut()
            .zip(samplings)
            .zip(all.chunks_exact(vocab))
        {
            let token = sampling.pick(row, &mut state.rng);
            state.next_token = token;
            if self.host_table.is_none() {
                compute.write(&mut state.next, &state.zeros)?;
                compute.gather_add(&view.weight(&head.lm_head)?, &[token], &mut state.next)?;
            }
            picked.push(row.to_vec());
        }
        Ok(picked)
    }
}
