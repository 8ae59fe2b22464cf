//! Softmax attention's costs: per score·dim and per (query, head), fitted over a few
//! shapes, and per score·dim over a KV cache.

use super::{time_calls, KernelOptions};
use crate::compute::{Attention, CachedAttention, Compute, Mask};

/// (sequences, tokens, heads, head width) of the attention calls timed: short texts
/// (an encoder's batch), MiniLM's narrow heads, and longer sequences, so the fit
/// separates what each score costs from what each (query, head) costs.
const ATTENTION_SHAPES: [(usize, usize, usize, usize); 4] = [
    (8, 8, 8, 64),
    (8, 17, 12, 32),
    (8, 32, 8, 64),
    (2, 128, 8, 64),
];

/// Seconds per score·dim and per (query, head) of softmax attention, fitted to
/// [`ATTENTION_SHAPES`] (least squares on the relative error). One figure per
/// score·dim alone priced MiniLM's 8 × 17-token batch 3× short here (0.25 ms timed
/// against 0.09).
pub(super) fn fit_attention<C: Compute>(
    compute: &C,
    options: &KernelOptions,
) -> Result<(f64, f64), crate::compute::ComputeError> {
    let mut timed = Vec::new();
    for (sequences, length, heads, head_dim) in ATTENTION_SHAPES {
        let width = heads * head_dim;
        let rows = sequences * length;
        let values: Vec<f32> = (0..rows * width)
            .map(|index| ((index % 31) as f32 - 15.0) / 32.0)
            .collect();
        let mut q = compute.tensor(rows, width)?;
        compute.write(&mut q, &values)?;
        let mut out = compute.tensor(rows, width)?;
        let lengths = vec![length; sequences];
        let shape = Attention {
            sequences,
            sequence_length: length,
            heads,
            kv_heads: heads,
            head_dim,
            scale: 0.125,
            mask: Mask::Padding(&lengths),
        };
        let seconds = time_calls(compute, options, |_| {
            compute.attention(&q, &q, &q, &shape, &mut out)
        })?;
        let queries = (sequences * heads * length) as f64;
        timed.push((queries * (length * head_dim) as f64, queries, seconds));
    }
    Ok(fit_two(&timed))
}

/// Seconds per score·dim of one new token's attention over a 256-token KV cache.
pub(super) fn cached_attention<C: Compute>(
    compute: &C,
    options: &KernelOptions,
) -> Result<f64, crate::compute::ComputeError> {
    let (heads, head_dim, past) = (8usize, 64usize, 255usize);
    let width = heads * head_dim;
    let values: Vec<f32> = (0..(past + 1) * width)
        .map(|index| ((index % 31) as f32 - 15.0) / 32.0)
        .collect();
    let mut cache = compute.tensor(past + 1, width)?;
    compute.write(&mut cache, &values)?;
    let mut query = compute.tensor(1, width)?;
    compute.write(&mut query, &values[..width])?;
    let mut attended = compute.tensor(1, width)?;
    let cached_shape = CachedAttention {
        heads,
        kv_heads: heads,
        head_dim,
        scale: 0.125,
        past,
        queries: 1,
    };
    let cached = time_calls(compute, options, |_| {
        compute.attention_cached(&query, &cache, &cache, &cached_shape, &mut attended)
    })?;
    let cached_units = (heads * (past + 1) * head_dim) as f64;
    Ok(cached / cached_units)
}

/// `a` and `b` ≥ 0 that make `a·x + b·y` closest to each `t` of `(x, y, t)` in relative
/// terms (each row weighted by 1/t); where the best pair has a negative part, the
/// better of either term alone.
fn fit_two(points: &[(f64, f64, f64)]) -> (f64, f64) {
    let (mut xx, mut xy, mut yy, mut x1, mut y1) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y, t) in points {
        let (x, y) = (x / t, y / t);
        xx += x * x;
        xy += x * y;
        yy += y * y;
        x1 += x;
        y1 += y;
    }
    let determinant = xx * yy - xy * xy;
    if determinant.abs() > f64::EPSILON * xx * yy {
        let a = (x1 * yy - y1 * xy) / determinant;
        let b = (y1 * xx - x1 * xy) / determinant;
        if a >= 0.0 && b >= 0.0 {
            return (a, b);
        }
    }
    let a = if xx > 0.0 { x1 / xx } else { 0.0 };
    let b = if yy > 0.0 { y1 / yy } else { 0.0 };
    let miss = |a: f64, b: f64| -> f64 {
        points
            .iter()
            .map(|&(x, y, t)| ((a * x + b * y) / t - 1.0).powi(2))
            .sum()
    };
    if miss(a, 0.0) <= miss(0.0, b) {
        (a, 0.0)
    } else {
        (0.0, b)
    }
}

#[cfg(test)]
mod tests {
    use super::fit_two;

    #[test]
    fn the_fit_recovers_both_costs_and_keeps_them_non_negative() {
        // Points made from a = 0.05, b = 100 come back exactly.
        let points: Vec<(f64, f64, f64)> =
            [(262_144.0, 512.0), (887_808.0, 1632.0), (4.0e6, 2048.0)]
                .iter()
                .map(|&(x, y)| (x, y, 0.05 * x + 100.0 * y))
                .collect();
        let (a, b) = fit_two(&points);
        assert!(
            (a - 0.05).abs() < 1e-9 && (b - 100.0).abs() < 1e-6,
            "{a} {b}"
        );
        // Times that fall as y grows would need a negative b: x alone is kept.
        let falling = [(1.0, 1.0, 2.0), (2.0, 10.0, 3.0), (3.0, 100.0, 4.0)];
        let (a, b) = fit_two(&falling);
        assert!(a > 0.0 && b == 0.0, "{a} {b}");
    }
}
