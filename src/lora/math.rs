//! The two ways a LoRA reaches the output, both with `matrixmultiply` (deterministic,
//! single-threaded), so a path and its reference produce the same bits when they do
//! the same arithmetic.
//!
//! - merge (resident weights and the reference): `W ← W + s·B·A`, one GEMM with β = 1.
//! - low rank (streamed weights): `y ← y + s·(x·Aᵀ)·Bᵀ`, two thin GEMMs, no `out × in`
//!   temporary. This sums in another order than the merge, so it agrees with the
//!   merged reference to f32 rounding, not bit for bit.

/// One weight's factors wherever they live: the loader's host copy (the reference)
/// or a pack in VRAM (the pipeline). `a` is `[rank, in]`, `b` is `[out, rank]`,
/// row-major.
#[derive(Debug, Clone, Copy)]
pub struct Factors<'a> {
    pub a: &'a [f32],
    pub b: &'a [f32],
    pub out_features: usize,
    pub in_features: usize,
    pub rank: usize,
}

impl Factors<'_> {
    fn check(&self) {
        assert_eq!(
            self.a.len(),
            self.rank * self.in_features,
            "A must be [rank, in]"
        );
        assert_eq!(
            self.b.len(),
            self.out_features * self.rank,
            "B must be [out, rank]"
        );
    }
}

/// `W ← W + scale·B·A` for a row-major `[out, in]` weight.
pub fn merge_into(weight: &mut [f32], target: &Factors<'_>, scale: f32) {
    let (out, rank, input) = (target.out_features, target.rank, target.in_features);
    target.check();
    assert_eq!(weight.len(), out * input, "weight must be [out, in]");
    // SAFETY: B is out×rank, A rank×in, W out×in, all row-major with the strides
    // given and lengths checked at load; W aliases neither factor.
    unsafe {
        matrixmultiply::sgemm(
            out,
            rank,
            input,
            scale,
            target.b.as_ptr(),
            rank as isize,
            1,
            target.a.as_ptr(),
            input as isize,
            1,
            1.0,
            weight.as_mut_ptr(),
            input as isize,
            1,
        );
    }
}

/// `y ← y + scale·(x·Aᵀ)·Bᵀ` for `batch` rows; `scratch` is resized to `batch × rank`.
pub fn apply_low_rank(
    x: &[f32],
    batch: usize,
    target: &Factors<'_>,
    scale: f32,
    scratch: &mut Vec<f32>,
    y: &mut [f32],
) {
    let (out, rank, input) = (target.out_features, target.rank, target.in_features);
    target.check();
    assert_eq!(x.len(), batch * input, "x must be [batch, in]");
    assert_eq!(y.len(), batch * out, "y must be [batch, out]");
    scratch.clear();
    scratch.resize(batch * rank, 0.0);
    // SAFETY: x is batch×in, Aᵀ is read from A (rank×in) with swapped strides, the
    // scratch batch×rank; then scratch · Bᵀ (B is out×rank) into y batch×out. No
    // output aliases an input.
    unsafe {
        matrixmultiply::sgemm(
            batch,
            input,
            rank,
            1.0,
            x.as_ptr(),
            input as isize,
            1,
            target.a.as_ptr(),
            1,
            input as isize,
            0.0,
            scratch.as_mut_ptr(),
            rank as isize,
            1,
        );
        matrixmultiply::sgemm(
            batch,
            rank,
            out,
            scale,
            scratch.as_ptr(),
            rank as isize,
            1,
            target.b.as_ptr(),
            1,
            rank as isize,
            1.0,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
}
