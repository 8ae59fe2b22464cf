//! bf16 and f16 conversions for the cuBLAS workload's host side (weights uploaded in
//! half precision, CPU reference rounded the way the GPU rounds). Round to nearest,
//! ties to even, as the hardware does; a few lines here instead of a crate.

use serde::{Deserialize, Serialize};

/// Element type of a linear-stack's weights and activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
}

impl DType {
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
        }
    }

    /// `value` rounded to this type and widened back, exactly as stored.
    pub fn round(self, value: f32) -> f32 {
        match self {
            DType::F32 => value,
            DType::F16 => f16_bits_to_f32(f32_to_f16_bits(value)),
            DType::Bf16 => bf16_bits_to_f32(f32_to_bf16_bits(value)),
        }
    }

    /// Little-endian bytes of `values` in this type.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(values.len() * self.size_bytes());
        for &value in values {
            match self {
                DType::F32 => bytes.extend_from_slice(&value.to_le_bytes()),
                DType::F16 => bytes.extend_from_slice(&f32_to_f16_bits(value).to_le_bytes()),
                DType::Bf16 => bytes.extend_from_slice(&f32_to_bf16_bits(value).to_le_bytes()),
            }
        }
        bytes
    }

    /// Values from little-endian bytes of this type (a ragged tail is ignored).
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|word| f32::from_le_bytes([word[0], word[1], word[2], word[3]]))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|half| f16_bits_to_f32(u16::from_le_bytes([half[0], half[1]])))
                .collect(),
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|half| bf16_bits_to_f32(u16::from_le_bytes([half[0], half[1]])))
                .collect(),
        }
    }
}

pub fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        // Keep it a NaN: truncating could leave an all-zero mantissa, i.e. infinity.
        return ((bits >> 16) as u16) | 0x0040;
    }
    let tie_to_even = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(tie_to_even) >> 16) as u16
}

pub fn bf16_bits_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

pub fn f32_to_f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x007f_ffff;
    if exponent == 0xff {
        let nan_payload = if mantissa != 0 { 0x0200 } else { 0 };
        return sign | 0x7c00 | nan_payload;
    }
    let unbiased = exponent - 127;
    if unbiased > 15 {
        return sign | 0x7c00;
    }
    if unbiased >= -14 {
        // Normal half: keep 10 mantissa bits, round on the 13 dropped. A carry out of
        // the mantissa bumps the exponent, and out of exponent 30 it gives infinity:
        // both are the right encodings.
        let mut half = (((unbiased + 15) as u32) << 10) | (mantissa >> 13);
        let dropped = mantissa & 0x1fff;
        if dropped > 0x1000 || (dropped == 0x1000 && half & 1 == 1) {
            half += 1;
        }
        return sign | half as u16;
    }
    // Subnormal half: the value in units of 2^-24 is (1.mantissa) · 2^(unbiased + 1).
    let shift = (-1 - unbiased) as u32;
    if shift > 24 {
        return sign;
    }
    let significand = mantissa | 0x0080_0000;
    let mut half = significand >> shift;
    let dropped = significand & ((1 << shift) - 1);
    let halfway = 1 << (shift - 1);
    if dropped > halfway || (dropped == halfway && half & 1 == 1) {
        half += 1;
    }
    sign | half as u16
}

pub fn f16_bits_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x03ff);
    match exponent {
        0 => sign * mantissa as f32 * f32::from_bits(0x3380_0000), // 2^-24
        0x1f => f32::from_bits((u32::from(bits & 0x8000) << 16) | 0x7f80_0000 | (mantissa << 13)),
        _ => f32::from_bits(
            (u32::from(bits & 0x8000) << 16) | ((exponent + 112) << 23) | (mantissa << 13),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_half_value_survives_a_round_trip() {
        // Proves f16 and bf16 widen and narrow exactly for every non-NaN bit pattern.
        for bits in 0..=u16::MAX {
            let half = f16_bits_to_f32(bits);
            if !half.is_nan() {
                assert_eq!(f32_to_f16_bits(half), bits, "f16 {bits:#06x} -> {half}");
            }
            let brain = bf16_bits_to_f32(bits);
            if !brain.is_nan() {
                assert_eq!(f32_to_bf16_bits(brain), bits, "bf16 {bits:#06x} -> {brain}");
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_with_ties_to_even() {
        // Proves the tie and overflow cases the GPU's conversions get right.
        let one_ulp_f16 = 2f32.powi(-10);
        assert_eq!(DType::F16.round(1.0 + one_ulp_f16 / 2.0), 1.0);
        assert_eq!(
            DType::F16.round(1.0 + one_ulp_f16 * 1.5),
            1.0 + 2.0 * one_ulp_f16
        );
        assert_eq!(
            DType::F16.round(1.0 + one_ulp_f16 * 0.51),
            1.0 + one_ulp_f16
        );
        assert_eq!(DType::F16.round(65504.0), 65504.0);
        assert_eq!(DType::F16.round(65519.0), 65504.0);
        assert_eq!(DType::F16.round(65520.0), f32::INFINITY);
        assert_eq!(DType::F16.round(2f32.powi(-25)), 0.0, "tie to even zero");
        assert_eq!(DType::F16.round(2f32.powi(-25) * 1.5), 2f32.powi(-24));
        assert_eq!(DType::F16.round(-3e-9), 0.0);
        let one_ulp_bf16 = 2f32.powi(-7);
        assert_eq!(DType::Bf16.round(1.0 + one_ulp_bf16 / 2.0), 1.0);
        assert_eq!(
            DType::Bf16.round(1.0 + one_ulp_bf16 * 1.5),
            1.0 + 2.0 * one_ulp_bf16
        );
        assert!(DType::Bf16.round(f32::NAN).is_nan());
        assert!(DType::F16.round(f32::NAN).is_nan());
    }

    #[test]
    fn rounding_error_is_at_most_half_an_ulp() {
        // Proves, over a sweep of magnitudes, that narrowing is a nearest rounding.
        let mut value = 1.0e-4f32;
        while value < 6.0e4 {
            for dtype in [DType::F16, DType::Bf16] {
                let rounded = dtype.round(value);
                let ulp = match dtype {
                    DType::F16 => 2f32
                        .powi(value.log2().floor() as i32 - 10)
                        .max(2f32.powi(-24)),
                    _ => 2f32.powi(value.log2().floor() as i32 - 7),
                };
                assert!(
                    (rounded - value).abs() <= ulp / 2.0,
                    "{dtype:?} {value} -> {rounded}"
                );
            }
            value *= 1.013;
        }
    }

    #[test]
    fn encode_and_decode_are_inverse_on_representable_values() {
        // Proves the byte layout is little-endian and lossless for rounded values.
        for dtype in [DType::F32, DType::F16, DType::Bf16] {
            let values: Vec<f32> = (0..50)
                .map(|i| dtype.round(i as f32 * 0.37 - 9.0))
                .collect();
            let bytes = dtype.encode(&values);
            assert_eq!(bytes.len(), values.len() * dtype.size_bytes());
            assert_eq!(dtype.decode(&bytes), values);
        }
        assert_eq!(DType::F16.encode(&[1.0]), vec![0x00, 0x3c]);
        assert_eq!(DType::Bf16.encode(&[1.0]), vec![0x80, 0x3f]);
    }
}
