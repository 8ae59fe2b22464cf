//! One pass of every kind of operation on tiny shapes, before a run takes the
//! driver's used figure as its baseline: the kernels' code is loaded (lazily, on first
//! launch), cuBLAS creates its workspace, the upload and score buffers exist. What the
//! run then allocates is its own.

use super::compute::CudaCompute;
use crate::compute::{
    Attention, CachedAttention, Compute, ComputeError, DType, LowRank, Mask, TensorSlot,
};

const ROWS: usize = 4;
const COLS: usize = 8;

fn slot(dtype: DType, rows: usize, cols: usize, offset: usize) -> TensorSlot {
    TensorSlot::new(offset as u64, dtype, rows, cols)
}

impl CudaCompute {
    /// Runs each operation once and waits for the stream.
    pub fn warm_up(&self) -> Result<(), ComputeError> {
        every_operation(self)?;
        // The warm-up's segments are not a run's compute time.
        self.device_time()
            .take_seconds()
            .map_err(super::compute::compute_error)?;
        Ok(())
    }
}

/// Each operation of the port once, on tiny shapes, then a wait for the stream.
fn every_operation<C: Compute>(compute: &C) -> Result<(), ComputeError> {
    let values: Vec<f32> = (0..COLS * COLS).map(|i| (i % 7) as f32 * 0.125).collect();
    // A block of an f16 matrix (cast path), then f32 vectors and factors.
    let mut bytes = DType::F16.encode(&values);
    let vectors_at = bytes.len();
    bytes.extend(DType::F32.encode(&values));
    let block = compute.load_block(&bytes)?;
    let view = compute.block_view(&block);
    let matrix = view.weight(&slot(DType::F16, COLS, COLS, 0))?;
    let vector = view.weight(&slot(DType::F32, 1, COLS, vectors_at))?;
    let factor_a = view.weight(&slot(DType::F32, 2, COLS, vectors_at))?;
    let factor_b = view.weight(&slot(DType::F32, COLS, 2, vectors_at))?;
    let low_rank = LowRank::new(factor_a, factor_b)?;

    let mut x = compute.tensor(ROWS, COLS)?;
    compute.write(&mut x, &values[..ROWS * COLS])?;
    let mut y = compute.tensor(ROWS, COLS)?;
    let mut scratch = compute.tensor(ROWS, 2)?;
    compute.linear(&x, &matrix, Some(&vector), &mut y)?;
    compute.low_rank_add(&x, &low_rank, 0.5, &mut scratch, &mut y)?;
    compute.layer_norm(&y, &vector, &vector, 1e-5, &mut x)?;
    compute.rms_norm(&x, Some(&vector), 1e-6, &mut y)?;
    compute.gelu_erf(&mut y)?;
    compute.add(&mut x, &y)?;
    compute.add_scaled_rows(&mut x, &y, &[1.0; ROWS])?;
    compute.gather_add(&matrix, &[0, 1, 2, 3], &mut x)?;
    let lengths = [2usize, 1];
    let shape = Attention {
        sequences: 2,
        sequence_length: ROWS / 2,
        heads: 2,
        kv_heads: 1,
        head_dim: COLS / 2,
        scale: 0.5,
        mask: Mask::Padding(&lengths),
    };
    let mut k = compute.tensor(ROWS, COLS / 2)?;
    let mut copied = compute.tensor(ROWS, 2)?;
    compute.copy(&scratch, &mut copied)?;
    compute.write(&mut k, &values[..ROWS * COLS / 2])?;
    compute.attention(&x, &k, &k, &shape, &mut y)?;
    compute.merge_low_rank(&matrix, &low_rank, 0.5)?;
    decoder_operations(compute, &values)?;
    compute.checksum(&view)?;
    let fence = compute.fence()?;
    compute.wait(fence)?;
    compute.read(&y)?;
    Ok(())
}

/// The decoder's operations, with an FP8 weight and its scale (the scaled cast).
fn decoder_operations<C: Compute>(compute: &C, values: &[f32]) -> Result<(), ComputeError> {
    let mut bytes = DType::F8E4M3.encode(values);
    let scale_at = bytes.len();
    bytes.extend(0.5f32.to_le_bytes());
    let block = compute.load_block(&bytes)?;
    let view = compute.block_view(&block);
    let scaled = view.weight(&TensorSlot {
        scale: Some(scale_at as u64),
        ..slot(DType::F8E4M3, COLS, COLS, 0)
    })?;
    let mut x = compute.tensor(ROWS, COLS)?;
    compute.write(&mut x, &values[..ROWS * COLS])?;
    let mut y = compute.tensor(ROWS, COLS)?;
    compute.linear(&x, &scaled, None, &mut y)?;
    compute.gather_add(&scaled, &[3, 2, 1, 0], &mut y)?;
    compute.silu_mul(&mut y, &x)?;
    compute.rope(&mut y, 2, COLS / 2, &[0, 1, 2, 3], &[1.0, 0.5])?;
    let mut cache = compute.tensor(0, COLS / 2)?;
    compute.resize_rows(&mut cache, ROWS)?;
    let mut rows = compute.tensor(ROWS, COLS / 2)?;
    compute.write(&mut rows, &values[..ROWS * COLS / 2])?;
    compute.write_rows(&mut cache, 0, &rows)?;
    let mut query = compute.tensor(1, COLS)?;
    compute.write(&mut query, &values[..COLS])?;
    let mut out = compute.tensor(1, COLS)?;
    let shape = CachedAttention {
        heads: 2,
        kv_heads: 1,
        head_dim: COLS / 2,
        scale: 0.5,
        past: ROWS - 1,
        queries: 1,
    };
    compute.attention_cached(&query, &cache, &cache, &shape, &mut out)?;
    compute.wait(compute.fence()?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_is_a_valid_pass_of_every_operation() {
        // Proves the warm-up's shapes fit together (it must never fail a run), on the
        // CPU adapter, which checks shapes the same way.
        every_operation(&crate::device::CpuCompute::new()).unwrap();
    }
}
