//! Writes seeded test adapters for the linear-stack demo model, in either naming and
//! at f32, f16 or bf16 factor precision.

use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::load::f16_to_f32;
use super::LoraError;
use crate::model::demo::DemoSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LoraNaming {
    Peft,
    Kohya,
}

/// The dtype [`write_demo_lora`] stores factors in. Every precision draws the same
/// seeded f32 values and rounds them to nearest (ties to even), so files with one seed
/// at two precisions are one adapter stored twice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum LoraDtype {
    #[default]
    F32,
    F16,
    Bf16,
}

impl LoraDtype {
    /// `value` as this dtype stores it, widened back to f32 (exact: both narrow
    /// formats are subsets of f32). Overflow gives ±infinity, as a cast would.
    pub fn round(self, value: f32) -> f32 {
        match self {
            LoraDtype::F32 => value,
            LoraDtype::F16 => f16_to_f32(f32_to_f16_bits(value)),
            LoraDtype::Bf16 => f32::from_bits(u32::from(f32_to_bf16_bits(value)) << 16),
        }
    }

    pub(crate) fn safetensors(self) -> Dtype {
        match self {
            LoraDtype::F32 => Dtype::F32,
            LoraDtype::F16 => Dtype::F16,
            LoraDtype::Bf16 => Dtype::BF16,
        }
    }

    /// Little-endian bytes of `values` in this dtype.
    pub(crate) fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            LoraDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            LoraDtype::F16 => values
                .iter()
                .flat_map(|v| f32_to_f16_bits(*v).to_le_bytes())
                .collect(),
            LoraDtype::Bf16 => values
                .iter()
                .flat_map(|v| f32_to_bf16_bits(*v).to_le_bytes())
                .collect(),
        }
    }
}

/// What [`write_demo_lora`] writes.
#[derive(Debug, Clone, PartialEq)]
pub struct DemoLora {
    pub rank: usize,
    pub seed: u64,
    pub naming: LoraNaming,
    /// Written as per-module `alpha` tensors; `None` leaves alpha = rank.
    pub alpha: Option<f32>,
    /// Patch every `every`-th layer of the model (1 = all).
    pub every: usize,
    /// Precision of the A/B factors; alpha stays f32 so precisions differ only in
    /// the factors.
    pub dtype: LoraDtype,
}

impl Default for DemoLora {
    fn default() -> Self {
        Self {
            rank: 8,
            seed: 11,
            naming: LoraNaming::Peft,
            alpha: Some(16.0),
            every: 1,
            dtype: LoraDtype::F32,
        }
    }
}

impl DemoLora {
    /// Checks the adapter can be generated for `spec`: rank and spacing at least 1, the
    /// rank at most the layers' width (a larger one cannot be a low-rank update), and
    /// the factors — held in memory while they are written — within the RAM this
    /// machine can spare (`MemAvailable` less the 2 GiB minimum floor).
    pub fn validate(&self, path: &Path, spec: &DemoSpec) -> Result<(), LoraError> {
        if self.rank == 0 || self.every == 0 {
            return Err(LoraError::RankZero {
                path: path.to_path_buf(),
                module: "(generator: rank and every must be at least 1)".to_string(),
            });
        }
        let generation_error = |problem: String| LoraError::Shape {
            path: path.to_path_buf(),
            key: "--lora-rank".to_string(),
            problem,
        };
        if self.rank > spec.dim as usize {
            return Err(generation_error(format!(
                "rank {} is above the model's width {}: a LoRA's rank is at most its layers' \
                 width (try 8 or 16)",
                self.rank, spec.dim
            )));
        }
        let layers = u64::from(spec.blocks) * u64::from(spec.layers_per_block);
        let patched = layers.div_ceil(self.every as u64);
        // a and b as f32, and their encoded copy: three times the factors' f32 bytes.
        let bytes = (self.rank as u64)
            .checked_mul(u64::from(spec.dim))
            .and_then(|bytes| bytes.checked_mul(2 * 4 * 3))
            .and_then(|bytes| bytes.checked_mul(patched));
        let spare = crate::os::available_ram_bytes()
            .map(|available| available.saturating_sub(crate::settings::MIN_RAM_FLOOR.as_u64()));
        match (bytes, spare) {
            (None, _) => Err(generation_error(format!(
                "rank {} x width {} x {patched} layers overflows",
                self.rank, spec.dim
            ))),
            (Some(bytes), Some(spare)) if bytes > spare => Err(generation_error(format!(
                "rank {} needs {bytes} bytes of factors in memory while they are written, \
                 over the {spare} this machine can spare; lower --lora-rank",
                self.rank
            ))),
            _ => Ok(()),
        }
    }
}

/// One module's factors, row-major: `a` is `[rank, in]`, `b` is `[out, rank]`.
struct Factors {
    module: String,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Writes an adapter that patches the demo model's layers and returns its size.
pub fn write_demo_lora(path: &Path, spec: &DemoSpec, lora: &DemoLora) -> Result<u64, LoraError> {
    lora.validate(path, spec)?;
    let dim = spec.dim as usize;
    let mut state = lora.seed ^ spec.seed;
    let mut next = |bound: f32| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let unit = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
        (unit * 2.0 - 1.0) * bound
    };
    let mut modules = Vec::new();
    let mut layer_number = 0usize;
    for block in 0..spec.blocks {
        for layer in 0..spec.layers_per_block {
            layer_number += 1;
            if (layer_number - 1) % lora.every != 0 {
                continue;
            }
            let base = DemoSpec::tensor_name(block, layer);
            let module = base.trim_end_matches(".weight").to_string();
            let a_bound = 1.0 / (dim as f32).sqrt();
            let b_bound = 0.5 / (lora.rank as f32).sqrt();
            let a = (0..lora.rank * dim).map(|_| next(a_bound)).collect();
            let b = (0..dim * lora.rank).map(|_| next(b_bound)).collect();
            modules.push(Factors { module, a, b });
        }
    }
    write_factors(path, lora, dim, &modules)
}

fn write_factors(
    path: &Path,
    lora: &DemoLora,
    dim: usize,
    modules: &[Factors],
) -> Result<u64, LoraError> {
    let io = |reason: String| LoraError::Io {
        path: path.to_path_buf(),
        reason,
    };
    let (down, up, prefix) = match lora.naming {
        LoraNaming::Peft => ("lora_A.weight", "lora_B.weight", "base_model.model."),
        LoraNaming::Kohya => ("lora_down.weight", "lora_up.weight", "lora_unet_"),
    };
    let key = |module: &str| match lora.naming {
        LoraNaming::Peft => format!("{prefix}{module}"),
        LoraNaming::Kohya => format!("{prefix}{}", module.replace('.', "_")),
    };
    let factor_dtype = lora.dtype;
    let mut owned: Vec<(String, LoraDtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for factors in modules {
        let module = key(&factors.module);
        owned.push((
            format!("{module}.{down}"),
            factor_dtype,
            vec![lora.rank, dim],
            factor_dtype.encode(&factors.a),
        ));
        owned.push((
            format!("{module}.{up}"),
            factor_dtype,
            vec![dim, lora.rank],
            factor_dtype.encode(&factors.b),
        ));
        if let Some(alpha) = lora.alpha {
            owned.push((
                format!("{module}.alpha"),
                LoraDtype::F32,
                vec![],
                LoraDtype::F32.encode(&[alpha]),
            ));
        }
    }
    let views = owned
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            TensorView::new(dtype.safetensors(), shape.clone(), bytes)
                .map(|view| (name.clone(), view))
                .map_err(|error| io(error.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent).map_err(|error| io(error.to_string()))?;
    }
    let metadata = HashMap::from([("stagehand.kind".to_string(), "demo-lora".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|error| io(error.to_string()))?;
    std::fs::metadata(path)
        .map(|meta| meta.len())
        .map_err(|error| io(error.to_string()))
}

/// Drops the low `shift` bits of `value`, rounding to nearest with ties to even.
/// `shift` is 1..=31. A carry out of the kept bits is left to the caller's addition,
/// where it correctly bumps the exponent (up to infinity).
fn shift_round_even(value: u32, shift: u32) -> u32 {
    let kept = value >> shift;
    let dropped = value & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    if dropped > half || (dropped == half && kept & 1 == 1) {
        kept + 1
    } else {
        kept
    }
}

/// IEEE single → half, round to nearest, ties to even; overflow → ±infinity,
/// underflow → subnormals then ±0, NaN stays a (quiet) NaN.
pub(crate) fn f32_to_f16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32;
    let mantissa = bits & 0x7f_ffff;
    if exponent == 0xff {
        let nan = if mantissa == 0 { 0 } else { 0x200 };
        return sign | 0x7c00 | nan;
    }
    if exponent == 0 {
        // f32 subnormals are below 2^-126, far under half the smallest f16 (2^-25).
        return sign;
    }
    // The half's biased exponent (bias 15 instead of 127).
    let half_exponent = exponent - 127 + 15;
    if half_exponent >= 0x1f {
        return sign | 0x7c00;
    }
    if half_exponent <= 0 {
        // Subnormal half: the value is `significand · 2^-24` with the implicit bit
        // included; shifting by 25 or more leaves less than half of 2^-24.
        let shift = (14 - half_exponent) as u32;
        if shift >= 25 {
            return sign;
        }
        return sign | shift_round_even(mantissa | 0x80_0000, shift) as u16;
    }
    // A rounding carry out of the 10 mantissa bits moves into the exponent (1.111… → 2.0,
    // 65520 → infinity), which is what adding them gives.
    sign | (((half_exponent as u32) << 10) + shift_round_even(mantissa, 13)) as u16
}

/// IEEE single → bfloat16 (the single's top 16 bits), round to nearest, ties to
/// even; NaN stays a (quiet) NaN.
pub(crate) fn f32_to_bf16_bits(value: f32) -> u16 {
    let bits = value.to_bits();
    if value.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    // Same exponent field as f32, so subnormals, overflow to infinity and the carry
    // into the exponent all fall out of rounding the bit pattern.
    (((bits >> 16) & 0x8000) | shift_round_even(bits & 0x7fff_ffff, 16)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lora::load_adapter;
    use crate::model::demo::write_linear_stack;
    use crate::model::ModelIndex;

    /// A narrow format's bits for a value, and its widening back to f32.
    type Format = (u16, fn(u16) -> f32);

    fn bf16_to_f32(bits: u16) -> f32 {
        f32::from_bits(u32::from(bits) << 16)
    }

    #[test]
    fn f16_rounding_is_nearest_even_on_edge_values() {
        // Proves single → half on zeros, the largest finite, overflow, subnormals,
        // underflow and ties (which go to the even neighbour).
        let cases: [(f32, u16); 18] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (65504.0, 0x7bff),
            (65519.996, 0x7bff),
            (65520.0, 0x7c00), // tie between 65504 (odd) and 65536: up, to infinity
            (f32::INFINITY, 0x7c00),
            (f32::NEG_INFINITY, 0xfc00),
            (2f32.powi(-24), 0x0001),             // smallest subnormal
            (2f32.powi(-25), 0x0000),             // tie with zero: to even zero
            (-2f32.powi(-25), 0x8000),            // ... keeping the sign
            (3.0 * 2f32.powi(-25), 0x0002),       // tie between 1 and 2 ulps: even
            (1023.0 * 2f32.powi(-24), 0x03ff),    // largest subnormal
            (2f32.powi(-14), 0x0400),             // smallest normal
            (1.0 + 2f32.powi(-11), 0x3c00),       // tie: stays on even 1.0
            (1.0 + 3.0 * 2f32.powi(-11), 0x3c02), // tie: up to even
            (1.0 + 2f32.powi(-11) + 2f32.powi(-23), 0x3c01), // just past the tie: up
        ];
        for (value, bits) in cases {
            assert_eq!(f32_to_f16_bits(value), bits, "{value:e}");
        }
        assert_eq!(f32_to_f16_bits(f32::MAX), 0x7c00);
        assert_eq!(f32_to_f16_bits(f32::from_bits(1)), 0x0000); // f32 subnormal
        assert!(f16_to_f32(f32_to_f16_bits(f32::NAN)).is_nan());
        // Every finite or infinite half survives the round trip unchanged.
        for bits in 0..=u16::MAX {
            if bits & 0x7c00 == 0x7c00 && bits & 0x03ff != 0 {
                continue; // NaN payloads
            }
            assert_eq!(f32_to_f16_bits(f16_to_f32(bits)), bits, "{bits:#06x}");
        }
    }

    #[test]
    fn bf16_rounding_is_nearest_even_on_edge_values() {
        // Proves single → bfloat16 on zeros, the largest finite, overflow, f32
        // subnormals and ties.
        let cases: [(f32, u16); 11] = [
            (0.0, 0x0000),
            (-0.0, 0x8000),
            (1.0, 0x3f80),
            (bf16_to_f32(0x7f7f), 0x7f7f), // largest finite bf16
            (f32::MAX, 0x7f80),            // rounds past it to infinity
            (f32::NEG_INFINITY, 0xff80),
            (f32::from_bits(0x0001_7fff), 0x0001), // subnormal, below the tie
            (f32::from_bits(0x0000_8000), 0x0000), // subnormal tie with zero: even
            (1.0 + 2f32.powi(-8), 0x3f80),         // tie: stays on even 1.0
            (1.0 + 3.0 * 2f32.powi(-8), 0x3f82),   // tie: up to even
            (1.0 + 2f32.powi(-8) + 2f32.powi(-23), 0x3f81), // just past the tie
        ];
        for (value, bits) in cases {
            assert_eq!(f32_to_bf16_bits(value), bits, "{value:e}");
        }
        assert!(bf16_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
        for bits in 0..=u16::MAX {
            if bits & 0x7f80 == 0x7f80 && bits & 0x007f != 0 {
                continue;
            }
            assert_eq!(f32_to_bf16_bits(bf16_to_f32(bits)), bits, "{bits:#06x}");
        }
    }

    #[test]
    fn rounding_picks_the_nearest_neighbour_for_seeded_values() {
        // Proves, on 200k seeded f32 values across the f16 range, that the chosen
        // narrow value is no farther than either neighbour, and on an exact tie is even.
        let mut state = 0x5eed_u64;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let exponent = ((state >> 40) % 40) as i32 - 26; // 2^-26 .. 2^13
            let mantissa = (state >> 8) as u32 & 0x7f_ffff;
            let sign = if state & 1 == 1 { -1.0 } else { 1.0 };
            let value = sign * f32::from_bits(0x3f80_0000 | mantissa) * 2f32.powi(exponent);
            let checks: [Format; 2] = [
                (f32_to_f16_bits(value), f16_to_f32),
                (f32_to_bf16_bits(value), bf16_to_f32),
            ];
            for (bits, widen) in checks {
                let error = |b: u16| (f64::from(widen(b)) - f64::from(value)).abs();
                for neighbour in [bits.wrapping_sub(1), bits.wrapping_add(1)] {
                    // Stepping below ±0 wraps to a NaN pattern: not a neighbour.
                    if widen(neighbour).is_nan() {
                        continue;
                    }
                    let (here, there) = (error(bits), error(neighbour));
                    assert!(
                        here < there || (here == there && bits & 1 == 0),
                        "{value:e} → {bits:#06x}, neighbour {neighbour:#06x}"
                    );
                }
            }
        }
    }

    #[test]
    fn narrow_adapters_load_as_the_f32_values_rounded() {
        // Proves an f16 or bf16 demo adapter round-trips through load_adapter as the
        // same seeded f32 factors rounded to that dtype (alpha unchanged), and that
        // the rounding changed some factors.
        let dir = tempfile::tempdir().unwrap();
        let spec = DemoSpec {
            blocks: 2,
            layers_per_block: 2,
            dim: 64,
            seed: 3,
        };
        let model = write_linear_stack(dir.path(), &spec).unwrap();
        let index = ModelIndex::open(&model, None).unwrap();
        let load = |dtype: LoraDtype, naming: LoraNaming| {
            let path = dir.path().join(format!("{dtype:?}-{naming:?}.safetensors"));
            let lora = DemoLora {
                dtype,
                naming,
                ..DemoLora::default()
            };
            write_demo_lora(&path, &spec, &lora).unwrap();
            load_adapter(&path, 1.0, "a".into(), &index, &[]).unwrap()
        };
        for naming in [LoraNaming::Peft, LoraNaming::Kohya] {
            let wide = load(LoraDtype::F32, naming);
            for dtype in [LoraDtype::F16, LoraDtype::Bf16] {
                let narrow = load(dtype, naming);
                assert_eq!(narrow.targets.len(), wide.targets.len());
                let mut changed = 0usize;
                for (n, w) in narrow.targets.iter().zip(&wide.targets) {
                    assert_eq!((n.base.as_str(), n.alpha), (w.base.as_str(), w.alpha));
                    for (got, original) in n.a.iter().chain(&n.b).zip(w.a.iter().chain(&w.b)) {
                        assert_eq!(got.to_bits(), dtype.round(*original).to_bits());
                        changed += usize::from(got != original);
                    }
                }
                assert!(changed > 0, "{dtype:?} rounding changed nothing");
            }
        }
    }
}
