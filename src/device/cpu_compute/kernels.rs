//! The smaller CPU kernels behind `CpuCompute`, on plain f32 slices: LoRA products
//! (`matrixmultiply`, single-threaded and deterministic; the factors are small),
//! rotary embedding, and the norms and residual add, whose rows or parts go to the
//! pool's threads by shape alone. Each reduction runs in a fixed order.

use super::pool::Pool;

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

/// Running sums in a row sum: element `i` of a row goes to sum `i % ROW_SUM_LANES`.
const ROW_SUM_LANES: usize = 16;

/// `Σ term(value)` over `values`, in one order fixed by the length alone: sixteen
/// running sums (element `i` into sum `i % 16`) — sixteen independent chains the
/// compiler keeps in vector registers of any width, instead of one chain waiting on
/// each add — then folded in halves (8 + 8, 4 + 4, 2 + 2, 1 + 1), then the tail
/// one by one. The same bits on any instruction set and any split over threads.
#[inline(always)]
fn row_sum(values: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut sums = [0.0f32; ROW_SUM_LANES];
    let chunks = values.chunks_exact(ROW_SUM_LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (sum, &value) in sums.iter_mut().zip(chunk) {
            *sum += term(value);
        }
    }
    let mut width = ROW_SUM_LANES / 2;
    while width > 0 {
        for lane in 0..width {
            sums[lane] += sums[lane + width];
        }
        width /= 2;
    }
    tail.iter().fold(sums[0], |sum, &value| sum + term(value))
}

/// `x ← x + y`, element-wise, parts of it on the pool's threads.
pub(super) fn add(pool: &Pool, x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len());
    pool.split(x, 16, &|part, first| {
        let y = &y[first..first + part.len()];
        part.iter_mut().zip(y).for_each(|(x, y)| *x += y);
    });
}

/// Runs `row(input, output)` on each pair of rows of `x` and `y` (`cols` values each),
/// the rows shared over the pool's threads by shape.
fn rows_on_pool(
    pool: &Pool,
    (x, cols): (&[f32], usize),
    y: &mut [f32],
    row: &(dyn Fn(&[f32], &mut [f32]) + Sync),
) {
    assert_eq!(x.len(), y.len());
    pool.split(y, cols, &|part, first| {
        let x = &x[first..first + part.len()];
        for (row_in, row_out) in x.chunks_exact(cols).zip(part.chunks_exact_mut(cols)) {
            row(row_in, row_out);
        }
    });
}

/// `y ← (x − mean)/√(var + eps)·gamma + beta` row by row (biased variance, as PyTorch;
/// both sums by [`row_sum`]), rows shared over the pool's threads.
pub(super) fn layer_norm(
    pool: &Pool,
    (x, cols): (&[f32], usize),
    (gamma, beta): (&[f32], &[f32]),
    eps: f32,
    y: &mut [f32],
) {
    rows_on_pool(pool, (x, cols), y, &|row_in, row_out| {
        let mean = row_sum(row_in, |value| value) / cols as f32;
        let variance = row_sum(row_in, |value| (value - mean) * (value - mean)) / cols as f32;
        let inverse = 1.0 / (variance + eps).sqrt();
        for (((out, value), gamma), beta) in row_out.iter_mut().zip(row_in).zip(gamma).zip(beta) {
            *out = (value - mean) * inverse * gamma + beta;
        }
    });
}

/// `y ← x/√(mean(x²) + eps)·gamma` row by row (the sum by [`row_sum`]), rows shared
/// over the pool's threads.
pub(super) fn rms_norm(
    pool: &Pool,
    (x, cols): (&[f32], usize),
    gamma: Option<&[f32]>,
    eps: f32,
    y: &mut [f32],
) {
    rows_on_pool(pool, (x, cols), y, &|row_in, row_out| {
        let mean_square = row_sum(row_in, |value| value * value) / cols as f32;
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
    });
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
