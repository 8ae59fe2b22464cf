//! One Flux denoising pass, block by block, against the compute port: the embedders,
//! the double-stream blocks, the single-stream blocks and the final layer.

use crate::compute::{Attention, Compute, Diffusion, Mask};
use crate::families::blocks::Held;
use crate::families::lora_set::LoraSet;
use crate::families::FamilyError;

use super::config::FluxConfig;
use super::weights::{Embedder, FluxWeights, Linear, StreamWeights};

/// LayerNorm and QK-RMSNorm epsilon of every Flux norm.
pub const EPS: f32 = 1e-6;

/// What every block's compute reads.
pub struct Ctx<'a, C: Compute> {
    pub compute: &'a C,
    pub kernels: &'a dyn Diffusion<Tensor = C::Tensor>,
    pub weights: &'a FluxWeights,
    pub config: &'a FluxConfig,
}

impl<C: Compute> Ctx<'_, C> {
    /// `y ← x·W[first ..]ᵀ + b[first ..]` for as many output rows as `y` has columns,
    /// from the piece of the (fused) linear that holds them, with the LoRA updates of
    /// that piece's rows on a streamed block.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        linear: &Linear,
        first: usize,
        x: &C::Tensor,
        y: &mut C::Tensor,
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let rows = self.compute.dims(y).1;
        let piece = linear
            .pieces
            .iter()
            .find(|piece| piece.first <= first && first + rows <= piece.first + piece.rows)
            .ok_or_else(|| {
                FamilyError::internal(format!(
                    "output rows {first}..{} lie across two tensors",
                    first + rows
                ))
            })?;
        let local = first - piece.first;
        let weight = self.weights.slot(piece.weight)?;
        let bias = self.weights.slot(piece.bias)?;
        let view = held.view(self.compute);
        self.compute.linear(
            x,
            &view.weight(&weight.sub_rows(local, rows))?,
            Some(&view.weight(&bias.sub_vector(local, rows))?),
            y,
        )?;
        for (factors, scale) in held.low_rank(self.compute, lora, &weight, local..local + rows)? {
            self.compute.low_rank_add(x, &factors, scale, scratch, y)?;
        }
        Ok(())
    }

    /// `count` modulation vectors of `[1, hidden]` from `silu(vec)`.
    pub fn modulation(
        &self,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        linear: &Linear,
        silu_vec: &C::Tensor,
        out: &mut [C::Tensor],
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let hidden = self.config.hidden();
        for (chunk, vector) in out.iter_mut().enumerate() {
            self.linear(
                held,
                lora,
                linear,
                chunk * hidden,
                silu_vec,
                vector,
                scratch,
            )?;
        }
        Ok(())
    }

    /// `out ← out_layer(silu(in_layer(x)))`.
    #[allow(clippy::too_many_arguments)]
    pub fn embedder(
        &self,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        embedder: &Embedder,
        x: &C::Tensor,
        hidden: &mut C::Tensor,
        out: &mut C::Tensor,
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        self.linear(held, lora, &embedder.in_layer, 0, x, hidden, scratch)?;
        self.kernels.silu(hidden)?;
        self.linear(held, lora, &embedder.out_layer, 0, hidden, out, scratch)
    }

    pub fn norm(
        &self,
        held: &Held<C::Block>,
        tensor: usize,
        x: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let view = held.view(self.compute);
        let gamma = view.weight(&self.weights.slot(tensor)?)?;
        self.compute
            .rms_norm_heads(x, self.config.heads, &gamma, EPS)?;
        Ok(())
    }

    /// Joint attention over all `rows` of `q`, `k`, `v`: q is roped (in place) before
    /// k, then softmax attention without a mask.
    pub fn attention(
        &self,
        table: &C::Tensor,
        q: &mut C::Tensor,
        k: &mut C::Tensor,
        v: &C::Tensor,
        out: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let rows = self.compute.dims(q).0;
        self.kernels.rope_pairs(q, self.config.heads, table)?;
        self.kernels.rope_pairs(k, self.config.heads, table)?;
        let lengths = [rows];
        let shape = Attention {
            sequences: 1,
            sequence_length: rows,
            heads: self.config.heads,
            kv_heads: self.config.heads,
            head_dim: self.config.head_dim,
            scale: 1.0 / (self.config.head_dim as f32).sqrt(),
            mask: Mask::Padding(&lengths),
        };
        self.compute.attention(q, k, v, &shape, out)?;
        Ok(())
    }
}

/// One stream's tensors inside a double block.
pub struct StreamActs<C: Compute> {
    /// The stream's hidden state, carried from block to block.
    pub x: C::Tensor,
    pub normed: C::Tensor,
    pub q: C::Tensor,
    pub k: C::Tensor,
    pub v: C::Tensor,
    pub attn: C::Tensor,
    pub out: C::Tensor,
    pub hidden: C::Tensor,
    /// shift, scale, gate of the attention; shift, scale, gate of the MLP.
    pub mods: Vec<C::Tensor>,
}

impl<C: Compute> StreamActs<C> {
    /// The stream's tensors from `next`, in field order (the shapes are
    /// `working_set::stream`'s).
    pub fn new(
        next: &mut impl FnMut() -> Result<C::Tensor, FamilyError>,
    ) -> Result<Self, FamilyError> {
        Ok(Self {
            x: next()?,
            normed: next()?,
            q: next()?,
            k: next()?,
            v: next()?,
            attn: next()?,
            out: next()?,
            hidden: next()?,
            mods: (0..6).map(|_| next()).collect::<Result<_, _>>()?,
        })
    }
}

impl<C: Compute> Ctx<'_, C> {
    /// A stream's modulation, adaLN and q/k/v (q and k RMS-normalised per head).
    pub fn stream_qkv(
        &self,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        weights: &StreamWeights,
        silu_vec: &C::Tensor,
        acts: &mut StreamActs<C>,
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let hidden = self.config.hidden();
        self.modulation(
            held,
            lora,
            &weights.modulation,
            silu_vec,
            &mut acts.mods,
            scratch,
        )?;
        self.kernels
            .adaptive_norm(&acts.x, &acts.mods[0], &acts.mods[1], EPS, &mut acts.normed)?;
        self.linear(
            held,
            lora,
            &weights.qkv,
            0,
            &acts.normed,
            &mut acts.q,
            scratch,
        )?;
        self.linear(
            held,
            lora,
            &weights.qkv,
            hidden,
            &acts.normed,
            &mut acts.k,
            scratch,
        )?;
        self.linear(
            held,
            lora,
            &weights.qkv,
            2 * hidden,
            &acts.normed,
            &mut acts.v,
            scratch,
        )?;
        self.norm(held, weights.q_norm, &mut acts.q)?;
        self.norm(held, weights.k_norm, &mut acts.k)
    }

    /// A stream after attention: gated projection, then the gated GELU-tanh MLP on
    /// the adaLN of the result.
    pub fn stream_out(
        &self,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        weights: &StreamWeights,
        acts: &mut StreamActs<C>,
        scratch: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        self.linear(
            held,
            lora,
            &weights.proj,
            0,
            &acts.attn,
            &mut acts.out,
            scratch,
        )?;
        self.kernels
            .add_gated(&mut acts.x, &acts.out, &acts.mods[2])?;
        self.kernels
            .adaptive_norm(&acts.x, &acts.mods[3], &acts.mods[4], EPS, &mut acts.normed)?;
        self.linear(
            held,
            lora,
            &weights.mlp_in,
            0,
            &acts.normed,
            &mut acts.hidden,
            scratch,
        )?;
        self.kernels.gelu_tanh(&mut acts.hidden)?;
        self.linear(
            held,
            lora,
            &weights.mlp_out,
            0,
            &acts.hidden,
            &mut acts.out,
            scratch,
        )?;
        self.kernels
            .add_gated(&mut acts.x, &acts.out, &acts.mods[5])?;
        Ok(())
    }
}
