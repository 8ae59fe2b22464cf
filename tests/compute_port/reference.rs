//! Plain references of the compute port's operations: the definitions in `Compute`'s
//! docs, written as the simplest loops in f64, with nothing shared with any adapter.
//! The conformance suite (`ops.rs`) holds every adapter's results against them.

use stagehand::compute::{Attention, CachedAttention, Mask};

/// `y = x·Wᵀ (+ b)`: `x` is `[rows, inner]`, `w` `[out, inner]`.
pub fn linear(x: &[f32], w: &[f32], bias: Option<&[f32]>, inner: usize) -> Vec<f32> {
    let out = w.len() / inner;
    let mut y = Vec::with_capacity(x.len() / inner * out);
    for row in x.chunks_exact(inner) {
        for (o, weights) in w.chunks_exact(inner).enumerate() {
            let dot: f64 = row
                .iter()
                .zip(weights)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            y.push((dot + bias.map_or(0.0, |bias| f64::from(bias[o]))) as f32);
        }
    }
    y
}

/// `y + s·(x·Aᵀ)·Bᵀ`: `a` is `[rank, inner]`, `b` `[out, rank]`.
pub fn low_rank_add(
    x: &[f32],
    a: &[f32],
    b: &[f32],
    scale: f32,
    inner: usize,
    y: &[f32],
) -> Vec<f32> {
    let rank = a.len() / inner;
    let projected = linear(x, a, None, inner);
    let update = linear(&projected, b, None, rank);
    y.iter()
        .zip(update)
        .map(|(y, u)| (f64::from(*y) + f64::from(scale) * f64::from(u)) as f32)
        .collect()
}

/// `W + s·B·A`: `w` is `[out, inner]`, `a` `[rank, inner]`, `b` `[out, rank]`.
pub fn merge_low_rank(w: &[f32], a: &[f32], b: &[f32], scale: f32, inner: usize) -> Vec<f32> {
    let rank = a.len() / inner;
    w.iter()
        .enumerate()
        .map(|(at, weight)| {
            let (o, i) = (at / inner, at % inner);
            let update: f64 = (0..rank)
                .map(|r| f64::from(b[o * rank + r]) * f64::from(a[r * inner + i]))
                .sum();
            (f64::from(*weight) + f64::from(scale) * update) as f32
        })
        .collect()
}

pub fn add(x: &[f32], y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(a, b)| a + b).collect()
}

pub fn add_scaled_rows(acc: &[f32], y: &[f32], scales: &[f32], cols: usize) -> Vec<f32> {
    acc.chunks_exact(cols)
        .zip(y.chunks_exact(cols))
        .zip(scales)
        .flat_map(|((acc, y), scale)| {
            acc.iter()
                .zip(y)
                .map(move |(a, b)| (f64::from(*a) + f64::from(*scale) * f64::from(*b)) as f32)
        })
        .collect()
}

pub fn gather_add(table: &[f32], ids: &[u32], out: &[f32], cols: usize) -> Vec<f32> {
    out.chunks_exact(cols)
        .zip(ids)
        .flat_map(|(row, &id)| {
            let entry = &table[id as usize * cols..(id as usize + 1) * cols];
            row.iter().zip(entry).map(|(a, b)| a + b)
        })
        .collect()
}

pub fn layer_norm(x: &[f32], gamma: &[f32], beta: &[f32], eps: f32, cols: usize) -> Vec<f32> {
    x.chunks_exact(cols)
        .flat_map(|row| {
            let mean = row.iter().map(|&v| f64::from(v)).sum::<f64>() / cols as f64;
            let variance = row
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / cols as f64;
            let scale = 1.0 / (variance + f64::from(eps)).sqrt();
            row.iter().zip(gamma).zip(beta).map(move |((v, g), b)| {
                ((f64::from(*v) - mean) * scale * f64::from(*g) + f64::from(*b)) as f32
            })
        })
        .collect()
}

pub fn rms_norm(x: &[f32], gamma: Option<&[f32]>, eps: f32, cols: usize) -> Vec<f32> {
    x.chunks_exact(cols)
        .flat_map(|row| {
            let mean_square = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / cols as f64;
            let scale = 1.0 / (mean_square + f64::from(eps)).sqrt();
            row.iter().enumerate().map(move |(i, v)| {
                let g = gamma.map_or(1.0, |gamma| f64::from(gamma[i]));
                (f64::from(*v) * scale * g) as f32
            })
        })
        .collect()
}

/// erf to 1e-15 (its Maclaurin series, summed until the terms vanish, for |x| < 3;
/// the continued fraction of erfc beyond), since std has none.
fn erf(x: f64) -> f64 {
    if x.abs() >= 3.0 {
        // erfc(x) = exp(-x²)/√π · 1/(x + 1/2/(x + 1/(x + 3/2/(x + …)))) (Lentz-free,
        // 60 terms from the tail: ample at |x| ≥ 3).
        let z = x.abs();
        let mut fraction = z;
        for k in (1..60).rev() {
            fraction = z + (k as f64 / 2.0) / fraction;
        }
        let erfc = (-z * z).exp() / std::f64::consts::PI.sqrt() / fraction;
        return (1.0 - erfc).copysign(x);
    }
    let mut term = x;
    let mut sum = x;
    for n in 1..200 {
        term *= -x * x / n as f64;
        let next = term / (2 * n + 1) as f64;
        sum += next;
        if next.abs() < 1e-17 {
            break;
        }
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

pub fn gelu_erf(x: &[f32]) -> Vec<f32> {
    x.iter()
        .map(|&v| {
            let v = f64::from(v);
            (v * 0.5 * (1.0 + erf(v / std::f64::consts::SQRT_2))) as f32
        })
        .collect()
}

pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = f64::from(g);
            (g / (1.0 + (-g).exp()) * f64::from(u)) as f32
        })
        .collect()
}

/// Rotate-half rotary embedding; the angle is `position · frequency` in f32, as the
/// port's frequencies are.
pub fn rope(
    x: &[f32],
    heads: usize,
    head_dim: usize,
    positions: &[u32],
    inv_freq: &[f32],
) -> Vec<f32> {
    let half = head_dim / 2;
    let mut out = x.to_vec();
    for (row, &position) in out.chunks_exact_mut(heads * head_dim).zip(positions) {
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &frequency) in inv_freq.iter().enumerate() {
                let angle = f64::from(position as f32 * frequency);
                let (a, b) = (f64::from(head[i]), f64::from(head[i + half]));
                head[i] = (a * angle.cos() - b * angle.sin()) as f32;
                head[i + half] = (b * angle.cos() + a * angle.sin()) as f32;
            }
        }
    }
    out
}

/// Softmax attention of one query row over `keys` (rows of `kv_cols`), head `h`.
#[allow(clippy::too_many_arguments)]
fn attend(
    query: &[f32],
    k: &[f32],
    v: &[f32],
    keys: impl Iterator<Item = usize> + Clone,
    kv_head: usize,
    head_dim: usize,
    kv_cols: usize,
    scale: f32,
) -> Vec<f32> {
    let column = kv_head * head_dim;
    let scores: Vec<f64> = keys
        .clone()
        .map(|key| {
            let key_row = &k[key * kv_cols + column..key * kv_cols + column + head_dim];
            query
                .iter()
                .zip(key_row)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum::<f64>()
                * f64::from(scale)
        })
        .collect();
    let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..head_dim)
        .map(|d| {
            keys.clone()
                .zip(&weights)
                .map(|(key, w)| w / total * f64::from(v[key * kv_cols + column + d]))
                .sum::<f64>() as f32
        })
        .collect()
}

pub fn attention(q: &[f32], k: &[f32], v: &[f32], shape: &Attention<'_>) -> Vec<f32> {
    let (heads, kv_heads, dim) = (shape.heads, shape.kv_heads, shape.head_dim);
    let (cols, kv_cols, length) = (heads * dim, kv_heads * dim, shape.sequence_length);
    let mut out = vec![0.0; shape.sequences * length * cols];
    for sequence in 0..shape.sequences {
        for i in 0..length {
            let row = sequence * length + i;
            let seen = match shape.mask {
                Mask::Padding(lengths) => lengths[sequence],
                Mask::Causal => i + 1,
            };
            let keys = (0..seen).map(|j| sequence * length + j);
            for head in 0..heads {
                let query = &q[row * cols + head * dim..row * cols + (head + 1) * dim];
                let kv_head = head / (heads / kv_heads);
                let context = attend(
                    query,
                    k,
                    v,
                    keys.clone(),
                    kv_head,
                    dim,
                    kv_cols,
                    shape.scale,
                );
                out[row * cols + head * dim..row * cols + (head + 1) * dim]
                    .copy_from_slice(&context);
            }
        }
    }
    out
}

pub fn attention_cached(q: &[f32], k: &[f32], v: &[f32], shape: &CachedAttention) -> Vec<f32> {
    let (heads, kv_heads, dim) = (shape.heads, shape.kv_heads, shape.head_dim);
    let (cols, kv_cols) = (heads * dim, kv_heads * dim);
    let mut out = vec![0.0; shape.queries * cols];
    for i in 0..shape.queries {
        let keys = 0..=shape.past + i;
        for head in 0..heads {
            let query = &q[i * cols + head * dim..i * cols + (head + 1) * dim];
            let kv_head = head / (heads / kv_heads);
            let context = attend(
                query,
                k,
                v,
                keys.clone(),
                kv_head,
                dim,
                kv_cols,
                shape.scale,
            );
            out[i * cols + head * dim..i * cols + (head + 1) * dim].copy_from_slice(&context);
        }
    }
    out
}
