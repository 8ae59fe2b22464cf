//! TI2V-5B's image-to-video (`expand_timesteps` with an image, diffusers'
//! `WanImageToVideoPipeline` with `expand_timesteps: true`): the first latent frame is
//! the encoded image, and its tokens are at timestep 0 while the others are at the
//! step's timestep — the transformer's `timestep` of shape `[batch, seq]`,
//! `first_frame_mask[0][0][:, ::2, ::2] · t` flattened, each token modulated by the
//! time embedding of its own timestep (`temb` `[batch, seq, 6, dim]`).
//!
//! With two timesteps only, a step computes each modulated norm and gated residual
//! over all rows with the step's timestep, then recomputes the first frame's rows
//! with timestep 0's vectors and writes them over (the norm and the gate act row by
//! row, so the rows are exactly what a per-token modulation gives). Without an image
//! every token has the step's timestep: `expand_timesteps` then computes what the
//! scalar timestep computes, and the scalar path is taken.

use crate::compute::Compute;
use crate::families::FamilyError;

/// The encoded image that stands for the first latent frame, `[channels, height,
/// width]` (the noise's channels), normalised as the pipeline's latents are.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstFrame {
    pub latent: Vec<f32>,
}

impl FirstFrame {
    /// `latent` `[channels, frames, plane]` with its first frame replaced by the
    /// image's: diffusers' `(1 − mask) · condition + mask · latents`.
    pub fn replace(&self, latent: &[f32], (channels, frames): (usize, usize)) -> Vec<f32> {
        let mut joined = latent.to_vec();
        let plane = latent.len() / (channels * frames).max(1);
        for (channel, image) in self.latent.chunks_exact(plane.max(1)).enumerate() {
            let at = channel * frames * plane;
            if let Some(target) = joined.get_mut(at..at + plane) {
                target.copy_from_slice(image);
            }
        }
        joined
    }
}

/// Bytes a [`FirstTime`] of `rows` rows holds: what a step reserves beside its
/// other activations.
pub fn first_time_bytes(rows: usize, dim: usize) -> u64 {
    4 * (13 * dim + 2 * rows * dim) as u64
}

/// The first frame's own modulation: its time embedding at timestep 0, the six
/// vectors of `time_proj`, a block's six modulation vectors, and two scratch
/// tensors of its rows.
pub struct FirstTime<C: Compute> {
    pub temb: C::Tensor,
    pub time: Vec<C::Tensor>,
    pub mods: Vec<C::Tensor>,
    pub x: C::Tensor,
    pub y: C::Tensor,
}

impl<C: Compute> FirstTime<C> {
    pub fn new(compute: &C, rows: usize, dim: usize) -> Result<Self, FamilyError> {
        let vector = || compute.tensor(1, dim);
        Ok(Self {
            temb: vector()?,
            time: (0..6).map(|_| vector()).collect::<Result<_, _>>()?,
            mods: (0..6).map(|_| vector()).collect::<Result<_, _>>()?,
            x: compute.tensor(rows, dim)?,
            y: compute.tensor(rows, dim)?,
        })
    }

    /// `normed[..rows] ← LayerNorm(x[..rows])·(1 + scale) + shift` with the first
    /// frame's `mods[shift]`, `mods[shift + 1]`.
    pub fn adaptive_norm(
        &mut self,
        compute: &C,
        (x, shift, eps): (&C::Tensor, usize, f32),
        normed: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        compute.slice_rows(x, 0, &mut self.x)?;
        let (shift, scale) = (&self.mods[shift], &self.mods[shift + 1]);
        (compute.diffusion()?).adaptive_norm(&self.x, shift, scale, eps, &mut self.y)?;
        compute.write_rows(normed, 0, &self.y)?;
        Ok(())
    }

    /// Keeps `x[..rows] + mods[gate]·y[..rows]` (before `x` is updated with the
    /// step's gate), to be written over by [`Self::restore`].
    pub fn add_gated(
        &mut self,
        compute: &C,
        (x, y, gate): (&C::Tensor, &C::Tensor, usize),
    ) -> Result<(), FamilyError> {
        compute.slice_rows(x, 0, &mut self.x)?;
        compute.slice_rows(y, 0, &mut self.y)?;
        (compute.diffusion()?).add_gated(&mut self.x, &self.y, &self.mods[gate])?;
        Ok(())
    }

    /// `x[..rows] ← ` what [`Self::add_gated`] kept.
    pub fn restore(&self, compute: &C, x: &mut C::Tensor) -> Result<(), FamilyError> {
        compute.write_rows(x, 0, &self.x)?;
        Ok(())
    }
}
