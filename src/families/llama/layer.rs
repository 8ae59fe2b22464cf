//! One decoder layer: RMSNorm, grouped-query attention with rotary positions over the
//! layer's KV cache (Qwen3: each head of q and k RMS-normalised first), the output
//! projection and residual, RMSNorm, then the SwiGLU MLP — or the router, Qwen2-MoE's
//! shared expert, and the experts (in `experts.rs`) — and residual.

use stagehand_actors::BlockId;

use super::weights::{self, Ffn, LayerSlots, Projection};
use super::{unallocated, Activations, Decoder, DecoderState, MlpScratch};
use crate::compute::{CachedAttention, Compute, TensorSlot};
use crate::families::blocks::{Blocks, Held};
use crate::families::family::StepOutput;
use crate::families::lora_set::LoraSet;
use crate::families::FamilyError;

/// What a SwiGLU reads and writes: `out ← down(silu(gate(x)) · up(x))`.
pub(super) struct SwigluIo<'a, C: Compute> {
    pub x: &'a C::Tensor,
    pub scratch: &'a mut MlpScratch<C>,
    pub out: &'a mut C::Tensor,
    pub low_rank: &'a mut C::Tensor,
}

impl Decoder {
    /// `y ← x·Wᵀ (+ b)` plus the low-rank LoRA updates of a streamed weight.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn project<C: Compute>(
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        weight: &TensorSlot,
        bias: Option<&TensorSlot>,
        x: &C::Tensor,
        y: &mut C::Tensor,
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let view = held.view(compute);
        let bias = bias.map(|bias| view.weight(bias)).transpose()?;
        compute.linear(x, &view.weight(weight)?, bias.as_ref(), y)?;
        for (factors, scale) in held.low_rank(compute, lora, weight, 0..weight.rows)? {
            compute.low_rank_add(x, &factors, scale, scratch, y)?;
        }
        Ok(())
    }

    /// [`Decoder::project`] of a projection with its optional bias.
    pub(super) fn projection<C: Compute>(
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        projection: &Projection,
        x: &C::Tensor,
        y: &mut C::Tensor,
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let bias = projection.bias.as_ref();
        Self::project(compute, held, lora, &projection.weight, bias, x, y, scratch)
    }

    /// Attention of layer `layer` (with its KV-cache update) and the residual.
    #[allow(clippy::too_many_arguments)]
    fn attention<C: Compute>(
        &self,
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        slots: &LayerSlots,
        layer: usize,
        positions: &[u32],
        state: &mut DecoderState<C>,
    ) -> Result<(), FamilyError> {
        let config = &self.config;
        let view = held.view(compute);
        let acts = state.acts.as_mut().ok_or_else(unallocated)?;
        let eps = config.rms_eps;
        compute.rms_norm(
            &acts.x,
            Some(&view.weight(&slots.input_norm)?),
            eps,
            &mut acts.normed,
        )?;
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
        for (norm, x, heads) in [
            (&slots.q_norm, &mut acts.q, config.heads),
            (&slots.k_norm, &mut acts.k, config.kv_heads),
        ] {
            if let Some(norm) = norm {
                compute.rms_norm_heads(x, heads, &view.weight(norm)?, eps)?;
            }
            compute.rope(x, heads, config.head_dim, positions, &state.inv_freq)?;
        }
        compute.write_rows(&mut state.k_cache[layer], state.position, &acts.k)?;
        compute.write_rows(&mut state.v_cache[layer], state.position, &acts.v)?;
        // Yarn scales cos and sin by its attention factor: q·k by its square.
        let factor = config.rope.attention_factor();
        let shape = CachedAttention {
            heads: config.heads,
            kv_heads: config.kv_heads,
            head_dim: config.head_dim,
            scale: (factor * factor / (config.head_dim as f64).sqrt()) as f32,
            past: state.position,
            queries: positions.len(),
        };
        compute.attention_cached(
            &acts.q,
            &state.k_cache[layer],
            &state.v_cache[layer],
            &shape,
            &mut acts.attended,
        )?;
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
        Ok(())
    }

    /// `out ← down(silu(gate(x)) · up(x))`: a dense MLP, an expert or a shared expert.
    pub(super) fn swiglu<C: Compute>(
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        mlp: &weights::Mlp,
        io: SwigluIo<'_, C>,
    ) -> Result<(), FamilyError> {
        let SwigluIo {
            x,
            scratch,
            out,
            low_rank,
        } = io;
        Self::projection(
            compute,
            held,
            lora,
            &mlp.gate,
            x,
            &mut scratch.gate,
            low_rank,
        )?;
        Self::projection(compute, held, lora, &mlp.up, x, &mut scratch.up, low_rank)?;
        compute.silu_mul(&mut scratch.gate, &scratch.up)?;
        Self::projection(compute, held, lora, &mlp.down, &scratch.gate, out, low_rank)?;
        Ok(())
    }

    /// The feed-forward part while the layer's block is held: the dense MLP and its
    /// residual, or the router's logits (returned, for the experts) after Qwen2-MoE's
    /// shared expert has added `sigmoid(gate(x)) · shared(x)` to the residual.
    pub(super) fn feed_forward<C: Compute>(
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        ffn: &Ffn,
        acts: &mut Activations<C>,
    ) -> Result<Option<Vec<f32>>, FamilyError> {
        let (router, shared) = match ffn {
            Ffn::Dense(mlp) => {
                let io = SwigluIo {
                    x: &acts.normed,
                    scratch: &mut acts.dense,
                    out: &mut acts.out,
                    low_rank: &mut acts.low_rank,
                };
                Self::swiglu(compute, held, lora, mlp, io)?;
                compute.add(&mut acts.x, &acts.out)?;
                return Ok(None);
            }
            Ffn::Experts { router, shared } => (router, shared),
        };
        let view = held.view(compute);
        compute.linear(&acts.normed, &view.weight(router)?, None, &mut acts.router)?;
        if let Some((mlp, gate)) = shared {
            let io = SwigluIo {
                x: &acts.normed,
                scratch: &mut acts.shared,
                out: &mut acts.out,
                low_rank: &mut acts.low_rank,
            };
            Self::swiglu(compute, held, lora, mlp, io)?;
            compute.linear(
                &acts.normed,
                &view.weight(gate)?,
                None,
                &mut acts.shared_gate,
            )?;
            let gates: Vec<f32> = compute
                .read(&acts.shared_gate)?
                .iter()
                .map(|logit| 1.0 / (1.0 + (-logit).exp()))
                .collect();
            compute.add_scaled_rows(&mut acts.x, &acts.out, &gates)?;
        }
        Ok(Some(compute.read(&acts.router)?))
    }

    /// One layer: attention, then the dense MLP or the experts.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        layer: usize,
        positions: &[u32],
        step: u64,
        output: &mut StepOutput,
    ) -> Result<(), FamilyError> {
        let held = blocks.acquire(compute, BlockId(layer as u32))?;
        let lora = blocks.lora();
        let outcome = self.layer_held(compute, &held, lora, layer, positions, state);
        blocks.release(compute, held)?;
        if let Some(router_logits) = outcome? {
            self.moe(compute, state, blocks, layer, &router_logits, step, output)?;
        }
        Ok(())
    }

    /// A layer's attention and dense MLP (or its router's logits, returned for the
    /// experts) while its block is held.
    pub(super) fn layer_held<C: Compute>(
        &self,
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        layer: usize,
        positions: &[u32],
        state: &mut DecoderState<C>,
    ) -> Result<Option<Vec<f32>>, FamilyError> {
        let slots = &self.weights.layers[layer];
        self.attention(compute, held, lora, slots, layer, positions, state)?;
        let acts = state.acts.as_mut().ok_or_else(unallocated)?;
        Self::feed_forward(compute, held, lora, &slots.ffn, acts)
    }
}
