//! Launches of the diffusion-transformer kernels (Flux): adaptive LayerNorm, the gated
//! residual, SiLU, the tanh GELU, rotary embedding on interleaved pairs and the
//! column write of the single block's concatenation. The same `# Safety` promise as in
//! `kernels.rs` holds for each.

use cudarc::driver::{CudaFunction, CudaModule, PushKernelArg};
use stagehand_actors::DevicePtr;
use std::sync::Arc;

use super::error::CudaError;
use super::kernels::{grid_for, narrow_u32, per_row, Kernels};

/// The diffusion kernels of the compiled module.
pub struct DiffusionKernels {
    adaptive_norm: CudaFunction,
    add_gated: CudaFunction,
    silu: CudaFunction,
    gelu_tanh: CudaFunction,
    rope_pairs: CudaFunction,
    write_cols: CudaFunction,
}

/// The kernel names [`DiffusionKernels::load`] asks for.
pub const NAMES: [&str; 6] = [
    "stagehand_adaptive_norm",
    "stagehand_add_gated",
    "stagehand_silu",
    "stagehand_gelu_tanh",
    "stagehand_rope_pairs",
    "stagehand_write_cols",
];

impl DiffusionKernels {
    pub(super) fn load(module: &Arc<CudaModule>) -> Result<Self, CudaError> {
        let function = |name: &str| {
            module
                .load_function(name)
                .map_err(CudaError::driver("cuModuleGetFunction"))
        };
        let [adaptive_norm, add_gated, silu, gelu_tanh, rope_pairs, write_cols] = NAMES;
        Ok(Self {
            adaptive_norm: function(adaptive_norm)?,
            add_gated: function(add_gated)?,
            silu: function(silu)?,
            gelu_tanh: function(gelu_tanh)?,
            rope_pairs: function(rope_pairs)?,
            write_cols: function(write_cols)?,
        })
    }
}

impl Kernels {
    /// `y ← LayerNorm(x)·(1 + scale) + shift` per row of `rows × cols` (`shift`,
    /// `scale`: `cols` f32).
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn adaptive_norm(
        &self,
        x: DevicePtr,
        shift: DevicePtr,
        scale: DevicePtr,
        eps: f32,
        y: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let config = per_row(rows as u64)?;
        let (x, shift, scale, y) = (x.0, shift.0, scale.0, y.0);
        let cols = narrow_u32(cols, "columns")?;
        let mut launch = self.stream.launch_builder(&self.diffusion.adaptive_norm);
        launch
            .arg(&x)
            .arg(&shift)
            .arg(&scale)
            .arg(&eps)
            .arg(&y)
            .arg(&cols);
        // SAFETY: (pointer ×3, float, pointer, u32); the caller's promise covers them.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `x ← x + gate·y` over `rows × cols` (`gate`: `cols` f32).
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn add_gated(
        &self,
        x: DevicePtr,
        y: DevicePtr,
        gate: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (cols as u64);
        if count == 0 {
            return Ok(());
        }
        let (x, y, gate, rows) = (x.0, y.0, gate.0, rows as u64);
        let cols = narrow_u32(cols, "columns")?;
        let mut launch = self.stream.launch_builder(&self.diffusion.add_gated);
        launch.arg(&x).arg(&y).arg(&gate).arg(&rows).arg(&cols);
        // SAFETY: (pointer ×3, u64, u32); the caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `x ← x·σ(x)` (`silu`) or the tanh GELU (`gelu_tanh`) over `count` f32.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn activation(
        &self,
        kind: Activation,
        x: DevicePtr,
        count: u64,
    ) -> Result<(), CudaError> {
        let function = match kind {
            Activation::Silu => &self.diffusion.silu,
            Activation::GeluTanh => &self.diffusion.gelu_tanh,
        };
        // SAFETY: the caller's contract; both are `(float*, u64)` element-wise kernels.
        unsafe { self.in_place(function, x, count) }
    }

    /// Rotary embedding on interleaved pairs of `x` (`[rows, heads·head_dim]`) in
    /// place, with a `[rows, head_dim]` cos/sin table.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn rope_pairs(
        &self,
        x: DevicePtr,
        table: DevicePtr,
        rows: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (heads as u64) * (head_dim as u64 / 2);
        if count == 0 {
            return Ok(());
        }
        let (x, table, rows) = (x.0, table.0, rows as u64);
        let heads = narrow_u32(heads, "heads")?;
        let head_dim = narrow_u32(head_dim, "head_dim")?;
        let mut launch = self.stream.launch_builder(&self.diffusion.rope_pairs);
        launch
            .arg(&x)
            .arg(&table)
            .arg(&rows)
            .arg(&heads)
            .arg(&head_dim);
        // SAFETY: (pointer, pointer, u64, u32, u32); the caller's promise covers them.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `to[r][at .. at + narrow] ← from[r]` for `rows` rows (`to` is `wide` columns).
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn write_cols(
        &self,
        to: DevicePtr,
        from: DevicePtr,
        rows: usize,
        wide: usize,
        at: usize,
        narrow: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (narrow as u64);
        if count == 0 {
            return Ok(());
        }
        let (to, from, rows) = (to.0, from.0, rows as u64);
        let wide = narrow_u32(wide, "columns")?;
        let at = narrow_u32(at, "column")?;
        let narrow = narrow_u32(narrow, "columns")?;
        let mut launch = self.stream.launch_builder(&self.diffusion.write_cols);
        launch
            .arg(&to)
            .arg(&from)
            .arg(&rows)
            .arg(&wide)
            .arg(&at)
            .arg(&narrow);
        // SAFETY: (pointer, pointer, u64, u32 ×3); the caller's promise covers them.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }
}

/// The element-wise activations a diffusion block applies in place.
#[derive(Debug, Clone, Copy)]
pub enum Activation {
    Silu,
    GeluTanh,
}
