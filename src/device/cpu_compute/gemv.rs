//! The few-rows product of a decode step: `y ← x·Wᵀ (+ bias)` for up to
//! [`GEMV_ROWS`] rows, reading the weight once in its storage dtype. Each weight row
//! is widened (and scaled) into a small buffer that stays in cache and dotted with
//! every input row, so a bf16 or FP8 weight costs its own bytes of memory traffic —
//! not a widened f32 copy written and read again, as a GEMM through the cast buffer
//! would. Dot products sum in a fixed order (AVX2/FMA lanes when the CPU has them,
//! chosen once per process), so the same input gives the same bits.

use crate::compute::DType;

/// Products with at most this many rows take this path.
pub(super) const GEMV_ROWS: usize = 8;

/// `y[r, o] ← bias[o] + Σ_i x[r, i]·W[o, i]` (`bias` absent: 0), with `W` given as its
/// stored bytes. `row` is scratch for one widened weight row.
#[allow(clippy::too_many_arguments)]
pub(super) fn gemv(
    x: &[f32],
    rows: usize,
    inner: usize,
    weight: &[u8],
    dtype: DType,
    scale: Option<f32>,
    bias: Option<&[f32]>,
    out: usize,
    row: &mut Vec<f32>,
    y: &mut [f32],
) {
    let row_bytes = inner * dtype.size_bytes();
    row.clear();
    row.resize(inner, 0.0);
    let dot = dot_function();
    for o in 0..out {
        let stored = &weight[o * row_bytes..(o + 1) * row_bytes];
        dtype.widen(stored, row);
        if let Some(scale) = scale {
            row.iter_mut().for_each(|value| *value *= scale);
        }
        let offset = bias.map_or(0.0, |bias| bias[o]);
        for r in 0..rows {
            y[r * out + o] = offset + dot(&x[r * inner..(r + 1) * inner], row);
        }
    }
}

type Dot = fn(&[f32], &[f32]) -> f32;

/// The widest dot product this CPU runs, chosen once so every call sums alike.
fn dot_function() -> Dot {
    static CHOSEN: std::sync::OnceLock<Dot> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return dot_avx2;
        }
        dot_portable
    })
}

/// Sixteen running sums, combined pairwise at the end: vectorises on any target.
fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut sums = [0f32; LANES];
    let chunks = a.len() / LANES;
    for chunk in 0..chunks {
        let (a, b) = (&a[chunk * LANES..][..LANES], &b[chunk * LANES..][..LANES]);
        for lane in 0..LANES {
            sums[lane] += a[lane] * b[lane];
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for lane in 0..width {
            sums[lane] += sums[lane + width];
        }
    }
    let tail: f32 = a[chunks * LANES..]
        .iter()
        .zip(&b[chunks * LANES..])
        .map(|(a, b)| a * b)
        .sum();
    sums[0] + tail
}

#[cfg(target_arch = "x86_64")]
fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: chosen only after AVX2 and FMA were detected on this CPU.
    unsafe { dot_avx2_inner(a, b) }
}

/// Four 8-lane FMA accumulators over 32 values at a time, then a fixed reduction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2_inner(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let length = a.len().min(b.len());
    let chunks = length / 32;
    // SAFETY: every load reads 8 floats at `base + 8k` with `base + 32 <= length`.
    unsafe {
        let mut sums = [_mm256_setzero_ps(); 4];
        for chunk in 0..chunks {
            let base = chunk * 32;
            for (lane, sum) in sums.iter_mut().enumerate() {
                let at = base + lane * 8;
                let x = _mm256_loadu_ps(a.as_ptr().add(at));
                let y = _mm256_loadu_ps(b.as_ptr().add(at));
                *sum = _mm256_fmadd_ps(x, y, *sum);
            }
        }
        let pair = (
            _mm256_add_ps(sums[0], sums[1]),
            _mm256_add_ps(sums[2], sums[3]),
        );
        let all = _mm256_add_ps(pair.0, pair.1);
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), all);
        let mut total = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
            + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
        for index in chunks * 32..length {
            total += a[index] * b[index];
        }
        total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_dot_products_agree_with_a_plain_sum_and_repeat_exactly() {
        // Proves the vector and portable dots sum to the plain result within rounding,
        // for lengths around every chunk edge, and give the same bits twice.
        for length in [0usize, 1, 15, 16, 31, 32, 33, 100, 2048] {
            let a: Vec<f32> = (0..length)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let b: Vec<f32> = (0..length)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 5.0)
                .collect();
            let plain: f64 = a
                .iter()
                .zip(&b)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let chosen = dot_function();
            for dot in [dot_portable as Dot, chosen] {
                let value = dot(&a, &b);
                assert!(
                    (f64::from(value) - plain).abs() <= 1e-3 * (1.0 + plain.abs()),
                    "{length}"
                );
                assert_eq!(value.to_bits(), dot(&a, &b).to_bits());
            }
        }
    }
}
