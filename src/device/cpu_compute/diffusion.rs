//! The CPU's diffusion-transformer kernels ([`Diffusion`]): plain loops, each output
//! element computed by one thread in one fixed order, so the bits are the same for any
//! pool size. The work is small beside the products around it (one pass over the
//! activations each).

use super::{elementwise, CpuCompute, CpuTensor};
use crate::compute::diffusion::{self, Diffusion};
use crate::compute::{shapes, ComputeError};

/// What [`crate::compute::Compute::diffusion`] gives on the CPU.
pub(super) type Kernels<'a> = &'a dyn Diffusion<Tensor = CpuTensor>;

impl Diffusion for CpuCompute {
    type Tensor = CpuTensor;

    fn adaptive_norm(
        &self,
        x: &CpuTensor,
        shift: &CpuTensor,
        scale: &CpuTensor,
        eps: f32,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        shapes::same("adaptive_norm", x.dims(), y.dims())?;
        diffusion::modulation("adaptive_norm shift", x.dims(), shift.dims())?;
        diffusion::modulation("adaptive_norm scale", x.dims(), scale.dims())?;
        let cols = x.cols;
        for (row_in, row_out) in x.data.chunks_exact(cols).zip(y.data.chunks_exact_mut(cols)) {
            let mean = row_in.iter().sum::<f32>() / cols as f32;
            let variance = row_in
                .iter()
                .map(|value| (value - mean) * (value - mean))
                .sum::<f32>()
                / cols as f32;
            let inverse = 1.0 / (variance + eps).sqrt();
            let modulation = shift.data.iter().zip(&scale.data);
            for ((out, value), (shift, scale)) in row_out.iter_mut().zip(row_in).zip(modulation) {
                *out = (value - mean) * inverse * (1.0 + scale) + shift;
            }
        }
        Ok(())
    }

    fn add_gated(
        &self,
        x: &mut CpuTensor,
        y: &CpuTensor,
        gate: &CpuTensor,
    ) -> Result<(), ComputeError> {
        shapes::same("add_gated", x.dims(), y.dims())?;
        diffusion::modulation("add_gated gate", x.dims(), gate.dims())?;
        let cols = x.cols;
        for (row, row_y) in x.data.chunks_exact_mut(cols).zip(y.data.chunks_exact(cols)) {
            for ((value, add), gate) in row.iter_mut().zip(row_y).zip(&gate.data) {
                *value += gate * add;
            }
        }
        Ok(())
    }

    fn silu(&self, x: &mut CpuTensor) -> Result<(), ComputeError> {
        elementwise::silu(&self.pool, &mut x.data);
        Ok(())
    }

    fn gelu_tanh(&self, x: &mut CpuTensor) -> Result<(), ComputeError> {
        elementwise::gelu_tanh_all(&self.pool, &mut x.data);
        Ok(())
    }

    fn rope_pairs(
        &self,
        x: &mut CpuTensor,
        heads: usize,
        table: &CpuTensor,
    ) -> Result<(), ComputeError> {
        let head_dim = diffusion::rope_pairs(x.dims(), heads, table.dims())?;
        let cols = x.cols;
        for (row, angles) in x
            .data
            .chunks_exact_mut(cols)
            .zip(table.data.chunks_exact(head_dim))
        {
            for head in row.chunks_exact_mut(head_dim) {
                for (pair, angle) in head.chunks_exact_mut(2).zip(angles.chunks_exact(2)) {
                    let (cos, sin) = (angle[0], angle[1]);
                    let (real, imaginary) = (pair[0], pair[1]);
                    pair[0] = real * cos - imaginary * sin;
                    pair[1] = imaginary * cos + real * sin;
                }
            }
        }
        Ok(())
    }

    fn write_cols(
        &self,
        to: &mut CpuTensor,
        at: usize,
        from: &CpuTensor,
    ) -> Result<(), ComputeError> {
        diffusion::write_cols(to.dims(), at, from.dims())?;
        let (wide, narrow) = (to.cols, from.cols);
        if narrow == 0 {
            return Ok(());
        }
        for (row_to, row_from) in to
            .data
            .chunks_exact_mut(wide)
            .zip(from.data.chunks_exact(narrow))
        {
            row_to[at..at + narrow].copy_from_slice(row_from);
        }
        Ok(())
    }
}
