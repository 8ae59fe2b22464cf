//! One block of query rows against one K/V head: the key tiles' scores, the online
//! softmax, the output sums (see the parent module for the order every value keeps).

use super::super::elementwise::exp;
use super::super::simd::Lanes;
use super::{KEY_TILE, LANES, OUT_ROWS};

/// One K/V head as the blocks read it.
pub(super) struct Keys<'a> {
    /// Kᵀ, `[dim, padded]`.
    pub transposed: &'a [f32],
    pub padded: usize,
    pub values: Rows<'a>,
    pub scale: f32,
}

/// The V rows of one head: row `key` is `values[key·stride ..][..dim]`.
pub(super) struct Rows<'a> {
    pub values: &'a [f32],
    pub stride: usize,
    pub dim: usize,
}

impl Rows<'_> {
    #[inline(always)]
    fn row(&self, key: usize) -> &[f32] {
        &self.values[key * self.stride..][..self.dim]
    }
}

/// One query row of a block: its q, how many keys it sees, its output.
pub(super) struct QueryRow<'a> {
    pub q: &'a [f32],
    pub visible: usize,
    pub out: &'a mut [f32],
}

/// A query's online softmax so far.
#[derive(Clone, Copy)]
struct Running {
    maximum: f32,
    total: f32,
}

/// `softmax(scale·q·Kᵀ)·V` for each row of the block over its own visible keys. The
/// block walks key tiles up to its longest row; a tile a row does not see leaves that
/// row untouched, and keys past a row's end get weight 0, so each row's bits are the
/// ones it would have alone.
///
/// # Safety
/// The CPU runs `L`'s instructions.
#[inline(always)]
pub(super) unsafe fn run_block<L: Lanes, const QB: usize>(
    mut rows: [QueryRow<'_>; QB],
    keys: &Keys<'_>,
) {
    let end = rows.iter().map(|row| row.visible).max().unwrap_or(0);
    let mut running = [Running {
        maximum: f32::NEG_INFINITY,
        total: 0.0,
    }; QB];
    for row in rows.iter_mut() {
        row.out.iter_mut().for_each(|value| *value = 0.0);
    }
    let q = std::array::from_fn(|index| rows[index].q);
    let mut tile = 0;
    while tile < end {
        let count = KEY_TILE.min(end - tile);
        let mut scores = [[0f32; KEY_TILE]; QB];
        // SAFETY: `tile + count ≤ padded` rows of lanes; the caller's contract.
        unsafe {
            match count.div_ceil(LANES) {
                1 => tile_scores::<L, QB, 1>(q, keys, tile, &mut scores),
                2 => tile_scores::<L, QB, 2>(q, keys, tile, &mut scores),
                3 => tile_scores::<L, QB, 3>(q, keys, tile, &mut scores),
                _ => tile_scores::<L, QB, 4>(q, keys, tile, &mut scores),
            }
        }
        let mut weights = [[0f32; KEY_TILE]; QB];
        let mut corrections = [1f32; QB];
        for (index, row) in rows.iter().enumerate() {
            let seen = row.visible.saturating_sub(tile).min(KEY_TILE);
            if seen > 0 {
                corrections[index] = softmax_tile(
                    &mut scores[index],
                    (seen, keys.scale),
                    &mut running[index],
                    &mut weights[index],
                );
            }
        }
        let tile_weights = Weights {
            weights: &weights,
            corrections: &corrections,
            first_key: tile,
            count,
        };
        // SAFETY: the caller's contract.
        unsafe { accumulate_block::<L, QB>(&mut rows, &tile_weights, &keys.values) };
        tile += count;
    }
    for (row, running) in rows.iter_mut().zip(&running) {
        if running.total > 0.0 {
            let inverse = 1.0 / running.total;
            row.out.iter_mut().for_each(|value| *value *= inverse);
        }
    }
}

/// One row's step of the online softmax over a tile whose first `seen` scores it
/// sees: the scores scaled (the rest at −∞, weight 0), the running maximum and sum
/// moved on, the weights written; returns the factor the row's output so far takes.
/// The maximum and sum are taken in sixteen lanes, then over the lanes in order.
#[inline(always)]
fn softmax_tile(
    scores: &mut [f32; KEY_TILE],
    (seen, scale): (usize, f32),
    running: &mut Running,
    weights: &mut [f32; KEY_TILE],
) -> f32 {
    for (index, score) in scores.iter_mut().enumerate() {
        *score = if index < seen {
            *score * scale
        } else {
            f32::NEG_INFINITY
        };
    }
    // A comparison, not `f32::max` (whose NaN rule costs a compare and a blend per
    // vector): scores are never NaN for finite inputs.
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut lane_maximum = [f32::NEG_INFINITY; LANES];
    for row in scores.chunks_exact(LANES) {
        for (lane, score) in lane_maximum.iter_mut().zip(row) {
            *lane = larger(*lane, *score);
        }
    }
    let tile_maximum = lane_maximum
        .iter()
        .fold(f32::NEG_INFINITY, |a, &b| larger(a, b));
    let next_maximum = larger(running.maximum, tile_maximum);
    // The first tile a row sees rescales nothing: exp(−∞) = 0 times a zero row.
    let correction = exp(running.maximum - next_maximum);
    for (weight, score) in weights.iter_mut().zip(scores.iter()) {
        *weight = exp(score - next_maximum);
    }
    let mut lane_total = [0f32; LANES];
    for row in weights.chunks_exact(LANES) {
        for (lane, weight) in lane_total.iter_mut().zip(row) {
            *lane += weight;
        }
    }
    running.total = running.total * correction + lane_total.iter().sum::<f32>();
    running.maximum = next_maximum;
    correction
}

/// The first `ROWS · LANES` scores of a tile for each query of a block: `q · Kᵀ[:, key]`,
/// fused multiply-adds over d in order. One load of each Kᵀ row serves every query.
///
/// # Safety
/// `tile + ROWS · LANES ≤ keys.padded`; the CPU runs `L`'s instructions.
#[inline(always)]
unsafe fn tile_scores<L: Lanes, const QB: usize, const ROWS: usize>(
    q: [&[f32]; QB],
    keys: &Keys<'_>,
    tile: usize,
    scores: &mut [[f32; KEY_TILE]; QB],
) {
    let dim = q[0].len();
    // SAFETY (whole body): Kᵀ holds `dim · padded` values and each load reads
    // `LANES` of row d from `tile + row · LANES`, inside it (the caller's contract).
    unsafe {
        let mut sums = [[L::zero(); ROWS]; QB];
        for d in 0..dim {
            let column = keys.transposed.as_ptr().add(d * keys.padded + tile);
            // Loops, not `array::from_fn`: a closure does not inherit the caller's
            // target features, so the lanes' intrinsics would not inline into it.
            let mut key_rows = [L::zero(); ROWS];
            for (row, key_row) in key_rows.iter_mut().enumerate() {
                *key_row = L::load(column.add(row * LANES));
            }
            for (sum, q) in sums.iter_mut().zip(&q) {
                let q_d = L::splat(q[d]);
                for (sum, key_row) in sum.iter_mut().zip(&key_rows) {
                    *sum = L::fma(q_d, *key_row, *sum);
                }
            }
        }
        for (sum, scores) in sums.iter().zip(scores.iter_mut()) {
            for (row, sum) in sum.iter().enumerate() {
                sum.store(scores.as_mut_ptr().add(row * LANES));
            }
        }
    }
}

/// A tile's weights for each row of a block, with the factor each row's output so far
/// takes first.
struct Weights<'a, const QB: usize> {
    weights: &'a [[f32; KEY_TILE]; QB],
    corrections: &'a [f32; QB],
    first_key: usize,
    /// Keys of the tile (the block's longest row's).
    count: usize,
}

/// `out = out·correction + Σ_k weight[k]·V[k]` for every row of a block, keys in
/// order, [`OUT_ROWS`] rows of lanes of the output at a time in registers; the values
/// past the last whole row of lanes one by one, in the same order.
///
/// # Safety
/// The CPU runs `L`'s instructions.
#[inline(always)]
unsafe fn accumulate_block<L: Lanes, const QB: usize>(
    rows: &mut [QueryRow<'_>; QB],
    tile: &Weights<'_, QB>,
    values: &Rows<'_>,
) {
    let dim = values.dim;
    let mut first = 0;
    while first + LANES <= dim {
        let whole = (dim - first) / LANES;
        // SAFETY: `first + rows · LANES ≤ dim`; the caller's contract.
        unsafe {
            first += match whole {
                1 => accumulate::<L, QB, 1>(rows, tile, values, first),
                2 => accumulate::<L, QB, 2>(rows, tile, values, first),
                3 => accumulate::<L, QB, 3>(rows, tile, values, first),
                _ => accumulate::<L, QB, OUT_ROWS>(rows, tile, values, first),
            };
        }
    }
    for (row, (weights, &correction)) in rows
        .iter_mut()
        .zip(tile.weights.iter().zip(tile.corrections))
    {
        for index in first..dim {
            let mut value = row.out[index] * correction;
            for (offset, &weight) in weights[..tile.count].iter().enumerate() {
                value = weight.mul_add(values.row(tile.first_key + offset)[index], value);
            }
            row.out[index] = value;
        }
    }
}

/// `ROWS · LANES` output values from `first` of [`accumulate_block`]; returns how many.
///
/// # Safety
/// `first + ROWS · LANES ≤ dim`; the CPU runs `L`'s instructions.
#[inline(always)]
unsafe fn accumulate<L: Lanes, const QB: usize, const ROWS: usize>(
    rows: &mut [QueryRow<'_>; QB],
    tile: &Weights<'_, QB>,
    values: &Rows<'_>,
    first: usize,
) -> usize {
    // SAFETY (whole body): every load and store reads `LANES` values from
    // `first + row · LANES` of a row of `dim` (the caller's contract).
    unsafe {
        // Loops, not `array::from_fn`: see `tile_scores`.
        let mut sums = [[L::zero(); ROWS]; QB];
        for (sum, (row, &correction)) in sums.iter_mut().zip(rows.iter().zip(tile.corrections)) {
            let (out, correction) = (row.out.as_ptr().add(first), L::splat(correction));
            for (index, sum) in sum.iter_mut().enumerate() {
                *sum = L::mul(L::load(out.add(index * LANES)), correction);
            }
        }
        let mut value_rows = [L::zero(); ROWS];
        for offset in 0..tile.count {
            let value_row = values.row(tile.first_key + offset).as_ptr().add(first);
            for (index, value) in value_rows.iter_mut().enumerate() {
                *value = L::load(value_row.add(index * LANES));
            }
            for (sum, weights) in sums.iter_mut().zip(tile.weights) {
                let weight = L::splat(weights[offset]);
                for (sum, value) in sum.iter_mut().zip(&value_rows) {
                    *sum = L::fma(weight, *value, *sum);
                }
            }
        }
        for (sum, row) in sums.iter().zip(rows.iter_mut()) {
            for (index, sum) in sum.iter().enumerate() {
                sum.store(row.out.as_mut_ptr().add(first + index * LANES));
            }
        }
    }
    ROWS * LANES
}
