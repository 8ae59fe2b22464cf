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
    pub fn to_f32(self, code: u8) -> f32 {
        tables(self).values[code as usize]
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
