//! Linear weights quantized the way ComfyUI stores its integer formats (the layouts
//! `comfy/ops.py` loads; see `families::flux::quant`), for generated checkpoints:
//!
//! - `int8_tensorwise`: `round(w / scale)` saturated to an `I8 [out, in]`, with
//!   `scale = max|w| / 127` (at least 1e-30) as one F32 `weight_scale` — comfy-kitchen's
//!   `quantize_int8_tensorwise`.
//! - `awq_w4a16`: per group of [`AWQ_GROUP_SIZE`] inputs of each output row, the
//!   asymmetric range `[min, max]` in 15 steps: `scale = (max − min)/15` and
//!   `zero = min + 8·scale` (so code 0 is the minimum and 15 the maximum), both
//!   rounded to BF16 and stored `[in / 64, out]` as `weight_scale` and
//!   `weight_zeros`; each code `round((w − zero)/scale) + 8` saturated to 0..=15, two a
//!   byte (element `2j` in the low nibble) in an `I8 [out, in / 2]`.
//!
//! Each weight also gets its `<layer>.comfy_quant` U8 JSON tensor.

use std::sync::Arc;

use super::writer::{TensorSpec, Values};
use crate::compute::DType;

/// The inputs per group of the `awq_w4a16` weights written (ComfyUI's default).
pub const AWQ_GROUP_SIZE: usize = 64;

/// Which integer format to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// `int8_tensorwise`.
    Int8Tensorwise,
    /// `awq_w4a16`, groups of [`AWQ_GROUP_SIZE`].
    AwqW4a16,
}

impl QuantFormat {
    /// The format of a storage dtype: I8 is `int8_tensorwise`, U4 `awq_w4a16`.
    pub fn of(dtype: DType) -> Option<Self> {
        match dtype {
            DType::I8 => Some(QuantFormat::Int8Tensorwise),
            DType::U4 => Some(QuantFormat::AwqW4a16),
            _ => None,
        }
    }

    /// ComfyUI's name of the format.
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Int8Tensorwise => "int8_tensorwise",
            QuantFormat::AwqW4a16 => "awq_w4a16",
        }
    }

    fn json(self) -> String {
        match self {
            QuantFormat::Int8Tensorwise => r#"{"format": "int8_tensorwise"}"#.to_string(),
            QuantFormat::AwqW4a16 => {
                format!(r#"{{"format": "awq_w4a16", "group_size": {AWQ_GROUP_SIZE}}}"#)
            }
        }
    }
}

/// `values` quantized tensorwise: the codes and the scale.
pub fn quantize_int8(values: &[f32]) -> (Vec<u8>, f32) {
    let largest = values
        .iter()
        .fold(0f32, |most, value| most.max(value.abs()));
    let scale = (largest / 127.0).max(1e-30);
    let inverse = 1.0 / scale;
    let codes = values
        .iter()
        .map(|value| (value * inverse).round_ties_even().clamp(-128.0, 127.0) as i8 as u8)
        .collect();
    (codes, scale)
}

/// A `[rows, cols]` matrix quantized as `awq_w4a16` in groups of `size`: the packed
/// codes, and the scales and zeros `[cols / size, rows]` (BF16 values).
pub fn quantize_awq(
    values: &[f32],
    rows: usize,
    cols: usize,
    size: usize,
) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
    let groups = cols / size;
    let mut packed = vec![0u8; rows * cols / 2];
    let (mut scales, mut zeros) = (vec![0f32; groups * rows], vec![0f32; groups * rows]);
    let bf16 = |value: f32| half::bf16::from_f32(value).to_f32();
    for row in 0..rows {
        for group in 0..groups {
            let first = row * cols + group * size;
            let chunk = &values[first..first + size];
            let low = chunk.iter().copied().fold(f32::INFINITY, f32::min);
            let high = chunk.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let scale = bf16((high - low) / 15.0);
            let zero = bf16(low + 8.0 * scale);
            scales[group * rows + row] = scale;
            zeros[group * rows + row] = zero;
            for (offset, value) in chunk.iter().enumerate() {
                let code = if scale > 0.0 {
                    (((value - zero) / scale).round_ties_even() + 8.0).clamp(0.0, 15.0) as u8
                } else {
                    8
                };
                let index = first + offset;
                packed[index / 2] |= code << (4 * (index % 2));
            }
        }
    }
    (packed, scales, zeros)
}

/// The tensors of linear weight `<stem>.weight` (`[rows, cols]` of `values`)
/// quantized as `format`: the codes, the scale(s), and the `comfy_quant` marker. A
/// weight whose inputs are not whole AWQ groups stays BF16, as a quantizer leaves it.
pub fn quantized_linear(
    stem: &str,
    (rows, cols): (usize, usize),
    values: &Values,
    format: QuantFormat,
) -> Vec<TensorSpec> {
    if format == QuantFormat::AwqW4a16 && cols % AWQ_GROUP_SIZE != 0 {
        return vec![TensorSpec {
            name: format!("{stem}.weight"),
            shape: vec![rows, cols],
            values: values.clone(),
            dtype: Some(DType::Bf16),
        }];
    }
    let mut weight = vec![0f32; rows * cols];
    values.fill(0, &mut weight);
    let raw = |name: String, shape: Vec<usize>, bytes: Vec<u8>, dtype: &'static str| TensorSpec {
        name,
        shape,
        values: Values::Raw {
            bytes: Arc::from(bytes),
            dtype,
        },
        dtype: None,
    };
    let mut tensors = match format {
        QuantFormat::Int8Tensorwise => {
            let (codes, scale) = quantize_int8(&weight);
            vec![
                raw(format!("{stem}.weight"), vec![rows, cols], codes, "I8"),
                TensorSpec {
                    name: format!("{stem}.weight_scale"),
                    shape: vec![],
                    values: Values::Constant(scale),
                    dtype: Some(DType::F32),
                },
            ]
        }
        QuantFormat::AwqW4a16 => {
            let (packed, scales, zeros) = quantize_awq(&weight, rows, cols, AWQ_GROUP_SIZE);
            let groups = vec![cols / AWQ_GROUP_SIZE, rows];
            vec![
                raw(format!("{stem}.weight"), vec![rows, cols / 2], packed, "I8"),
                raw(
                    format!("{stem}.weight_scale"),
                    groups.clone(),
                    DType::Bf16.encode(&scales),
                    "BF16",
                ),
                raw(
                    format!("{stem}.weight_zeros"),
                    groups,
                    DType::Bf16.encode(&zeros),
                    "BF16",
                ),
            ]
        }
    };
    let json = format.json().into_bytes();
    tensors.push(raw(
        format!("{stem}.comfy_quant"),
        vec![json.len()],
        json,
        "U8",
    ));
    tensors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_codes_are_the_nearest_multiples_of_max_over_127() {
        // Proves the tensorwise scale and the round-half-even, saturating codes.
        let (codes, scale) = quantize_int8(&[50.0, -127.0, 127.0, 0.5, 1.5, -2.5]);
        assert_eq!(scale, 1.0);
        let values: Vec<i8> = codes.iter().map(|&code| code as i8).collect();
        assert_eq!(values, [50, -127, 127, 0, 2, -2]);
        let (codes, scale) = quantize_int8(&[0.0, -0.254]);
        assert_eq!((codes, scale), (vec![0, (-127i8) as u8], 0.254 / 127.0));
    }

    #[test]
    fn awq_groups_span_their_range_in_fifteen_steps() {
        // Proves code 0 is a group's minimum and 15 its maximum, the tables are
        // [groups, rows], and every value dequantises within half a step (plus the
        // BF16 rounding of the zero).
        let (rows, cols) = (3, 128);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 70.0)
            .collect();
        let (packed, scales, zeros) = quantize_awq(&values, rows, cols, 64);
        assert_eq!((packed.len(), scales.len()), (rows * cols / 2, 2 * rows));
        for row in 0..rows {
            for group in 0..2 {
                let (scale, zero) = (scales[group * rows + row], zeros[group * rows + row]);
                for k in group * 64..(group + 1) * 64 {
                    let index = row * cols + k;
                    let code = (packed[index / 2] >> (4 * (index % 2))) & 0x0f;
                    let value = (f32::from(code) - 8.0) * scale + zero;
                    let error = (value - values[index]).abs();
                    assert!(error <= 0.5 * scale + 0.01, "{row} {k}: {error}");
                }
            }
        }
    }
}
