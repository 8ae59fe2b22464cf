//! Storage dtypes of weights: what the bytes in every tier are, until the compute
//! stream casts them to f32 just before use (DESIGN §6).

use serde::Serialize;

use super::fp8::Fp8;

/// The precision of the many-rows products (prefill, encoders, batched decode): the
/// `compute_dtype` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ComputeDtype {
    /// f32 operands (a stored weight widened exactly), f32 sums: the reference.
    #[default]
    F32,
    /// bf16 operands — activations rounded to nearest even, f32/f16 weights rounded
    /// too, bf16/FP8/int8 weights exact — and f32 sums: the arithmetic of PyTorch's
    /// bf16 models, on AMX tiles where the CPU has them and by rounding the operands of
    /// the f32 kernels elsewhere. Products of at most 16 rows (decode) stay f32 on
    /// every CPU: they are bound by reading the weights, which bf16 operands would not
    /// change.
    Bf16,
}

impl ComputeDtype {
    pub const NAMES: &'static str = "f32, bf16";

    pub fn name(self) -> &'static str {
        match self {
            ComputeDtype::F32 => "f32",
            ComputeDtype::Bf16 => "bf16",
        }
    }

    /// The precision named `name` (case-insensitive).
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" => Some(ComputeDtype::F32),
            "bf16" => Some(ComputeDtype::Bf16),
            _ => None,
        }
    }
}

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
    /// Signed 8-bit integers with a per-tensor scale (ComfyUI's `int8_tensorwise`).
    I8,
    /// Unsigned 4-bit codes, two a byte (element `2j` in the low nibble), centred on 8
    /// and dequantised per group with a scale and a zero (ComfyUI's `awq_w4a16`,
    /// stored as `I8`); see [`super::quant`].
    U4,
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
            "I8" => Some(DType::I8),
            _ => None,
        }
    }

    /// As [`DType::from_safetensors`] for the float dtypes alone: a tensor read as its
    /// values (an embedding table, a router, a norm), which an unscaled integer
    /// code is not.
    pub fn float_from_safetensors(name: &str) -> Option<Self> {
        Self::from_safetensors(name).filter(|dtype| !matches!(dtype, DType::I8 | DType::U4))
    }

    /// The safetensors spelling.
    pub fn safetensors_name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::Bf16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::I8 | DType::U4 => "I8",
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

    /// Bytes of one element; [`DType::U4`] packs two elements a byte, so sizes of
    /// many elements go through [`DType::bytes`].
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::Bf16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U4 => 1,
        }
    }

    /// Bytes of `elements` elements of this dtype (half a byte each for U4).
    pub fn bytes(self, elements: usize) -> usize {
        match self {
            DType::U4 => elements.div_ceil(2),
            _ => elements * self.size_bytes(),
        }
    }

    /// Widens little-endian `bytes` of this dtype into `out` (exact: every f16/bf16
    /// value is an f32; an I8 or U4 element widens to its code, U4 less its centre
    /// 8, with the scales left to the kernels). `bytes.len()` must be
    /// `bytes(out.len())`.
    pub fn widen(self, bytes: &[u8], out: &mut [f32]) {
        debug_assert_eq!(bytes.len(), self.bytes(out.len()));
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
            DType::I8 => {
                for (value, &byte) in out.iter_mut().zip(bytes) {
                    *value = f32::from(byte as i8);
                }
            }
            DType::U4 => {
                for (index, value) in out.iter_mut().enumerate() {
                    *value = super::quant::nibble(bytes, index) as f32 - 8.0;
                }
            }
        }
    }

    /// Narrows `values` into little-endian bytes of this dtype, rounding to nearest
    /// with ties to even (what the hardware does).
    /// I8 and U4 round to the nearest integer code and saturate (U4's codes are the
    /// value plus 8, in 0..=15).
    pub fn narrow(self, values: &[f32], out: &mut [u8]) {
        debug_assert_eq!(out.len(), self.bytes(values.len()));
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
            DType::I8 => {
                for (code, value) in out.iter_mut().zip(values) {
                    *code = value.round_ties_even().clamp(-128.0, 127.0) as i8 as u8;
                }
            }
            DType::U4 => {
                out.fill(0);
                for (index, value) in values.iter().enumerate() {
                    let code = (value.round_ties_even() + 8.0).clamp(0.0, 15.0) as u8;
                    out[index / 2] |= code << (4 * (index % 2));
                }
            }
        }
    }

    /// `values` encoded in this dtype.
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        let mut bytes = vec![0u8; self.bytes(values.len())];
        self.narrow(values, &mut bytes);
        bytes
    }

    /// Values decoded from little-endian bytes of this dtype.
    pub fn decode(self, bytes: &[u8]) -> Vec<f32> {
        let count = match self {
            DType::U4 => bytes.len() * 2,
            _ => bytes.len() / self.size_bytes(),
        };
        let mut values = vec![0.0; count];
        self.widen(&bytes[..self.bytes(count)], &mut values);
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
            DType::I8 => "int8",
            DType::U4 => "awq-u4",
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
