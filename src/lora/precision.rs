//! How far a run with f16 or bf16 LoRA factors may land from the same adapter in f32.
//!
//! Storing a factor in a narrow float rounds each element by at most the format's unit
//! roundoff `u` (relative): 2^-11 for f16 (11 significand bits), 2^-8 for bf16 (8). The
//! pipeline widens factors to f32 on load, so the resident bake and the streamed
//! low-rank path both compute with exactly the rounded values and agree with the merged
//! reference of those values within the f32 [`LORA_TOLERANCE`]. What remains is how the
//! rounded factors move the output away from the f32 adapter: the patch `s·B·A` (with
//! `s = strength · alpha / rank`) carries relative errors of order `u`, and each layer
//! RMS-normalises its output, so elements stay of order 1 and the error is absolute
//! on that scale, growing with `s` and with depth.
//!
//! The figures are for the linear-stack demo (8 blocks × 2 layers, dim 256, batch 4)
//! with demo adapters whose scale `s` is at most [`LORA_PRECISION_SCALE_LIMIT`], alone
//! or two stacked — alpha up to twice the rank at strength up to 1, as real adapters
//! mostly are. Measured worst `max |out(narrow) − out(f32)|` over ~300 seeded cases
//! (single adapters at s = 0.5–2 with ranks 4–32, and PEFT + kohya pairs at s = 1.6 + 2
//! and 2 + 2): 7.9 u for f16 (3.9e-3) and 9.1 u for bf16 (3.6e-2). The tolerances
//! allow 16 u, 1.75× (bf16) to 2× (f16) the worst seen. Beyond the limit the error is not
//! bounded by a constant: at s = 4 the worst of 128 seeds was 21 u (f16) and 42 u
//! (bf16), and single seeds at s = 6–8 reached 56 u.
//!
//! [`LORA_TOLERANCE`]: crate::families::lora_set::LORA_TOLERANCE

/// Per-adapter `strength · alpha / rank` up to which the tolerances below are stated.
pub const LORA_PRECISION_SCALE_LIMIT: f32 = 2.0;

/// Largest absolute difference allowed between the demo model's output with f16
/// factors and the merged reference of the same adapter in f32: 16 × 2^-11 = 2^-7.
/// Measured worst: 3.9e-3 (7.9 u).
pub const LORA_F16_TOLERANCE: f32 = 0.007_812_5;

/// Largest absolute difference allowed between the demo model's output with bf16
/// factors and the merged reference of the same adapter in f32: 16 × 2^-8 = 2^-4.
/// Measured worst: 3.6e-2 (9.1 u).
pub const LORA_BF16_TOLERANCE: f32 = 0.062_5;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerances_are_sixteen_unit_roundoffs() {
        // Proves the constants are what their docs derive: 16 × 2^-11 and 16 × 2^-8.
        assert_eq!(LORA_F16_TOLERANCE, 16.0 * 2f32.powi(-11));
        assert_eq!(LORA_BF16_TOLERANCE, 16.0 * 2f32.powi(-8));
    }
}
