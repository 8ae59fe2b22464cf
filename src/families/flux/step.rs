//! A Flux step: one denoising step over the blocks in order — embedders, double
//! blocks, single blocks, final layer — then the Euler update of the latent the state
//! carries from step to step.

use stagehand_actors::BlockId;

use super::embed::timestep_embedding;
use super::layers::{Ctx, StreamActs, EPS};
use super::working_set;
use super::Flux;
use crate::compute::Compute;
use crate::families::activations::allocator;
use crate::families::blocks::Blocks;
use crate::families::family::{Family, StepOutput};
use crate::families::FamilyError;

/// The activations of a step, allocated once per run.
pub struct Acts<C: Compute> {
    latent: C::Tensor,
    context: C::Tensor,
    pooled: C::Tensor,
    frequencies: C::Tensor,
    embed_hidden: C::Tensor,
    embed_out: C::Tensor,
    /// `silu(vec)`: every modulation's input.
    vec: C::Tensor,
    img: StreamActs<C>,
    txt: StreamActs<C>,
    q: C::Tensor,
    k: C::Tensor,
    v: C::Tensor,
    attn: C::Tensor,
    joint: C::Tensor,
    joint_normed: C::Tensor,
    joint_hidden: C::Tensor,
    concat: C::Tensor,
    joint_out: C::Tensor,
    out: C::Tensor,
    table: C::Tensor,
    scratch: C::Tensor,
}

/// What a Flux run carries from step to step.
pub struct FluxState<C: Compute> {
    acts: Option<Acts<C>>,
    /// The packed latent.
    latent: Vec<f32>,
    reserved: bool,
}

impl<C: Compute> Acts<C> {
    /// Every tensor of [`working_set::tensors`], in its order: this struct's own,
    /// then the image and text streams'.
    fn new(compute: &C, flux: &Flux) -> Result<Self, FamilyError> {
        let mut next = allocator(compute, working_set::shapes(flux))?;
        let mut acts = Self {
            latent: next()?,
            context: next()?,
            pooled: next()?,
            frequencies: next()?,
            embed_hidden: next()?,
            embed_out: next()?,
            vec: next()?,
            q: next()?,
            k: next()?,
            v: next()?,
            attn: next()?,
            joint: next()?,
            joint_normed: next()?,
            joint_hidden: next()?,
            concat: next()?,
            joint_out: next()?,
            out: next()?,
            table: next()?,
            scratch: next()?,
            img: StreamActs::new(&mut next)?,
            txt: StreamActs::new(&mut next)?,
        };
        compute.write(&mut acts.context, &flux.cond.context)?;
        compute.write(&mut acts.pooled, &flux.cond.pooled)?;
        compute.write(&mut acts.table, &flux.table)?;
        Ok(acts)
    }
}

impl Flux {
    fn ctx<'a, C: Compute>(&'a self, compute: &'a C) -> Result<Ctx<'a, C>, FamilyError> {
        Ok(Ctx {
            compute,
            kernels: compute.diffusion()?,
            weights: &self.weights,
            config: &self.config,
        })
    }

    /// The embedders: image and text tokens into the hidden width, and `silu(vec)`.
    fn head<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        blocks: &mut B,
        sigma: f32,
    ) -> Result<(), FamilyError> {
        let (compute, weights) = (cx.compute, &self.weights.head);
        blocks.with_held(compute, BlockId(0), |held, lora| {
            let scratch = &mut acts.scratch;
            cx.linear(
                held,
                lora,
                &weights.img_in,
                0,
                &acts.latent,
                &mut acts.img.x,
                scratch,
            )?;
            cx.linear(
                held,
                lora,
                &weights.txt_in,
                0,
                &acts.context,
                &mut acts.txt.x,
                scratch,
            )?;
            // The pipeline hands the transformer σ·1000/1000, which it scales by 1000.
            let t = sigma * 1000.0 / 1000.0;
            compute.write(&mut acts.frequencies, &timestep_embedding(t))?;
            let (hidden, out) = (&mut acts.embed_hidden, &mut acts.embed_out);
            cx.embedder(
                held,
                lora,
                &weights.time_in,
                &acts.frequencies,
                hidden,
                &mut acts.vec,
                scratch,
            )?;
            if let (Some(embedder), Some(guidance)) = (&weights.guidance_in, self.guidance) {
                compute.write(&mut acts.frequencies, &timestep_embedding(guidance))?;
                cx.embedder(
                    held,
                    lora,
                    embedder,
                    &acts.frequencies,
                    hidden,
                    out,
                    scratch,
                )?;
                compute.add(&mut acts.vec, out)?;
            }
            cx.embedder(
                held,
                lora,
                &weights.vector_in,
                &acts.pooled,
                hidden,
                out,
                scratch,
            )?;
            compute.add(&mut acts.vec, out)?;
            cx.kernels.silu(&mut acts.vec)?;
            Ok(())
        })
    }

    fn double<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        blocks: &mut B,
        block: usize,
    ) -> Result<(), FamilyError> {
        let (compute, weights) = (cx.compute, &self.weights.double[block]);
        let text = self.text_tokens();
        blocks.with_held(compute, BlockId(1 + block as u32), |held, lora| {
            let Acts {
                img,
                txt,
                q,
                k,
                v,
                attn,
                vec,
                table,
                scratch,
                ..
            } = acts;
            cx.stream_qkv(held, lora, &weights.img, vec, img, scratch)?;
            cx.stream_qkv(held, lora, &weights.txt, vec, txt, scratch)?;
            for (joint, (text_part, image_part)) in [
                (&mut *q, (&txt.q, &img.q)),
                (&mut *k, (&txt.k, &img.k)),
                (&mut *v, (&txt.v, &img.v)),
            ] {
                compute.write_rows(joint, 0, text_part)?;
                compute.write_rows(joint, text, image_part)?;
            }
            cx.attention(table, q, k, v, attn)?;
            compute.slice_rows(attn, 0, &mut txt.attn)?;
            compute.slice_rows(attn, text, &mut img.attn)?;
            cx.stream_out(held, lora, &weights.img, img, scratch)?;
            cx.stream_out(held, lora, &weights.txt, txt, scratch)
        })
    }

    fn single<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        blocks: &mut B,
        block: usize,
    ) -> Result<(), FamilyError> {
        let (compute, weights) = (cx.compute, &self.weights.single[block]);
        let hidden = self.config.hidden();
        let id = 1 + self.config.double_blocks + block;
        blocks.with_held(compute, BlockId(id as u32), |held, lora| {
            let Acts {
                img,
                q,
                k,
                v,
                attn,
                vec,
                table,
                scratch,
                joint,
                joint_normed,
                joint_hidden,
                concat,
                joint_out,
                ..
            } = acts;
            let mods = &mut img.mods[..3];
            cx.modulation(held, lora, &weights.modulation, vec, mods, scratch)?;
            cx.kernels
                .adaptive_norm(joint, &mods[0], &mods[1], EPS, joint_normed)?;
            cx.linear(held, lora, &weights.linear1, 0, joint_normed, q, scratch)?;
            cx.linear(
                held,
                lora,
                &weights.linear1,
                hidden,
                joint_normed,
                k,
                scratch,
            )?;
            cx.linear(
                held,
                lora,
                &weights.linear1,
                2 * hidden,
                joint_normed,
                v,
                scratch,
            )?;
            cx.linear(
                held,
                lora,
                &weights.linear1,
                3 * hidden,
                joint_normed,
                joint_hidden,
                scratch,
            )?;
            cx.norm(held, weights.q_norm, q)?;
            cx.norm(held, weights.k_norm, k)?;
            cx.attention(table, q, k, v, attn)?;
            cx.kernels.gelu_tanh(joint_hidden)?;
            cx.kernels.write_cols(concat, 0, attn)?;
            cx.kernels.write_cols(concat, hidden, joint_hidden)?;
            cx.linear(held, lora, &weights.linear2, 0, concat, joint_out, scratch)?;
            cx.kernels.add_gated(joint, joint_out, &mods[2])?;
            Ok(())
        })
    }

    /// The final adaLN and linear over the image tokens: the velocity.
    fn last<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        blocks: &mut B,
    ) -> Result<(), FamilyError> {
        let (compute, weights) = (cx.compute, &self.weights.last);
        let id = 1 + self.config.double_blocks + self.config.single_blocks;
        blocks.with_held(compute, BlockId(id as u32), |held, lora| {
            let Acts {
                img,
                joint,
                vec,
                out,
                scratch,
                ..
            } = acts;
            compute.slice_rows(joint, self.text_tokens(), &mut img.x)?;
            let mods = &mut img.mods[..2];
            cx.modulation(held, lora, &weights.modulation, vec, mods, scratch)?;
            let (shift, scale) = match weights.scale_first {
                false => (&mods[0], &mods[1]),
                true => (&mods[1], &mods[0]),
            };
            cx.kernels
                .adaptive_norm(&img.x, shift, scale, EPS, &mut img.normed)?;
            cx.linear(held, lora, &weights.linear, 0, &img.normed, out, scratch)
        })
    }
}

impl Family for Flux {
    type State<C: Compute> = FluxState<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<FluxState<C>, FamilyError> {
        // Refused here, before any block moves, on an adapter without the kernels.
        compute.diffusion()?;
        Ok(FluxState {
            acts: None,
            latent: Vec::new(),
            reserved: false,
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut FluxState<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let cx = self.ctx(compute)?;
        if !state.reserved {
            blocks.reserve_activations(self.working_set_bytes())?;
            state.reserved = true;
        }
        if state.acts.is_none() {
            state.acts = Some(Acts::new(compute, self)?);
        }
        let Some(acts) = state.acts.as_mut() else {
            return Err(FamilyError::internal(
                "activations were not allocated".into(),
            ));
        };
        // A run longer than one sample starts the next from the same first latent.
        let position = (step % self.steps_per_sample() as u64) as usize;
        if position == 0 {
            state.latent.clone_from(&self.initial);
        }
        let (sigma, next) = (
            self.sigmas[self.first + position],
            self.sigmas[self.first + position + 1],
        );
        compute.write(&mut acts.latent, &state.latent)?;
        self.head(&cx, acts, blocks, sigma)?;
        for block in 0..self.config.double_blocks {
            self.double(&cx, acts, blocks, block)?;
        }
        compute.write_rows(&mut acts.joint, 0, &acts.txt.x)?;
        compute.write_rows(&mut acts.joint, self.text_tokens(), &acts.img.x)?;
        for block in 0..self.config.single_blocks {
            self.single(&cx, acts, blocks, block)?;
        }
        self.last(&cx, acts, blocks)?;
        let velocity = compute.read(&acts.out)?;
        super::sampler::euler_step(&mut state.latent, &velocity, sigma, next);
        Ok(StepOutput {
            output: Some(state.latent.clone()),
            ..StepOutput::default()
        })
    }
}
