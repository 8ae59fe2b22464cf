//! The pieces of a WAN pass against the compute port: a linear (or rows of one), the
//! modulation vectors of a table plus the time embedding, q/k RMS norm across heads,
//! and attention.

use crate::compute::{Attention, Compute, Diffusion, Mask};
use crate::families::blocks::Held;
use crate::families::FamilyError;

use super::config::WanConfig;
use super::weights::{Linear, WanWeights};

/// What every block's compute reads.
pub struct Ctx<'a, C: Compute> {
    pub compute: &'a C,
    pub kernels: &'a dyn Diffusion<Tensor = C::Tensor>,
    pub weights: &'a WanWeights,
    pub config: &'a WanConfig,
}

impl<C: Compute> Ctx<'_, C> {
    /// `y ← x·W[first ..]ᵀ + b[first ..]` for as many output rows as `y` has columns.
    pub fn linear(
        &self,
        held: &Held<C::Block>,
        linear: &Linear,
        first: usize,
        x: &C::Tensor,
        y: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let rows = self.compute.dims(y).1;
        if first + rows > linear.rows {
            return Err(FamilyError::internal(format!(
                "output rows {first}..{} of a linear of {} rows",
                first + rows,
                linear.rows
            )));
        }
        let weight = self.weights.matrix(linear)?.sub_rows(first, rows);
        let bias = self.weights.slot(linear.bias)?.sub_vector(first, rows);
        let view = held.view(self.compute);
        self.compute
            .linear(x, &view.weight(&weight)?, Some(&view.weight(&bias)?), y)?;
        Ok(())
    }

    /// `out[i] ← time[i] + table[i]`: a block's (or the output layer's) modulation
    /// vectors, diffusers' `scale_shift_table + temb`, from a `[1, count, dim]` table.
    pub fn modulation(
        &self,
        held: &Held<C::Block>,
        table: usize,
        time: &[&C::Tensor],
        out: &mut [C::Tensor],
    ) -> Result<(), FamilyError> {
        let slot = self.weights.table(table, out.len(), self.config.dim())?;
        let view = held.view(self.compute);
        let table = view.weight(&slot)?;
        for (row, (vector, time)) in out.iter_mut().zip(time).enumerate() {
            self.compute.copy(time, vector)?;
            self.compute.gather_add(&table, &[row as u32], vector)?;
        }
        Ok(())
    }

    /// `y ← RMSNorm(x)·gamma` over all heads of a row (`rms_norm_across_heads`).
    pub fn rms(
        &self,
        held: &Held<C::Block>,
        gamma: usize,
        x: &C::Tensor,
        y: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let view = held.view(self.compute);
        let gamma = view.weight(&self.weights.slot(gamma)?)?;
        self.compute.rms_norm(x, Some(&gamma), self.config.eps, y)?;
        Ok(())
    }

    /// Softmax attention of every row of `q` over the first `keys` rows of `k` and
    /// `v` (all rows of a self-attention, the text's of a cross-attention).
    pub fn attention(
        &self,
        q: &C::Tensor,
        k: &C::Tensor,
        v: &C::Tensor,
        keys: usize,
        out: &mut C::Tensor,
    ) -> Result<(), FamilyError> {
        let lengths = [keys];
        let shape = Attention {
            sequences: 1,
            sequence_length: self.compute.dims(q).0,
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
