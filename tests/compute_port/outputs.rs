//! What one pass of the conformance scenario (`ops.rs`) produced, and how two passes,
//! or a pass and the plain reference, are held against each other.

use stagehand::compute::DType;

/// One result of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct Kept {
    pub what: String,
    pub values: Vec<f32>,
    /// Largest normalised difference allowed between two adapters.
    pub tolerance: f32,
    /// The plain reference's values.
    pub reference: Vec<f32>,
}

/// What one pass of the scenario produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs {
    pub values: Vec<Kept>,
    /// Weights after a LoRA merge, as stored (dtype, bytes), with the reference merge
    /// (f32, before rounding to the dtype).
    pub merged: Vec<(String, DType, Vec<u8>, Vec<f32>)>,
    /// Checksums of byte ranges (exact on every adapter).
    pub checksums: Vec<(String, u64)>,
}

/// Largest normalised difference from the plain reference an adapter may show: f32
/// sums in another order than f64 (and a GPU's fused multiply-adds). The CPU adapter
/// measured at most 5.2e-7 (a 512-long dot).
pub const REFERENCE_TOLERANCE: f32 = 1e-4;

/// How far a merged weight may be from the f32 reference merge once stored in `dtype`:
/// half a unit in the last place of its largest values (FP8 E5M2 keeps 2 mantissa bits).
pub fn merge_tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-6,
        DType::F16 => 1e-3,
        DType::Bf16 => 8e-3,
        DType::F8E4M3 => 7e-2,
        DType::F8E5M2 => 0.13,
        // An int8 merge is stored in 255 steps of its scale.
        DType::I8 => 1e-2,
        // Not merged into (refused): no tolerance passes.
        DType::U4 => 0.0,
    }
}

/// Every result against its reference, by name: what differs by more than allowed.
pub fn reference_misses(outputs: &Outputs) -> Vec<String> {
    let mut misses = Vec::new();
    for kept in &outputs.values {
        let difference = normalised_difference(&kept.values, &kept.reference);
        if difference > REFERENCE_TOLERANCE {
            misses.push(format!("{}: {difference} from the reference", kept.what));
        }
    }
    for (what, dtype, bytes, reference) in &outputs.merged {
        let difference = normalised_difference(&dtype.decode(bytes), reference);
        if difference > merge_tolerance(*dtype) {
            misses.push(format!("{what}: {difference} from the reference merge"));
        }
    }
    misses
}

/// max |a − b| over max(1, max |a|); infinite for different lengths or a NaN.
pub fn normalised_difference(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    let scale = a.iter().fold(1f32, |max, value| max.max(value.abs()));
    a.iter().zip(b).fold(0f32, |max, (a, b)| {
        let delta = (a - b).abs();
        if delta.is_nan() {
            f32::INFINITY
        } else {
            max.max(delta / scale)
        }
    })
}

/// The bytes at a host address (the CPU adapter's "device" memory).
pub fn host_read_back(address: u64, length: usize) -> Vec<u8> {
    // SAFETY: only called with the range of a block the scenario holds.
    unsafe { std::slice::from_raw_parts(address as *const u8, length) }.to_vec()
}

/// Bit-for-bit equality of two passes (NaN and signed zeros included).
pub fn assert_same_bits(first: &Outputs, second: &Outputs) {
    assert_eq!(first.values.len(), second.values.len());
    for (a, b) in first.values.iter().zip(&second.values) {
        let same = a.values.len() == b.values.len()
            && a.values
                .iter()
                .zip(&b.values)
                .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{}: two passes differ", a.what);
    }
    assert_eq!(first.merged, second.merged);
    assert_eq!(first.checksums, second.checksums);
}
