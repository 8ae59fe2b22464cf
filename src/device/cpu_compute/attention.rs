//! Softmax attention without the score matrix: each query row walks its visible keys
//! in tiles of [`KEY_TILE`], keeping a running maximum, a running sum and its output
//! row (the online softmax of FlashAttention), so no more than one tile of scores
//! exists at a time, whatever the sequence length.
//!
//! Work is split by key/value head (of one sequence): a task transposes its K head
//! once, then serves every query head that shares it (grouped-query attention), in
//! blocks of [`BLOCK`] query rows that share each load of a Kᵀ or V row — the heads of
//! one query, or neighbouring queries — so the products run as independent chains of
//! fused multiply-adds in the [`Lanes`] registers. Each output row is computed by one
//! task in one fixed order — tiles in key order, a score over the head dimension in
//! order, an output value over the keys in order, one rounding per multiply-add; a
//! tile's maximum and weight sum in sixteen lanes, then over the lanes in order — and
//! a row's bits do not depend on the other rows of its block, on which thread runs it,
//! on how many threads there are, or on the instruction set. The softmax's `exp` is
//! the vectorisable one of [`super::elementwise`].

use crate::compute::{Attention, CachedAttention, Mask};

use super::elementwise::exp;
use super::pool::{share, Pool, SharedOut};
#[cfg(target_arch = "x86_64")]
use super::simd::{Avx2, Avx512};
use super::simd::{Isa, Lanes, Portable};

/// Keys per tile of scores.
pub(super) const KEY_TILE: usize = 64;

/// The lanes a tile's maximum and sum are taken in (a multiple of every vector width).
const LANES: usize = 16;

/// Query rows that share each load of a tile's Kᵀ and V rows: with [`OUT_ROWS`], as
/// many independent chains of fused multiply-adds as the registers hold.
const BLOCK: usize = 4;

/// Rows of [`LANES`] output values each query of a block accumulates at once.
const OUT_ROWS: usize = 4;

/// Below this many query·key·dimension products an attention runs on one thread.
const PARALLEL_MIN_WORK: usize = 1 << 15;

/// One attention, whatever its mask: what every task needs to know.
struct Heads<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    scale: f32,
    /// Queries (rows of q) per sequence, and the row of q its first query is.
    queries: usize,
    /// Rows of K/V per sequence (the keys there are to see).
    keys: usize,
    /// How many keys query `i` of sequence `s` sees.
    visible: &'a (dyn Fn(usize, usize) -> usize + Sync),
    sequences: usize,
}

/// `Compute::attention` (see `crate::compute::Attention`).
pub(super) fn attention(
    pool: &Pool,
    scratch: &[std::sync::Mutex<Vec<f32>>],
    (q, k, v): (&[f32], &[f32], &[f32]),
    shape: &Attention<'_>,
    out: &mut [f32],
) {
    let visible = |sequence: usize, query: usize| match shape.mask {
        Mask::Padding(lengths) => lengths[sequence].min(shape.sequence_length),
        Mask::Causal => query + 1,
    };
    let heads = Heads {
        q,
        k,
        v,
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        scale: shape.scale,
        queries: shape.sequence_length,
        keys: shape.sequence_length,
        visible: &visible,
        sequences: shape.sequences,
    };
    run(pool, scratch, &heads, out);
}

/// `Compute::attention_cached`: one sequence, `queries` new rows after `past`.
pub(super) fn attention_cached(
    pool: &Pool,
    scratch: &[std::sync::Mutex<Vec<f32>>],
    (q, k, v): (&[f32], &[f32], &[f32]),
    shape: &CachedAttention,
    out: &mut [f32],
) {
    let visible = |_sequence: usize, query: usize| shape.past + query + 1;
    let heads = Heads {
        q,
        k,
        v,
        heads: shape.heads,
        kv_heads: shape.kv_heads,
        head_dim: shape.head_dim,
        scale: shape.scale,
        queries: shape.queries,
        keys: shape.past + shape.queries,
        visible: &visible,
        sequences: 1,
    };
    run(pool, scratch, &heads, out);
}

/// Splits the (sequence, K/V head) tasks over the threads, in index order.
fn run(pool: &Pool, scratch: &[std::sync::Mutex<Vec<f32>>], heads: &Heads<'_>, out: &mut [f32]) {
    let tasks = heads.sequences * heads.kv_heads;
    let work = heads.sequences * heads.queries * heads.keys * heads.heads * heads.head_dim;
    let threads = if work < PARALLEL_MIN_WORK {
        1
    } else {
        pool.threads().min(tasks)
    };
    let output = SharedOut::new(out);
    let part = |index: usize| {
        let mut buffer = scratch[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (first, end) = share(tasks, threads, index, 1);
        for task in first..end {
            // SAFETY: task `task` writes the output rows of its sequence in the
            // columns of its K/V head's query heads; no two tasks share any.
            unsafe { dispatch(heads, task, &mut buffer, output) };
        }
    };
    if threads == 1 {
        part(0);
    } else {
        pool.run(&|index| {
            if index < threads {
                part(index);
            }
        });
    }
}

/// [`one_task`] on the widest lanes this CPU has: the same arithmetic lane by lane
/// (one rounding per fused multiply-add), so the same bits on every instruction set.
///
/// # Safety
/// As [`one_task`].
unsafe fn dispatch(heads: &Heads<'_>, task: usize, buffer: &mut Vec<f32>, output: SharedOut) {
    match Isa::detect() {
        // SAFETY: AVX-512 was detected; the rest is the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { one_task_avx512(heads, task, buffer, output) },
        // SAFETY: AVX2/FMA was detected; the rest is the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { one_task_avx2(heads, task, buffer, output) },
        // SAFETY: the caller's contract.
        _ => unsafe { one_task::<Portable>(heads, task, buffer, output) },
    }
}

/// # Safety
/// As [`one_task`], on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn one_task_avx512(
    heads: &Heads<'_>,
    task: usize,
    buffer: &mut Vec<f32>,
    output: SharedOut,
) {
    // SAFETY: the caller's contract; the lanes' instruction set is enabled here.
    unsafe { one_task::<Avx512>(heads, task, buffer, output) }
}

/// # Safety
/// As [`one_task`], on a CPU with AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_task_avx2(heads: &Heads<'_>, task: usize, buffer: &mut Vec<f32>, output: SharedOut) {
    // SAFETY: the caller's contract; the lanes' instruction set is enabled here.
    unsafe { one_task::<Avx2>(heads, task, buffer, output) }
}

/// Every query head of one K/V head of one sequence, [`BLOCK`] query rows at a time.
///
/// # Safety
/// `output` is the attention's output, no other thread writes this task's part, and
/// the CPU runs `L`'s instructions.
#[inline(always)]
unsafe fn one_task<L: Lanes>(
    heads: &Heads<'_>,
    task: usize,
    buffer: &mut Vec<f32>,
    output: SharedOut,
) {
    let (sequence, kv_head) = (task / heads.kv_heads, task % heads.kv_heads);
    let dim = heads.head_dim;
    let kv_stride = heads.kv_heads * dim;
    let group = heads.heads / heads.kv_heads;
    // Kᵀ of this head, `[dim, padded]` with zero columns up to a whole tile, so a
    // tile's scores are one unit-stride load per row of lanes and dimension.
    let padded = heads.keys.div_ceil(KEY_TILE) * KEY_TILE;
    buffer.clear();
    buffer.resize(dim * padded, 0.0);
    let first_key = sequence * heads.keys;
    for key in 0..heads.keys {
        let row = &heads.k[(first_key + key) * kv_stride + kv_head * dim..][..dim];
        for (d, value) in row.iter().enumerate() {
            buffer[d * padded + key] = *value;
        }
    }
    let keys = Keys {
        transposed: &buffer[..],
        padded,
        values: Rows {
            values: &heads.v[first_key * kv_stride + kv_head * dim..],
            stride: kv_stride,
            dim,
        },
        scale: heads.scale,
    };
    // Rows in (query, head) order: a block holds the heads of one query (decode: the
    // whole group at once) or neighbouring queries, which see (nearly) as many keys.
    let items = heads.queries * group;
    let mut first = 0;
    while first < items {
        let count = BLOCK.min(items - first);
        let row = |offset: usize| {
            let (query, head) = ((first + offset) / group, (first + offset) % group);
            let head = kv_head * group + head;
            let row = sequence * heads.queries + query;
            let at = row * heads.heads * dim + head * dim;
            let visible = (heads.visible)(sequence, query).min(heads.keys);
            // SAFETY: row `row`, columns of head `head`: inside the output (shapes
            // checked by the port), this task's alone (the caller's contract), and
            // each (query, head) of the block is a different range.
            let target = unsafe { output.range(at, dim) };
            QueryRow {
                q: &heads.q[at..][..dim],
                visible,
                out: target,
            }
        };
        // SAFETY: the caller's contract (the CPU runs `L`).
        unsafe {
            match count {
                4 => block::<L, 4>(std::array::from_fn(row), &keys),
                3 => block::<L, 3>(std::array::from_fn(row), &keys),
                2 => block::<L, 2>(std::array::from_fn(row), &keys),
                _ => block::<L, 1>(std::array::from_fn(row), &keys),
            }
        }
        first += count;
    }
}

/// One K/V head as the blocks read it.
struct Keys<'a> {
    /// Kᵀ, `[dim, padded]`.
    transposed: &'a [f32],
    padded: usize,
    values: Rows<'a>,
    scale: f32,
}

/// The V rows of one head: row `key` is `values[key·stride ..][..dim]`.
struct Rows<'a> {
    values: &'a [f32],
    stride: usize,
    dim: usize,
}

impl Rows<'_> {
    #[inline(always)]
    fn row(&self, key: usize) -> &[f32] {
        &self.values[key * self.stride..][..self.dim]
    }
}

/// One query row of a block: its q, how many keys it sees, its output.
struct QueryRow<'a> {
    q: &'a [f32],
    visible: usize,
    out: &'a mut [f32],
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
unsafe fn block<L: Lanes, const QB: usize>(mut rows: [QueryRow<'_>; QB], keys: &Keys<'_>) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention of `heads` on lanes `L`, one task after another on this thread.
    fn attention_on<L: Lanes>(heads: &Heads<'_>) -> Vec<f32> {
        let mut out = vec![0f32; heads.q.len()];
        let output = SharedOut::new(&mut out);
        let mut buffer = Vec::new();
        for task in 0..heads.sequences * heads.kv_heads {
            // SAFETY: one thread writes every task's rows; the lanes are this CPU's
            // (the caller checks `Isa::detect`).
            unsafe { one_task::<L>(heads, task, &mut buffer, output) };
        }
        out
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    fn on_avx512(heads: &Heads<'_>) -> Vec<f32> {
        attention_on::<Avx512>(heads)
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn on_avx2(heads: &Heads<'_>) -> Vec<f32> {
        attention_on::<Avx2>(heads)
    }

    fn seeded(count: usize, seed: u32) -> Vec<f32> {
        let mut state = seed;
        (0..count)
            .map(|_| {
                state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (state >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn every_lane_implementation_gives_the_same_bits() {
        // Proves the fused multiply-adds give one result on the portable, AVX2 and
        // AVX-512 lanes: causal with grouped heads over three key tiles and a head
        // width with a tail past its whole rows of lanes (40), and a padding mask.
        for (dim, keys, causal) in [(40usize, 150usize, true), (32, 23, false)] {
            let (heads_count, kv_heads, sequences) = (4, 2, 2);
            let q = seeded(sequences * keys * heads_count * dim, 1);
            let k = seeded(sequences * keys * kv_heads * dim, 2);
            let v = seeded(sequences * keys * kv_heads * dim, 3);
            let lengths = [keys, keys - 7];
            let visible = |sequence: usize, query: usize| {
                if causal {
                    query + 1
                } else {
                    lengths[sequence]
                }
            };
            let heads = Heads {
                q: &q,
                k: &k,
                v: &v,
                heads: heads_count,
                kv_heads,
                head_dim: dim,
                scale: 0.125,
                queries: keys,
                keys,
                visible: &visible,
                sequences,
            };
            let portable = attention_on::<Portable>(&heads);
            assert!(portable
                .iter()
                .all(|value| value.is_finite() && *value != 0.0));
            #[cfg(target_arch = "x86_64")]
            {
                let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let isa = Isa::detect();
                if isa != Isa::Portable {
                    // SAFETY: AVX2 and FMA were detected.
                    let avx2 = unsafe { on_avx2(&heads) };
                    assert_eq!(bits(&avx2), bits(&portable), "AVX2, dim {dim}");
                }
                if isa == Isa::Avx512 {
                    // SAFETY: AVX-512 was detected.
                    let avx512 = unsafe { on_avx512(&heads) };
                    assert_eq!(bits(&avx512), bits(&portable), "AVX-512, dim {dim}");
                }
            }
        }
    }
}
