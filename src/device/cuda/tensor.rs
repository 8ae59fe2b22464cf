//! The compute adapter's tensors and loaded blocks: device buffers with their shape,
//! and the shape checks every operation makes before it queues anything.

use stagehand_actors::DevicePtr;

use super::memory::DeviceBuffer;
use crate::compute::{Attention, CachedAttention, ComputeError};

/// A row-major `rows × cols` f32 matrix in VRAM (the port's `Tensor`). Its buffer
/// may hold more rows than it has (a KV cache grows into room it already has).
pub struct CudaTensor {
    pub(super) buffer: DeviceBuffer,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl CudaTensor {
    pub fn ptr(&self) -> DevicePtr {
        self.buffer.ptr()
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn elements(&self) -> usize {
        self.rows * self.cols
    }

    /// Bytes of the tensor's values (its buffer may be larger).
    pub fn value_bytes(&self) -> u64 {
        self.elements() as u64 * 4
    }
}

/// One block's bytes in VRAM, loaded for the fully-resident reference (the port's
/// `Block`).
pub struct CudaBlock {
    pub(super) buffer: DeviceBuffer,
}

pub fn shape_error(what: &str, detail: String) -> ComputeError {
    ComputeError::Shape(format!("{what}: {detail}"))
}

pub fn same_shape(what: &str, a: &CudaTensor, b: &CudaTensor) -> Result<(), ComputeError> {
    if (a.rows, a.cols) != (b.rows, b.cols) {
        return Err(shape_error(
            what,
            format!("[{}, {}] vs [{}, {}]", a.rows, a.cols, b.rows, b.cols),
        ));
    }
    Ok(())
}

/// `rows × cols` f32 in bytes, or the error a too-large activation gets.
pub fn tensor_bytes(rows: usize, cols: usize) -> Result<u64, ComputeError> {
    rows.checked_mul(cols)
        .and_then(|count| count.checked_mul(4))
        .map(|bytes| bytes as u64)
        .ok_or_else(|| {
            ComputeError::OutOfMemory(format!(
                "an activation of {rows} × {cols} f32 does not fit in VRAM; lower --batch"
            ))
        })
}

/// Little-endian bytes of `values` (what the device reads: the host is little-endian
/// on every platform CUDA runs on).
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

pub fn u32_bytes(values: impl Iterator<Item = u32>) -> Vec<u8> {
    values.flat_map(|value| value.to_le_bytes()).collect()
}

/// The checks of an attention's shapes (shared with every adapter).
pub fn check_attention(
    shape: &Attention<'_>,
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
) -> Result<(), ComputeError> {
    shape.check(q, k, v)
}

/// The checks of a cached attention's shapes (shared with every adapter).
pub fn check_cached_attention(
    shape: &CachedAttention,
    q: (usize, usize),
    k: (usize, usize),
    v: (usize, usize),
) -> Result<(), ComputeError> {
    shape.check(q, k, v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::Mask;

    #[test]
    fn attention_shapes_are_checked_like_the_cpu_adapter() {
        // Proves mismatched heads, wrong tensor shapes and impossible padding lengths
        // are refused before anything is queued.
        let lengths = [3usize, 4];
        let shape = |heads, kv_heads, mask| Attention {
            sequences: 2,
            sequence_length: 4,
            heads,
            kv_heads,
            head_dim: 8,
            scale: 0.5,
            mask,
        };
        let ok = shape(4, 2, Mask::Padding(&lengths));
        assert!(check_attention(&ok, (8, 32), (8, 16), (8, 16)).is_ok());
        assert!(check_attention(&shape(4, 3, Mask::Causal), (8, 32), (8, 24), (8, 24)).is_err());
        assert!(check_attention(&ok, (8, 32), (8, 32), (8, 16)).is_err());
        let too_long = [5usize, 4];
        let error = check_attention(
            &shape(4, 2, Mask::Padding(&too_long)),
            (8, 32),
            (8, 16),
            (8, 16),
        )
        .unwrap_err();
        assert!(error.to_string().contains("padding lengths"), "{error}");
        assert!(tensor_bytes(usize::MAX / 2, 4)
            .unwrap_err()
            .to_string()
            .contains("lower --batch"));
        assert_eq!(f32_bytes(&[1.0]), vec![0, 0, 0x80, 0x3f]);
        assert_eq!(u32_bytes([258u32].into_iter()), vec![2, 1, 0, 0]);
    }
}
