//! Group-wise 4-bit weights, ComfyUI's `awq_w4a16` (comfy-kitchen's
//! `TensorCoreAWQW4A16Layout`): a `[out, in]` weight stored as `[out, in / 2]` bytes,
//! element `2j` of a row in the low nibble of byte `j` and `2j + 1` in the high one,
//! each an unsigned code `q` in 0..=15; with `[in / size, out]` scales and zeros
//! (`weight_scale`, `weight_zeros`), one per group of `size` inputs (64) and output
//! row. The value is `(q − 8)·scale + zero`.

use super::DType;

/// Where a group-quantised weight's scales and zeros are: byte offsets in the block
/// (in a [`super::TensorSlot`]) or device addresses (in a [`super::Weight`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Groups {
    /// The `[groups, stride]` scales.
    pub scale: u64,
    /// The zeros, shaped and typed as the scales.
    pub zero: u64,
    /// The scales' and zeros' dtype (F32, F16 or BF16).
    pub dtype: DType,
    /// Inputs per group.
    pub size: usize,
    /// Values per row of the scales: the output rows of the whole stored weight, so a
    /// slice of its rows (one of a fused qkv's) keeps it.
    pub stride: usize,
}

impl Groups {
    /// The groups of a row of `cols` inputs.
    pub fn count(&self, cols: usize) -> usize {
        cols / self.size.max(1)
    }

    /// Bytes from `scale` (or `zero`) to the end of the last value `rows` rows of
    /// `cols` inputs read, or `None` if the layout is impossible.
    pub fn extent_bytes(&self, rows: usize, cols: usize) -> Option<u64> {
        let count = self.count(cols);
        if self.size == 0 || cols % self.size != 0 || rows > self.stride || count == 0 {
            return None;
        }
        let values = (count - 1).checked_mul(self.stride)?.checked_add(rows)?;
        u64::try_from(self.dtype.bytes(values)).ok()
    }
}

/// Code `index` of packed U4 `bytes`.
#[inline(always)]
pub fn nibble(bytes: &[u8], index: usize) -> u8 {
    (bytes[index / 2] >> (4 * (index % 2))) & 0x0f
}

/// One row dequantised: `codes` is its `out.len() / 2` bytes, `scales` and `zeros` its
/// groups' values in order. Each value is `(q − 8)·scale`, rounded, plus `zero`,
/// rounded: a multiply then an add, as torch computes the layout's f32 dequantisation.
pub fn dequantize_row(codes: &[u8], scales: &[f32], zeros: &[f32], size: usize, out: &mut [f32]) {
    for (group, values) in out.chunks_mut(size.max(1)).enumerate() {
        let (scale, zero) = (scales[group], zeros[group]);
        let first = group * size;
        for (offset, value) in values.iter_mut().enumerate() {
            let code = f32::from(nibble(codes, first + offset)) - 8.0;
            *value = code * scale + zero;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_unpack_low_nibble_first_and_dequantise_per_group() {
        // Proves the packing order (element 2j low, 2j + 1 high) and the formula
        // (q − 8)·scale + zero with each group's own scale and zero.
        let codes = [0x10u8, 0xf8];
        assert_eq!(
            (0..4).map(|i| nibble(&codes, i)).collect::<Vec<_>>(),
            [0, 1, 8, 15]
        );
        let mut out = [0f32; 4];
        dequantize_row(&codes, &[0.5, 2.0], &[1.0, -1.0], 2, &mut out);
        assert_eq!(out, [-3.0, -2.5, -1.0, 13.0]);
        let groups = Groups {
            scale: 0,
            zero: 0,
            dtype: DType::Bf16,
            size: 64,
            stride: 10,
        };
        assert_eq!(groups.extent_bytes(4, 128), Some(2 * (10 + 4)));
        assert_eq!(groups.extent_bytes(4, 100), None, "not whole groups");
        assert_eq!(
            groups.extent_bytes(11, 128),
            None,
            "more rows than the stride"
        );
    }
}
