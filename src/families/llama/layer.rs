//! One decoder layer: RMSNorm, grouped-query attention with rotary positions over the
//! layer's KV cache, the output projection and residual, RMSNorm, then the SwiGLU MLP
//! (or Mixtral's experts, in `experts.rs`) and residual.

use stagehand_actors::BlockId;

use super::weights::{self, LayerSlots, Projection};
use super::{unallocated, Activations, Decoder, DecoderState};
use crate::compute::{CachedAttention, Compute, TensorSlot};
use crate::families::blocks::{Blocks, Held};
use crate::families::family::StepOutput;
use crate::families::lora_set::LoraSet;
use crate::families::FamilyError;

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
        for (factors, scale) in held.low_rank(lora, weight)? {
            compute.low_rank_add(x, &factors, scale, scratch, y)?;
        }
        Ok(())
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
        compute.rms_norm(
            &acts.x,
            Some(&view.weight(&slots.input_norm)?),
            config.rms_eps,
            &mut acts.normed,
        )?;
        let projection =
            |compute: &C, p: &Projection, x: &C::Tensor, y: &mut C::Tensor, s: &mut C::Tensor| {
                Self::project(compute, held, lora, &p.weight, p.bias.as_ref(), x, y, s)
            };
        projection(
            compute,
            &slots.q,
            &acts.normed,
            &mut acts.q,
            &mut acts.low_rank,
        )?;
        projection(
            compute,
            &slots.k,
            &acts.normed,
            &mut acts.k,
            &mut acts.low_rank,
        )?;
        projection(
            compute,
            &slots.v,
            &acts.normed,
            &mut acts.v,
            &mut acts.low_rank,
        )?;
        compute.rope(
            &mut acts.q,
            config.heads,
            config.head_dim,
            positions,
            &self.inv_freq,
        )?;
        compute.rope(
            &mut acts.k,
            config.kv_heads,
            config.head_dim,
            positions,
            &self.inv_freq,
        )?;
        compute.write_rows(&mut state.k_cache[layer], state.position, &acts.k)?;
        compute.write_rows(&mut state.v_cache[layer], state.position, &acts.v)?;
        let shape = CachedAttention {
            heads: config.heads,
            kv_heads: config.kv_heads,
            head_dim: config.head_dim,
            scale: 1.0 / (config.head_dim as f32).sqrt(),
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
        Self::project(
            compute,
            held,
            lora,
            &slots.o,
            None,
            &acts.attended,
            &mut acts.out,
            &mut acts.low_rank,
        )?;
        compute.add(&mut acts.x, &acts.out)?;
        compute.rms_norm(
            &acts.x,
            Some(&view.weight(&slots.post_norm)?),
            config.rms_eps,
            &mut acts.normed,
        )?;
        Ok(())
    }

    /// The dense SwiGLU MLP and the residual.
    fn dense_mlp<C: Compute>(
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        mlp: &weights::Mlp,
        acts: &mut Activations<C>,
    ) -> Result<(), FamilyError> {
        Self::swiglu(compute, held, lora, mlp, acts)?;
        compute.add(&mut acts.x, &acts.out)?;
        Ok(())
    }

    /// `out ← down(silu(gate(normed)) · up(normed))`: a dense MLP or one expert.
    pub(super) fn swiglu<C: Compute>(
        compute: &C,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        mlp: &weights::Mlp,
        acts: &mut Activations<C>,
    ) -> Result<(), FamilyError> {
        Self::project(
            compute,
            held,
            lora,
            &mlp.gate,
            None,
            &acts.normed,
            &mut acts.gate,
            &mut acts.low_rank,
        )?;
        Self::project(
            compute,
            held,
            lora,
            &mlp.up,
            None,
            &acts.normed,
            &mut acts.up,
            &mut acts.low_rank,
        )?;
        compute.silu_mul(&mut acts.gate, &acts.up)?;
        Self::project(
            compute,
            held,
            lora,
            &mlp.down,
            None,
            &acts.gate,
            &mut acts.out,
            &mut acts.low_rank,
        )?;
        Ok(())
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
        let slots = &self.weights.layers[layer];
        let held = blocks.acquire(compute, BlockId(layer as u32))?;
        let lora = blocks.lora();
        let outcome = (|| {
            self.attention(compute, &held, lora, slots, layer, positions, state)?;
            let acts = state.acts.as_mut().ok_or_else(unallocated)?;
            match (&slots.mlp, &slots.router) {
                (Some(mlp), _) => Self::dense_mlp(compute, &held, lora, mlp, acts).map(|()| None),
                (None, Some(router)) => {
                    let view = held.view(compute);
                    compute.linear(&acts.normed, &view.weight(router)?, None, &mut acts.router)?;
                    Ok(Some(compute.read(&acts.router)?))
                }
                (None, None) => Err(FamilyError::Model(format!("layer {layer} has no MLP"))),
            }
        })();
        blocks.release(compute, held)?;
        if let Some(router_logits) = outcome? {
            self.moe(compute, state, blocks, layer, &router_logits, step, output)?;
        }
        Ok(())
    }
}
