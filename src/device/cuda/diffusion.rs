//! The diffusion-transformer operations ([`Diffusion`]) on the GPU: one NVRTC kernel
//! each on the compute stream (`kernels_diffusion.rs`), checked with the same shape
//! rules as the CPU adapter before anything is queued.

use super::compute::CudaCompute;
use super::kernels_diffusion::Activation;
use super::tensor::{same_shape, CudaTensor};
use crate::compute::diffusion::{self, Diffusion};
use crate::compute::ComputeError;

impl CudaCompute {
    fn activation(&self, kind: Activation, x: &mut CudaTensor) -> Result<(), ComputeError> {
        // SAFETY: x holds `elements` f32, borrowed mutably for the launch.
        self.queue(|| unsafe { self.kernels.activation(kind, x.ptr(), x.elements() as u64) })
    }
}

impl Diffusion for CudaCompute {
    type Tensor = CudaTensor;

    fn adaptive_norm(
        &self,
        x: &CudaTensor,
        shift: &CudaTensor,
        scale: &CudaTensor,
        eps: f32,
        y: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        same_shape("adaptive_norm", x, y)?;
        let dims = (x.rows(), x.cols());
        diffusion::modulation("adaptive_norm shift", dims, (shift.rows(), shift.cols()))?;
        diffusion::modulation("adaptive_norm scale", dims, (scale.rows(), scale.cols()))?;
        // SAFETY: x and y [rows, cols] (y borrowed mutably, so distinct), shift and
        // scale [1, cols].
        self.queue(|| unsafe {
            self.kernels.adaptive_norm(
                x.ptr(),
                shift.ptr(),
                scale.ptr(),
                eps,
                y.ptr(),
                x.rows(),
                x.cols(),
            )
        })
    }

    fn add_gated(
        &self,
        x: &mut CudaTensor,
        y: &CudaTensor,
        gate: &CudaTensor,
    ) -> Result<(), ComputeError> {
        same_shape("add_gated", x, y)?;
        diffusion::modulation(
            "add_gated gate",
            (x.rows(), x.cols()),
            (gate.rows(), gate.cols()),
        )?;
        // SAFETY: x and y [rows, cols] (x borrowed mutably, so distinct), gate [1, cols].
        self.queue(|| unsafe {
            self.kernels
                .add_gated(x.ptr(), y.ptr(), gate.ptr(), x.rows(), x.cols())
        })
    }

    fn silu(&self, x: &mut CudaTensor) -> Result<(), ComputeError> {
        self.activation(Activation::Silu, x)
    }

    fn gelu_tanh(&self, x: &mut CudaTensor) -> Result<(), ComputeError> {
        self.activation(Activation::GeluTanh, x)
    }

    fn rope_pairs(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        table: &CudaTensor,
    ) -> Result<(), ComputeError> {
        let head_dim =
            diffusion::rope_pairs((x.rows(), x.cols()), heads, (table.rows(), table.cols()))?;
        // SAFETY: x is [rows, heads·head_dim] and table [rows, head_dim], checked above.
        self.queue(|| unsafe {
            self.kernels
                .rope_pairs(x.ptr(), table.ptr(), x.rows(), heads, head_dim)
        })
    }

    fn write_cols(
        &self,
        to: &mut CudaTensor,
        at: usize,
        from: &CudaTensor,
    ) -> Result<(), ComputeError> {
        diffusion::write_cols((to.rows(), to.cols()), at, (from.rows(), from.cols()))?;
        // SAFETY: `from`'s columns fit in `to` from column `at` (checked above); the
        // two are distinct (to borrowed mutably).
        self.queue(|| unsafe {
            self.kernels
                .write_cols(to.ptr(), from.ptr(), to.rows(), to.cols(), at, from.cols())
        })
    }
}
