//! Launches of the kernels attention and decoder blocks use: the masked softmax (over
//! a padded batch or a causal KV cache), the rotary embedding and SwiGLU. The same
//! `# Safety` promise as in `kernels.rs` holds for each.

use cudarc::driver::PushKernelArg;
use stagehand_actors::DevicePtr;

use super::error::CudaError;
use super::kernels::{grid_for, narrow_u32, per_row, Kernels};

impl Kernels {
    /// Softmax of every row of `scores` (`[heads][sequences][queries][keys]`),
    /// masked by `lengths` (one u32 per sequence: its real keys) or, with `causal`, by
    /// the query's position after `past` cached rows (query `i` sees keys
    /// `0..=past + i`).
    ///
    /// # Safety
    /// See the module docs; `lengths` may be null only when `causal`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn masked_softmax(
        &self,
        scores: DevicePtr,
        lengths: DevicePtr,
        heads: usize,
        sequences: usize,
        queries: usize,
        keys: usize,
        past: usize,
        causal: bool,
    ) -> Result<(), CudaError> {
        let rows = (heads as u64) * (sequences as u64) * (queries as u64);
        if rows == 0 || keys == 0 {
            return Ok(());
        }
        let config = per_row(rows)?;
        let (scores, lengths) = (scores.0, lengths.0);
        let sequences = narrow_u32(sequences, "sequences")?;
        let queries = narrow_u32(queries, "queries")?;
        let keys = narrow_u32(keys, "keys")?;
        let past = narrow_u32(past, "cached rows")?;
        let causal = i32::from(causal);
        let mut launch = self.stream.launch_builder(&self.masked_softmax);
        launch
            .arg(&scores)
            .arg(&lengths)
            .arg(&sequences)
            .arg(&queries)
            .arg(&keys)
            .arg(&past)
            .arg(&causal);
        // SAFETY: (pointer, pointer, u32 ×4, int); the caller's promise covers them.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `gate ← silu(gate)·up` over `count` f32.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn silu_mul(
        &self,
        gate: DevicePtr,
        up: DevicePtr,
        count: u64,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let (gate, up) = (gate.0, up.0);
        let mut launch = self.stream.launch_builder(&self.silu_mul);
        launch.arg(&gate).arg(&up).arg(&count);
        // SAFETY: (pointer, pointer, u64); the caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// Rotary embedding of `x` (`[rows, heads·head_dim]`) in place, with one u32
    /// position per row and `head_dim / 2` f32 frequencies.
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn rope(
        &self,
        x: DevicePtr,
        positions: DevicePtr,
        inv_freq: DevicePtr,
        rows: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (heads as u64) * (head_dim as u64 / 2);
        if count == 0 {
            return Ok(());
        }
        let (x, positions, inv_freq, rows) = (x.0, positions.0, inv_freq.0, rows as u64);
        let heads = narrow_u32(heads, "heads")?;
        let head_dim = narrow_u32(head_dim, "head_dim")?;
        let mut launch = self.stream.launch_builder(&self.rope);
        launch
            .arg(&x)
            .arg(&positions)
            .arg(&inv_freq)
            .arg(&rows)
            .arg(&heads)
            .arg(&head_dim);
        // SAFETY: (pointer ×3, u64, u32, u32); the caller's promise covers them.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }
}
