//! A WAN step: the velocity of the input latent at its timestep, over the blocks in
//! order — embedders, transformer blocks, output layer — the negative prompt's pass
//! beside the prompt's under each block when guided; when sampling, the solver's step.

use stagehand_actors::BlockId;

use super::embed::timestep_embedding;
use super::first_frame::FirstTime;
use super::layers::Ctx;
use super::sample::{guided, Sampler};
use super::weights::AttentionWeights;
use super::{working_set, Wan};
use crate::compute::Compute;
use crate::families::activations::allocator;
use crate::families::blocks::{Blocks, Held};
use crate::families::family::{Family, StepOutput};
use crate::families::FamilyError;

/// The activations of a step, allocated once per run (see `working_set`).
pub struct Acts<C: Compute> {
    patches: C::Tensor,
    context: C::Tensor,
    frequencies: C::Tensor,
    /// The time embedding (the output layer's modulation adds it), and its SiLU.
    temb: C::Tensor,
    temb_silu: C::Tensor,
    /// `time_proj(silu(temb))` as six `[1, dim]` vectors.
    time: Vec<C::Tensor>,
    /// The projected text states every cross-attention reads, and two of its size.
    text: C::Tensor,
    text_a: C::Tensor,
    text_b: C::Tensor,
    mods: Vec<C::Tensor>,
    x: C::Tensor,
    normed: C::Tensor,
    q: C::Tensor,
    k: C::Tensor,
    v: C::Tensor,
    attn: C::Tensor,
    proj: C::Tensor,
    hidden: C::Tensor,
    out: C::Tensor,
    table: C::Tensor,
    /// The negative prompt's pass, when guided.
    negative: Option<Negative<C>>,
    /// The first frame's modulation at timestep 0 (TI2V's image-to-video).
    first: Option<FirstTime<C>>,
}

/// What the negative prompt's pass keeps apart from the prompt's: its residual
/// stream, its projected text and its text states.
pub struct Negative<C: Compute> {
    x: C::Tensor,
    text: C::Tensor,
    context: C::Tensor,
}

/// A run's state: the activations, and the sampler's latent and solver.
pub struct WanState<C: Compute> {
    acts: Option<Acts<C>>,
    sampler: Option<Sampler>,
}

impl<C: Compute> Acts<C> {
    fn new(compute: &C, wan: &Wan) -> Result<Self, FamilyError> {
        let shapes = working_set::shapes(&wan.config, wan.tokens, wan.text, wan.guided());
        let mut next = allocator(compute, shapes)?;
        // Fields in the list's order: a struct literal evaluates in the order written.
        let mut acts = Self {
            patches: next()?,
            context: next()?,
            frequencies: next()?,
            temb: next()?,
            temb_silu: next()?,
            time: (0..6).map(|_| next()).collect::<Result<_, _>>()?,
            text: next()?,
            text_a: next()?,
            text_b: next()?,
            mods: (0..6).map(|_| next()).collect::<Result<_, _>>()?,
            x: next()?,
            normed: next()?,
            q: next()?,
            k: next()?,
            v: next()?,
            attn: next()?,
            proj: next()?,
            hidden: next()?,
            out: next()?,
            table: next()?,
            negative: None,
            first: None,
        };
        if let Some(rows) = wan.first_frame_rows() {
            acts.first = Some(FirstTime::new(compute, rows, wan.config.dim())?);
        }
        if let Some(guidance) = &wan.input.guidance {
            let mut negative = Negative {
                x: next()?,
                text: next()?,
                context: next()?,
            };
            compute.write(&mut negative.context, &guidance.negative)?;
            acts.negative = Some(negative);
        }
        compute.write(&mut acts.patches, &wan.patches)?;
        compute.write(&mut acts.context, &wan.input.context)?;
        compute.write(&mut acts.table, &wan.table)?;
        Ok(acts)
    }

    /// Swaps the prompt's pass for the negative prompt's (and back): the step runs
    /// the same code on either.
    fn swap_pass(&mut self) {
        if let Some(negative) = &mut self.negative {
            std::mem::swap(&mut self.x, &mut negative.x);
            std::mem::swap(&mut self.text, &mut negative.text);
            std::mem::swap(&mut self.context, &mut negative.context);
        }
    }

    /// Runs `pass` on the prompt's tensors, then on the negative prompt's.
    fn each_pass(
        &mut self,
        mut pass: impl FnMut(&mut Self) -> Result<(), FamilyError>,
    ) -> Result<(), FamilyError> {
        pass(self)?;
        if self.negative.is_some() {
            self.swap_pass();
            let outcome = pass(self);
            self.swap_pass();
            outcome?;
        }
        Ok(())
    }
}

impl Wan {
    fn ctx<'a, C: Compute>(&'a self, compute: &'a C) -> Result<Ctx<'a, C>, FamilyError> {
        Ok(Ctx {
            compute,
            kernels: compute.diffusion()?,
            weights: &self.weights,
            config: &self.config,
        })
    }

    /// The embedders: patches into the hidden width, the text states through the
    /// text embedder, the time embedding and its six modulation vectors.
    fn head<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        (acts, timestep): (&mut Acts<C>, f32),
        blocks: &mut B,
    ) -> Result<(), FamilyError> {
        let (compute, head) = (cx.compute, &self.weights.head);
        blocks.with_held(compute, BlockId(0), |held, _| {
            acts.each_pass(|acts| {
                cx.linear(held, &head.patch_embedding, 0, &acts.patches, &mut acts.x)?;
                cx.linear(held, &head.text_1, 0, &acts.context, &mut acts.text_a)?;
                cx.kernels.gelu_tanh(&mut acts.text_a)?;
                cx.linear(held, &head.text_2, 0, &acts.text_a, &mut acts.text)
            })?;
            let Acts {
                frequencies,
                temb_silu,
                temb,
                time,
                first,
                ..
            } = acts;
            let scratch = (&mut *frequencies, &mut *temb_silu);
            self.time_embedding(cx, held, (timestep, scratch), (temb, time.as_mut_slice()))?;
            if let Some(first) = first {
                let scratch = (&mut *frequencies, &mut *temb_silu);
                let out = (&mut first.temb, first.time.as_mut_slice());
                self.time_embedding(cx, held, (0.0, scratch), out)?;
            }
            Ok(())
        })
    }

    /// `temb` and the six `time_proj` vectors of `timestep`.
    fn time_embedding<C: Compute>(
        &self,
        cx: &Ctx<'_, C>,
        held: &Held<C::Block>,
        (timestep, (frequencies, silu)): (f32, (&mut C::Tensor, &mut C::Tensor)),
        (temb, time): (&mut C::Tensor, &mut [C::Tensor]),
    ) -> Result<(), FamilyError> {
        let (compute, head) = (cx.compute, &self.weights.head);
        compute.write(
            frequencies,
            &timestep_embedding(timestep, self.config.freq_dim),
        )?;
        cx.linear(held, &head.time_1, 0, frequencies, silu)?;
        cx.kernels.silu(silu)?;
        cx.linear(held, &head.time_2, 0, silu, temb)?;
        compute.copy(temb, silu)?;
        cx.kernels.silu(silu)?;
        let dim = self.config.dim();
        for (chunk, vector) in time.iter_mut().enumerate() {
            cx.linear(held, &head.time_proj, chunk * dim, silu, vector)?;
        }
        Ok(())
    }

    /// One transformer block: modulated self-attention with rope, cross-attention to
    /// the text, modulated GELU-tanh feed-forward.
    fn block<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        blocks: &mut B,
        block: usize,
    ) -> Result<(), FamilyError> {
        let id = BlockId(1 + block as u32);
        blocks.with_held(cx.compute, id, |held, _| {
            acts.each_pass(|acts| self.block_pass(cx, held, block, acts))
        })
    }

    /// One pass (the prompt's or the negative prompt's) through a held block.
    fn block_pass<C: Compute>(
        &self,
        cx: &Ctx<'_, C>,
        held: &Held<C::Block>,
        block: usize,
        acts: &mut Acts<C>,
    ) -> Result<(), FamilyError> {
        let (compute, weights) = (cx.compute, &self.weights.blocks[block]);
        let eps = self.config.eps;
        let time: Vec<&C::Tensor> = acts.time.iter().collect();
        cx.modulation(held, weights.scale_shift_table, &time, &mut acts.mods)?;
        if let Some(first) = &mut acts.first {
            let time: Vec<&C::Tensor> = first.time.iter().collect();
            cx.modulation(held, weights.scale_shift_table, &time, &mut first.mods)?;
        }
        self.modulated_norm(cx, acts, 0)?;
        self.self_attention(cx, held, &weights.attn1, acts)?;
        self.gated_add(cx, acts, 2)?;
        match weights.norm2 {
            Some((weight, bias)) => {
                let view = held.view(compute);
                let gamma = view.weight(&self.weights.slot(weight)?)?;
                let beta = view.weight(&self.weights.slot(bias)?)?;
                compute.layer_norm(&acts.x, &gamma, &beta, eps, &mut acts.normed)?;
            }
            None => compute.copy(&acts.x, &mut acts.normed)?,
        }
        self.cross_attention(cx, held, &weights.attn2, acts)?;
        compute.add(&mut acts.x, &acts.proj)?;
        self.modulated_norm(cx, acts, 3)?;
        cx.linear(held, &weights.ffn_in, 0, &acts.normed, &mut acts.hidden)?;
        cx.kernels.gelu_tanh(&mut acts.hidden)?;
        cx.linear(held, &weights.ffn_out, 0, &acts.hidden, &mut acts.proj)?;
        self.gated_add(cx, acts, 5)
    }

    /// `normed ← LayerNorm(x)·(1 + mods[shift + 1]) + mods[shift]`, the first
    /// frame's rows with its own vectors.
    fn modulated_norm<C: Compute>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        shift: usize,
    ) -> Result<(), FamilyError> {
        let eps = self.config.eps;
        let Acts {
            x,
            mods,
            normed,
            first,
            ..
        } = acts;
        let (shift_vector, scale) = (&mods[shift], &mods[shift + 1]);
        cx.kernels
            .adaptive_norm(x, shift_vector, scale, eps, normed)?;
        match first {
            Some(first) => first.adaptive_norm(cx.compute, (x, shift, eps), normed),
            None => Ok(()),
        }
    }

    /// `x ← x + mods[gate]·proj`, the first frame's rows with its own gate.
    fn gated_add<C: Compute>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        gate: usize,
    ) -> Result<(), FamilyError> {
        let Acts {
            x,
            proj,
            mods,
            first,
            ..
        } = acts;
        if let Some(first) = first {
            first.add_gated(cx.compute, (x, proj, gate))?;
        }
        cx.kernels.add_gated(x, proj, &mods[gate])?;
        match first {
            Some(first) => first.restore(cx.compute, x),
            None => Ok(()),
        }
    }

    /// `proj ← to_out(attention(q, k, v))` over the video tokens, q and k normed
    /// across heads and roped (q before k, in place).
    fn self_attention<C: Compute>(
        &self,
        cx: &Ctx<'_, C>,
        held: &Held<C::Block>,
        weights: &AttentionWeights,
        acts: &mut Acts<C>,
    ) -> Result<(), FamilyError> {
        let heads = self.config.heads;
        cx.linear(held, &weights.to_q, 0, &acts.normed, &mut acts.attn)?;
        cx.rms(held, weights.norm_q, &acts.attn, &mut acts.q)?;
        cx.kernels.rope_pairs(&mut acts.q, heads, &acts.table)?;
        cx.linear(held, &weights.to_k, 0, &acts.normed, &mut acts.attn)?;
        cx.rms(held, weights.norm_k, &acts.attn, &mut acts.k)?;
        cx.kernels.rope_pairs(&mut acts.k, heads, &acts.table)?;
        cx.linear(held, &weights.to_v, 0, &acts.normed, &mut acts.v)?;
        cx.attention(&acts.q, &acts.k, &acts.v, self.tokens, &mut acts.attn)?;
        cx.linear(held, &weights.to_out, 0, &acts.attn, &mut acts.proj)
    }

    /// `proj ← to_out(attention(q, k, v))` with q from the video tokens and k, v from
    /// the text states, written into the first rows of self-attention's k and v (the
    /// rows after them masked).
    fn cross_attention<C: Compute>(
        &self,
        cx: &Ctx<'_, C>,
        held: &Held<C::Block>,
        weights: &AttentionWeights,
        acts: &mut Acts<C>,
    ) -> Result<(), FamilyError> {
        let compute = cx.compute;
        cx.linear(held, &weights.to_q, 0, &acts.normed, &mut acts.attn)?;
        cx.rms(held, weights.norm_q, &acts.attn, &mut acts.q)?;
        cx.linear(held, &weights.to_k, 0, &acts.text, &mut acts.text_a)?;
        cx.rms(held, weights.norm_k, &acts.text_a, &mut acts.text_b)?;
        compute.write_rows(&mut acts.k, 0, &acts.text_b)?;
        cx.linear(held, &weights.to_v, 0, &acts.text, &mut acts.text_a)?;
        compute.write_rows(&mut acts.v, 0, &acts.text_a)?;
        cx.attention(&acts.q, &acts.k, &acts.v, self.text, &mut acts.attn)?;
        cx.linear(held, &weights.to_out, 0, &acts.attn, &mut acts.proj)
    }

    /// The output norm modulated by `scale_shift_table + temb`, then `proj_out`: the
    /// velocity of each pass (the prompt's, then the negative prompt's), unpatched.
    fn output<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        acts: &mut Acts<C>,
        blocks: &mut B,
    ) -> Result<Vec<Vec<f32>>, FamilyError> {
        let (compute, weights) = (cx.compute, &self.weights.output);
        let id = BlockId(1 + self.config.layers as u32);
        let mut velocities = Vec::with_capacity(2);
        blocks.with_held(compute, id, |held, _| {
            acts.each_pass(|acts| {
                let table = weights.scale_shift_table;
                let mods = &mut acts.mods[..2];
                cx.modulation(held, table, &[&acts.temb, &acts.temb], mods)?;
                if let Some(first) = &mut acts.first {
                    let mods = &mut first.mods[..2];
                    cx.modulation(held, table, &[&first.temb, &first.temb], mods)?;
                }
                self.modulated_norm(cx, acts, 0)?;
                cx.linear(held, &weights.proj_out, 0, &acts.normed, &mut acts.out)?;
                let rows = compute.read(&acts.out)?;
                velocities.push(self.grid.unpatchify(&rows, self.config.out_channels));
                Ok(())
            })
        })?;
        Ok(velocities)
    }

    /// The velocity of the latent in `acts.patches` at `timestep`, guided when the
    /// input says so.
    fn velocity<C: Compute, B: Blocks<C>>(
        &self,
        cx: &Ctx<'_, C>,
        (acts, timestep): (&mut Acts<C>, f32),
        blocks: &mut B,
    ) -> Result<Vec<f32>, FamilyError> {
        self.head(cx, (acts, timestep), blocks)?;
        for block in 0..self.config.layers {
            self.block(cx, acts, blocks, block)?;
        }
        let velocities = self.output(cx, acts, blocks)?;
        match (&self.input.guidance, velocities.as_slice()) {
            (Some(guidance), [conditional, unconditional]) => {
                Ok(guided(conditional, unconditional, guidance.scale))
            }
            (None, [velocity]) => Ok(velocity.clone()),
            _ => Err(FamilyError::internal("a pass computed no velocity".into())),
        }
    }
}

impl Family for Wan {
    type State<C: Compute> = WanState<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<WanState<C>, FamilyError> {
        // Refused here, before any block moves, on an adapter without the kernels.
        compute.diffusion()?;
        // A deferred share's first step waits here for its start; the session has
        // started already, so its first blocks load meanwhile.
        self.take_start()?;
        Ok(WanState {
            acts: None,
            sampler: None,
        })
    }

    /// One velocity; when sampling, the next denoising step of the share (its output
    /// the step's guided velocity, the latent moved on by the solver).
    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut WanState<C>,
        blocks: &mut B,
        _step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let cx = self.ctx(compute)?;
        if state.acts.is_none() {
            blocks.reserve_activations(self.working_set_bytes())?;
            state.acts = Some(Acts::new(compute, self)?);
        }
        let Some(acts) = state.acts.as_mut() else {
            return Err(FamilyError::internal(
                "activations were not allocated".into(),
            ));
        };
        let Some(sample) = self.share() else {
            let velocity = self.velocity(&cx, (acts, self.input.timestep), blocks)?;
            return Ok(StepOutput {
                output: Some(velocity),
                ..StepOutput::default()
            });
        };
        let sampler = match &mut state.sampler {
            Some(sampler) if !sampler.done(sample.steps) => sampler,
            slot => slot.insert(Sampler::new(sample)),
        };
        let Some(timestep) = sampler.timestep() else {
            return Err(FamilyError::request(
                "steps",
                "the schedule has no step left".into(),
            ));
        };
        let rows = self.tokens.max(self.text);
        compute.write(
            &mut acts.patches,
            &(self.grid).patchify(&self.input.joined(&sampler.latent), rows),
        )?;
        let velocity = self.velocity(&cx, (acts, timestep), blocks)?;
        sampler
            .solver
            .step(&velocity, &mut sampler.latent)
            .map_err(FamilyError::internal)?;
        Ok(StepOutput {
            output: Some(velocity),
            ..StepOutput::default()
        })
    }
}
