//! The CPU kernels behind `CpuCompute` that need no thread pool, on plain f32 slices:
//! LoRA products (`matrixmultiply`, single-threaded and deterministic; the factors are
//! small), norms and rotary embedding. Each reduction runs in a fixed order.

/// `y ← x·Wᵀ + beta·y`: `x` is `[rows, inner]`, `weights` row-major `[out, inner]`.
pub(super) fn gemm_transposed(
    x: &[f32],
    rows: usize,
    inner: usize,
    weights: &[f32],
    out: usize,
    beta: f32,
    y: &mut [f32],
) {
    assert_eq!(x.len(), rows * inner);
    assert_eq!(weights.len(), out * inner);
    assert_eq!(y.len(), rows * out);
    // SAFETY: x is rows×inner, Wᵀ is read from W (out×inner) with swapped strides, y
    // is rows×out; all lengths were checked above and y aliases neither input.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            inner,
            out,
            1.0,
            x.as_ptr(),
            inner as isize,
            1,
            weights.as_ptr(),
            1,
            inner as isize,
            beta,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
}

/// `y ← y + scale·(x·Aᵀ)·Bᵀ` with `A` `[rank, input]` and `B` `[out, rank]`, through a
/// `[rows, rank]` scratch: two thin GEMMs, no `out × input` temporary.
#[allow(clippy::too_many_arguments)]
pub(super) fn low_rank_add(
    x: &[f32],
    rows: usize,
    input: usize,
    a: &[f32],
    b: &[f32],
    rank: usize,
    out: usize,
    scale: f32,
    scratch: &mut [f32],
    y: &mut [f32],
) {
    assert_eq!(a.len(), rank * input);
    assert_eq!(b.len(), out * rank);
    assert_eq!(scratch.len(), rows * rank);
    gemm_transposed(x, rows, input, a, rank, 0.0, scratch);
    assert_eq!(y.len(), rows * out);
    // SAFETY: scratch is rows×rank, Bᵀ is read from B (out×rank) with swapped
    // strides, y is rows×out; lengths checked above, no output aliases an input.
    unsafe {
        matrixmultiply::sgemm(
            rows,
            rank,
            out,
            scale,
            scratch.as_ptr(),
            rank as isize,
            1,
            b.as_ptr(),
            1,
            rank as isize,
            1.0,
            y.as_mut_ptr(),
            out as isize,
            1,
        );
    }
}

/// `W ← W + scale·B·A` for a row-major `[out, input]` weight.
pub(super) fn merge(
    weight: &mut [f32],
    a: &[f32],
    b: &[f32],
    rank: usize,
    out: usize,
    input: usize,
    scale: f32,
) {
    assert_eq!(weight.len(), out * input);
    assert_eq!(a.len(), rank * input);
    assert_eq!(b.len(), out * rank);
    // SAFETY: B is out×rank, A rank×input, W out×input, all row-major, lengths checked
    // above; W aliases neither factor.
    unsafe {
        matrixmultiply::sgemm(
            out,
            rank,
            input,
            scale,
            b.as_ptr(),
            rank as isize,
            1,
            a.as_ptr(),
            input as isize,
            1,
            1.0,
            weight.as_mut_ptr(),
            input as isize,
            1,
        );
    }
}

/// `y ← (x − mean)/√(var + eps)·gamma + beta` row by row (biased variance, as PyTorch).
pub(super) fn layer_norm(
    x: &[f32],
    cols: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    y: &mut [f32],
) {
    for (row_in, row_out) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        let mean = row_in.iter().sum::<f32>() / cols as f32;
        let variance = row_in
            .iter()
            .map(|value| (value - mean) * (value - mean))
            .sum::<f32>()
            / cols as f32;
        let inverse = 1.0 / (variance + eps).sqrt();
        for (((out, value), gamma), beta) in row_out.iter_mut().zip(row_in).zip(gamma).zip(beta) {
            *out = (value - mean) * inverse * gamma + beta;
        }
    }
}

/// `y ← x/√(mean(x²) + eps)·gamma` row by row.
pub(super) fn rms_norm(x: &[f32], cols: usize, gamma: Option<&[f32]>, eps: f32, y: &mut [f32]) {
    for (row_in, row_out) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        let mean_square = row_in.iter().map(|value| value * value).sum::<f32>() / cols as f32;
        let scale = 1.0 / (mean_square + eps).sqrt();
        match gamma {
            Some(gamma) => {
                for ((out, value), gamma) in row_out.iter_mut().zip(row_in).zip(gamma) {
                    *out = value * scale * gamma;
                }
            }
            None => {
                for (out, value) in row_out.iter_mut().zip(row_in) {
                    *out = value * scale;
                }
            }
        }
    }
}

/// Llama's rotate-half rotary embedding, in place.
pub(super) fn rope(
    x: &mut [f32],
    heads: usize,
    head_dim: usize,
    positions: &[u32],
    inv_freq: &[f32],
) {
    let half = head_dim / 2;
    let cols = heads * head_dim;
    for (row, &position) in x.chunks_exact_mut(cols).zip(positions) {
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &frequency) in inv_freq.iter().enumerate() {
                let angle = position as f32 * frequency;
                let (sin, cos) = angle.sin_cos();
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos - b * sin;
                head[i + half] = b * cos + a * sin;
            }
        }
    }
}
