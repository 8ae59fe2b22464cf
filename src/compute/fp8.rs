//! The two 8-bit float formats of FP8 checkpoints, by their bit layouts:
//!
//! - E4M3 (`F8_E4M3`, "e4m3fn"): 4 exponent bits (bias 7), 3 mantissa bits, no
//!   infinities; `S.1111.111` is NaN; largest finite 448.
//! - E5M2 (`F8_E5M2`): 5 exponent bits (bias 15), 2 mantissa bits, IEEE-style
//!   infinities and NaNs; largest finite 57344.
//!
//! Widening is exact (a table of the 256 codes). Narrowing rounds to the nearest
//! code, ties to the even code, and saturates at the largest finite value (the usual
//! quantiser clamp; an FP8 weight is stored with a scale that keeps it in range).

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8 {
    E4M3,
    E5M2,
}

struct Tables {
    /// Every code's value.
    values: [f32; 256],
    /// The finite non-negative codes in increasing value (code, value).
    ascending: Vec<(u8, f32)>,
}

fn decode(format: Fp8, code: u8) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exponent, mantissa, mantissa_bits, bias, max_exponent) = match format {
        Fp8::E4M3 => (
            i32::from((code >> 3) & 0x0f),
            i32::from(code & 0x07),
            3,
            7,
            15,
        ),
        Fp8::E5M2 => (
            i32::from((code >> 2) & 0x1f),
            i32::from(code & 0x03),
            2,
            15,
            31,
        ),
    };
    let scale = (1 << mantissa_bits) as f32;
    match format {
        Fp8::E4M3 if exponent == max_exponent && mantissa == 7 => return f32::NAN,
        Fp8::E5M2 if exponent == max_exponent => {
            return if mantissa == 0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            };
        }
        _ => {}
    }
    if exponent == 0 {
        return sign * (mantissa as f32 / scale) * 2f32.powi(1 - bias);
    }
    sign * (1.0 + mantissa as f32 / scale) * 2f32.powi(exponent - bias)
}

fn tables(format: Fp8) -> &'static Tables {
    static E4M3: OnceLock<Tables> = OnceLock::new();
    static E5M2: OnceLock<Tables> = OnceLock::new();
    let cell = match format {
        Fp8::E4M3 => &E4M3,
        Fp8::E5M2 => &E5M2,
    };
    cell.get_or_init(|| {
        let mut values = [0f32; 256];
        for (code, value) in values.iter_mut().enumerate() {
            *value = decode(format, code as u8);
        }
        let mut ascending: Vec<(u8, f32)> = (0u8..0x80)
            .map(|code| (code, values[code as usize]))
            .filter(|(_, value)| value.is_finite())
            .collect();
        ascending.sort_by(|a, b| a.1.total_cmp(&b.1));
        Tables { values, ascending }
    })
}

impl Fp8 {
    /// One code's value (the tests' reference; runs widen whole slices).
    #[cfg(test)]
    pub fn to_f32(self, code: u8) -> f32 {
        tables(self).values[code as usize]
    }

    /// Widens every code of `codes` into `out`, exactly as [`Fp8::to_f32`] does (the
    /// same bits, NaN and infinity codes included), eight at a time with AVX2 where
    /// the CPU has it: an FP8 weight is widened on every use, so this is the decode
    /// step's inner loop.
    pub fn widen(self, codes: &[u8], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was detected on this CPU.
            unsafe { widen_avx2(self, codes, out) };
            return;
        }
        let values = &tables(self).values;
        for (value, &code) in out.iter_mut().zip(codes) {
            *value = values[code as usize];
        }
    }

    /// The nearest code to `value` (ties to even, saturating).
    pub fn encode(self, value: f32) -> u8 {
        let tables = tables(self);
        if value.is_nan() {
            return match self {
                Fp8::E4M3 => 0x7f,
                Fp8::E5M2 => 0x7e,
            };
        }
        let sign = if value.is_sign_negative() { 0x80 } else { 0 };
        let magnitude = value.abs();
        let codes = &tables.ascending;
        let above = codes.partition_point(|&(_, code_value)| code_value < magnitude);
        let code = if above == 0 {
            codes[0].0
        } else if above == codes.len() {
            codes[codes.len() - 1].0
        } else {
            let (low_code, low) = codes[above - 1];
            let (high_code, high) = codes[above];
            let (to_low, to_high) = (magnitude - low, high - magnitude);
            if to_low < to_high || (to_low == to_high && low_code & 1 == 0) {
                low_code
            } else {
                high_code
            }
        };
        sign | code
    }
}

/// The code's bits moved into an f32's exponent and mantissa fields and scaled by
/// 2^(127 − bias): exact for normal and subnormal codes alike (a power-of-two product
/// of an f32 subnormal), then the sign; NaN and infinity codes are blended in.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn widen_avx2(format: Fp8, codes: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let length = codes.len().min(out.len());
    let chunks = length / 8;
    let (shift, factor, special) = match format {
        Fp8::E4M3 => (20, 2f32.powi(120), 0x7f),
        Fp8::E5M2 => (21, 2f32.powi(112), 0x7c),
    };
    // SAFETY: each chunk reads 8 codes at `8k` and writes 8 floats at `8k`, with
    // `8k + 8 <= length`.
    unsafe {
        let magnitude_mask = _mm256_set1_epi32(0x7f);
        let sign_mask = _mm256_set1_epi32(0x80);
        let factor = _mm256_set1_ps(factor);
        let nan = _mm256_set1_ps(f32::NAN);
        let infinity = _mm256_set1_epi32(0x7f80_0000);
        let special = _mm256_set1_epi32(special);
        let shift = _mm_cvtsi32_si128(shift);
        for chunk in 0..chunks {
            let at = chunk * 8;
            let bytes = _mm_loadl_epi64(codes.as_ptr().add(at).cast());
            let code = _mm256_cvtepu8_epi32(bytes);
            let magnitude = _mm256_and_si256(code, magnitude_mask);
            let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(code, sign_mask));
            let fields = _mm256_sll_epi32(magnitude, shift);
            let value = _mm256_mul_ps(_mm256_castsi256_ps(fields), factor);
            let mut value = _mm256_or_ps(value, _mm256_castsi256_ps(sign));
            match format {
                // S.1111.111 is NaN; there are no infinities.
                Fp8::E4M3 => {
                    let is_nan = _mm256_cmpeq_epi32(magnitude, special);
                    value = _mm256_blendv_ps(value, nan, _mm256_castsi256_ps(is_nan));
                }
                // Exponent 31: infinity (mantissa 0, signed) or NaN.
                Fp8::E5M2 => {
                    let is_infinity = _mm256_cmpeq_epi32(magnitude, special);
                    let signed_infinity = _mm256_or_si256(infinity, sign);
                    value = _mm256_blendv_ps(
                        value,
                        _mm256_castsi256_ps(signed_infinity),
                        _mm256_castsi256_ps(is_infinity),
                    );
                    let is_nan = _mm256_cmpgt_epi32(magnitude, special);
                    value = _mm256_blendv_ps(value, nan, _mm256_castsi256_ps(is_nan));
                }
            }
            _mm256_storeu_ps(out.as_mut_ptr().add(at), value);
        }
    }
    let values = &tables(format).values;
    for index in chunks * 8..length {
        out[index] = values[codes[index] as usize];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_decode_to_their_documented_values() {
        // Proves the layouts: extremes, subnormals, NaN/inf codes of both formats.
        assert_eq!(Fp8::E4M3.to_f32(0x7e), 448.0);
        assert_eq!(Fp8::E4M3.to_f32(0x01), 2f32.powi(-9));
        assert_eq!(Fp8::E4M3.to_f32(0x38), 1.0);
        assert!(Fp8::E4M3.to_f32(0x7f).is_nan());
        assert_eq!(Fp8::E4M3.to_f32(0xb8), -1.0);
        assert_eq!(Fp8::E5M2.to_f32(0x7b), 57344.0);
        assert_eq!(Fp8::E5M2.to_f32(0x01), 2f32.powi(-16));
        assert_eq!(Fp8::E5M2.to_f32(0x3c), 1.0);
        assert_eq!(Fp8::E5M2.to_f32(0x7c), f32::INFINITY);
    }

    #[test]
    fn slice_widening_gives_the_table_bits_for_every_code_at_every_position() {
        // Proves the vector path (on CPUs with AVX2) matches the code table bit for bit,
        // NaN and infinity codes included, in every lane and in the scalar tail.
        for format in [Fp8::E4M3, Fp8::E5M2] {
            for offset in 0..9usize {
                let codes: Vec<u8> = (0..=255u8).cycle().skip(offset).take(256 + 7).collect();
                let mut out = vec![0f32; codes.len()];
                format.widen(&codes, &mut out);
                for (&code, value) in codes.iter().zip(&out) {
                    assert_eq!(
                        value.to_bits(),
                        format.to_f32(code).to_bits(),
                        "{format:?} {code:#04x}"
                    );
                }
            }
        }
    }

    #[test]
    fn narrowing_is_nearest_ties_to_even_and_saturates() {
        // Proves every finite code round-trips, a half-way value goes to the even
        // code, and out-of-range values clamp to the largest finite one.
        for format in [Fp8::E4M3, Fp8::E5M2] {
            for code in 0u8..=255 {
                let value = format.to_f32(code);
                if value.is_finite() && value != 0.0 {
                    assert_eq!(format.encode(value), code, "{format:?} {code:#04x}");
                }
            }
        }
        // 1.0 (0x38) and 1.125 (0x39): 1.0625 ties to the even code 0x38.
        assert_eq!(Fp8::E4M3.encode(1.0625), 0x38);
        assert_eq!(Fp8::E4M3.encode(1.07), 0x39);
        assert_eq!(Fp8::E4M3.encode(1e6), 0x7e);
        assert_eq!(Fp8::E4M3.encode(-1e6), 0xfe);
    }
}
