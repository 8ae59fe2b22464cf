//! Storage dtypes of weights: what the bytes in every tier are, until the compute
//! stream casts them to f32 just before use (DESIGN §6).

use serde::Serialize;

use super::fp8::Fp8;

/// The element type a weight is stored in, in the file and in every tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    F16,
    Bf16,
    /// FP8 E4M3 ("e4m3fn"), usually with a per-tensor scale.
    F8E4M3,
    /// FP8 E5M2, usually with a per-tensor scale.
    F8E5M2,
}

impl DType {
    /// The dtype of a safetensors dtype name, if weights of it can be computed on.
    pub fn from_safetensors(name: &str) -> Option<Self> {
        match name {
            "F32" => Some(DType::F32),
            "F16" => Some(DType::F16),
            "BF16" => Some(DType::Bf16),
            "F8_E4M3" => Some(DType::F8E4M3),
            "F8_E5M2" => Some(DType::F8E5M2),
            _ => None,
        }
    }

    /// The safetensors spelling.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::Bf16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
        }
    }

    /// The FP8 format of an FP8 dtype.
    fn fp8(self) -> Option<Fp8> {
        match self {
            DType::F8E4M3 => Some(Fp8::E4M3),
            DType::F8E5M2 => Some(Fp8::E5M2),
            _ => None,
        }
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::F8E4M3 | DType::F8E5M2 => 1,
        }
    }

    /// Widens little-endian `bytes` of this dtype into `out` (exact: every f16/bf16
    /// value is an f32). `bytes.len()` must be `out.len() × size_bytes()`.
    pub fn widen(self, bytes: &[u8], out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), out.len() * self.size_bytes());
        match self {
            DType::F32 => {
                for (value, word) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *value = f32::from_le_bytes([word[0], word[1], word[2], word[3]]);
                }
            }
            DType::F16 => {
                // SAFETY: every bit pattern is a valid f16; `align_to` yields only the
                // aligned middle, used only when it is the whole slice.
                let (prefix, halves, suffix) = unsafe { bytes.align_to::<half::f16>() };
                if prefix.is_empty() && suffix.is_empty() && cfg!(target_endian = "little") {
                    // The vectorised conversion (F16C where the CPU has it).
                    use half::slice::HalfFloatSliceExt;
                    halves.convert_to_f32_slice(out);
                    return;
                }
                for (value, half) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *value = half::f16::from_le_bytes([half[0], half[1]]).to_f32();
                }
            }
            DType::Bf16 => {
                // bf16 is the top half of an f32: a shift, which vectorises.
                for (value, half) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *value =
                        f32::from_bits(u32::from(u16::from_le_bytes([half[0], half[1]])) << 16);
                }
            }
            DType::F8E4M3 | DType::F8E5M2 => {
                self.fp8().unwrap_or(Fp8::E4M3).widen(bytes, out);
            }
        }
    }

    /// Narrows `values` into little-endian bytes of this dtype, rounding to nearest
    /// with ties to even (what the hardware does).
    pub fn narrow(self, values: &[f32], out: &mut [u8]) {
        debug_assert_eq!(out.len(), values.len() * self.size_bytes());
        match self {
            DType::F32 => {
                for (word, value) in out.chunks_exact_mut(4).zip(values) {
                    word.copy_from_slice(&value.to_le_bytes());
                }
            }
            DType::F16 => {
                for (half, value) in out.chunks_exact_mut(2).zip(values) {
                    half.copy_from_slice(&half::f16::from_f32(*value).to_le_bytes());
                }
            }
            DType::Bf16 => {
                for (half, value) in out.chunks_exact_mut(2).zip(values) {
                    half.copy_from_slice(&half::bf16::from_f32(*value).to_le_bytes());
                }
            }
            DType::F8E4M3 | DType::F8E5M2 => {
                let format = self.fp8().unwrap_or(Fp8::E4M3);
                for (code, value) in out.iter_mut().zip(values) {
                    *code = format.encode(*value);
                }
            }
        }
    }

    /// `values` encoded in this dtype.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut bytes = vec![0u8; values.len() * self.size_bytes()];
        self.narrow(values, &mut bytes);
        bytes
    }

    /// Values decoded from little-endian bytes of this dtype.
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        let count = bytes.len() / self.size_bytes();
        let mut values = vec![0.0; count];
        self.widen(&bytes[..count * self.size_bytes()], &mut values);
        values
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F8E4M3 => "fp8-e4m3",
            DType::F8E5M2 => "fp8-e5m2",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_precision_round_trips_exactly_and_rounds_to_nearest_even() {
        // Proves widening is exact and narrowing rounds ties to even, for both halves.
        let values = [0.0f32, -1.5, 65504.0, 1.0 + 1.0 / 2048.0, 3.140625];
        for dtype in [DType::F16, DType::Bf16, DType::F32] {
            let bytes = dtype.encode(&values);
            assert_eq!(bytes.len(), values.len() * dtype.size_bytes());
            let back = dtype.decode(&bytes);
            assert_eq!(
                dtype.encode(&back),
                bytes,
                "{dtype}: encode(decode) is stable"
            );
        }
        // 1 + 2^-11 is exactly half-way between two f16 neighbours: ties go to even (1.0).
        assert_eq!(
            DType::F16.decode(&DType::F16.encode(&[1.0 + 1.0 / 2048.0])),
            [1.0]
        );
        assert_eq!(DType::from_safetensors("BF16"), Some(DType::Bf16));
        assert_eq!(DType::from_safetensors("I64"), None);
    }
}
