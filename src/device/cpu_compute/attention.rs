//! Softmax attention without the score matrix: each query row walks its visible keys
//! in tiles of [`KEY_TILE`], keeping a running maximum, a running sum and its output
//! row (the online softmax of FlashAttention), so no more than one tile of scores
//! exists at a time, whatever the sequence length.
//!
//! Work is split by key/value head (of one sequence): a task transposes its K head
//! once, then serves every query head that shares it (grouped-query attention). Each
//! output row is computed by one task in one fixed order — tiles in key order — so
//! the bits depend on neither which thread runs a task nor how many threads there are. A score sums over the head dimension in order, an
//! output value over the keys in order; a tile's maximum and weight sum are taken in
//! sixteen lanes, then over the lanes in order. The loops are plain element-wise f32
//! arithmetic (no fused multiply-add, no reassociation), written so that independent
//! chains of adds sit in registers side by side; the compiler's vectorisation does not
//! change them; the softmax's `exp` is the vectorisable one of [`super::elementwise`].

use crate::compute::{Attention, CachedAttention, Mask};

use super::elementwise::exp;
use super::pool::{share, Pool, SharedOut};
use super::simd::Isa;

/// Keys per tile of scores.
pub(super) const KEY_TILE: usize = 64;

/// The lanes a tile's maximum and sum are taken in (a multiple of every vector width).
const LANES: usize = 16;

/// Rows of [`LANES`] output values a query accumulates at once (128 values: a whole
/// head of every model we run).
const OUT_ROWS: usize = 8;

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

/// [`one_task`] compiled for the widest vectors this CPU has: the same arithmetic
/// (element-wise, unfused), so the same bits, in fewer instructions.
///
/// # Safety
/// As [`one_task`].
unsafe fn dispatch(heads: &Heads<'_>, task: usize, buffer: &mut Vec<f32>, output: SharedOut) {
    match Isa::detect() {
        // SAFETY: AVX-512F was detected; the rest is the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { one_task_avx512(heads, task, buffer, output) },
        // SAFETY: AVX2 was detected; the rest is the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { one_task_avx2(heads, task, buffer, output) },
        // SAFETY: the caller's contract.
        _ => unsafe { one_task(heads, task, buffer, output) },
    }
}

/// # Safety
/// As [`one_task`], on a CPU with AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn one_task_avx512(
    heads: &Heads<'_>,
    task: usize,
    buffer: &mut Vec<f32>,
    output: SharedOut,
) {
    // SAFETY: the caller's contract.
    unsafe { one_task(heads, task, buffer, output) }
}

/// # Safety
/// As [`one_task`], on a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn one_task_avx2(heads: &Heads<'_>, task: usize, buffer: &mut Vec<f32>, output: SharedOut) {
    // SAFETY: the caller's contract.
    unsafe { one_task(heads, task, buffer, output) }
}

/// Every query head of one K/V head of one sequence.
///
/// # Safety
/// `output` is the attention's output, and no other thread writes this task's part.
#[inline(always)]
unsafe fn one_task(heads: &Heads<'_>, task: usize, buffer: &mut Vec<f32>, output: SharedOut) {
    let (sequence, kv_head) = (task / heads.kv_heads, task % heads.kv_heads);
    let dim = heads.head_dim;
    let q_stride = heads.heads * dim;
    let kv_stride = heads.kv_heads * dim;
    let group = heads.heads / heads.kv_heads;
    // Kᵀ of this head, `[dim, padded]` with zero columns up to a whole tile, so a
    // tile's scores are one unit-stride loop per dimension.
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
    let keys_t = &buffer[..];
    let values = Rows {
        values: &heads.v[first_key * kv_stride + kv_head * dim..],
        stride: kv_stride,
        dim,
    };
    for head in kv_head * group..(kv_head + 1) * group {
        for query in 0..heads.queries {
            let row = sequence * heads.queries + query;
            let q = &heads.q[row * q_stride + head * dim..][..dim];
            let visible = (heads.visible)(sequence, query).min(heads.keys);
            // SAFETY: row `row`, columns of head `head`: inside the output (shapes
            // checked by the port) and this task's alone (the caller's contract).
            let target = unsafe { output.range(row * q_stride + head * dim, dim) };
            query_row(q, (keys_t, padded), &values, (visible, heads.scale), target);
        }
    }
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

/// One query's output: `softmax(scale·q·Kᵀ)·V` over its first `visible` keys, with
/// `keys_t` the head's Kᵀ, `padded` keys to a row.
#[inline(always)]
fn query_row(
    q: &[f32],
    (keys_t, padded): (&[f32], usize),
    values: &Rows<'_>,
    (visible, scale): (usize, f32),
    out: &mut [f32],
) {
    let mut maximum = f32::NEG_INFINITY;
    let mut total = 0.0f32;
    let out_len = out.len();
    out.iter_mut().for_each(|value| *value = 0.0);
    let mut tile = 0;
    while tile < visible {
        let count = KEY_TILE.min(visible - tile);
        // The tile's scores in rows of sixteen lanes, only the rows holding visible
        // keys (independent chains of adds in registers), each summed over d in order.
        let mut scores = [0f32; KEY_TILE];
        match count.div_ceil(LANES) {
            1 => tile_scores::<1>(q, &keys_t[tile..], padded, &mut scores),
            2 => tile_scores::<2>(q, &keys_t[tile..], padded, &mut scores),
            3 => tile_scores::<3>(q, &keys_t[tile..], padded, &mut scores),
            _ => tile_scores::<4>(q, &keys_t[tile..], padded, &mut scores),
        }
        // Scaled, with the keys past `count` at −∞ (weight 0), so the maximum and the
        // weights run over whole 16-lane rows: a maximum is the same in any order, and
        // the weights' sum is taken lane by lane, then over the lanes in order — a
        // fixed order, so the same bits every time.
        for (index, score) in scores.iter_mut().enumerate() {
            *score = if index < count {
                *score * scale
            } else {
                f32::NEG_INFINITY
            };
        }
        let mut lane_maximum = [f32::NEG_INFINITY; LANES];
        for row in scores.chunks_exact(LANES) {
            for (lane, score) in lane_maximum.iter_mut().zip(row) {
                *lane = lane.max(*score);
            }
        }
        let tile_maximum = lane_maximum
            .iter()
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let next_maximum = maximum.max(tile_maximum);
        // The first tile rescales nothing: exp(−∞) = 0 times a zero row.
        let correction = exp(maximum - next_maximum);
        out.iter_mut().for_each(|value| *value *= correction);
        let mut weights = [0f32; KEY_TILE];
        for (weight, score) in weights.iter_mut().zip(scores.iter()) {
            *weight = exp(score - next_maximum);
        }
        let mut lane_total = [0f32; LANES];
        for row in weights.chunks_exact(LANES) {
            for (lane, weight) in lane_total.iter_mut().zip(row) {
                *lane += weight;
            }
        }
        total = total * correction + lane_total.iter().sum::<f32>();
        // The output in rows of sixteen lanes, up to [`OUT_ROWS`] rows at once (as many
        // independent chains of adds in registers), each value summed over the tile's
        // keys in order.
        let mut first = 0;
        while first < out_len {
            let width = (OUT_ROWS * LANES).min(out_len - first);
            accumulate_rows(
                &mut out[first..first + width],
                &weights[..count],
                |offset| &values.row(tile + offset)[first..first + width],
            );
            first += width;
        }
        maximum = next_maximum;
        tile += count;
    }
    if total > 0.0 {
        let inverse = 1.0 / total;
        out.iter_mut().for_each(|value| *value *= inverse);
    }
}

/// `out[i] += Σ_k weights[k]·row(k)[i]`, keys in order, for `out` of at most
/// `OUT_ROWS · LANES` values: whole rows of lanes in registers (a count known at
/// compile time, so they stay there), the rest one by one.
#[inline(always)]
fn accumulate_rows<'v>(out: &mut [f32], weights: &[f32], row: impl Fn(usize) -> &'v [f32]) {
    let whole = match out.len() / LANES {
        8 => accumulate::<8, _>(out, weights, &row),
        7 => accumulate::<7, _>(out, weights, &row),
        6 => accumulate::<6, _>(out, weights, &row),
        5 => accumulate::<5, _>(out, weights, &row),
        4 => accumulate::<4, _>(out, weights, &row),
        3 => accumulate::<3, _>(out, weights, &row),
        2 => accumulate::<2, _>(out, weights, &row),
        1 => accumulate::<1, _>(out, weights, &row),
        _ => 0,
    };
    for (index, value) in out.iter_mut().enumerate().skip(whole) {
        for (offset, &weight) in weights.iter().enumerate() {
            *value += weight * row(offset)[index];
        }
    }
}

/// The first `ROWS · LANES` values of [`accumulate_rows`]; returns how many.
#[inline(always)]
fn accumulate<'v, const ROWS: usize, R: Fn(usize) -> &'v [f32]>(
    out: &mut [f32],
    weights: &[f32],
    row: &R,
) -> usize {
    let mut sums = [[0f32; LANES]; ROWS];
    for (sum, values) in sums.iter_mut().zip(out.chunks_exact(LANES)) {
        sum.copy_from_slice(values);
    }
    for (offset, &weight) in weights.iter().enumerate() {
        let values = &row(offset)[..ROWS * LANES];
        for (sum, values) in sums.iter_mut().zip(values.chunks_exact(LANES)) {
            for (sum, value) in sum.iter_mut().zip(values) {
                *sum += weight * value;
            }
        }
    }
    for (sum, target) in sums.iter().zip(out.chunks_exact_mut(LANES)) {
        target.copy_from_slice(sum);
    }
    ROWS * LANES
}

/// The first `ROWS · LANES` scores of a tile: `q · Kᵀ[:, key]`, summed over d in order,
/// `keys_t` starting at the tile's first key with rows of `padded` keys.
#[inline(always)]
fn tile_scores<const ROWS: usize>(
    q: &[f32],
    keys_t: &[f32],
    padded: usize,
    scores: &mut [f32; KEY_TILE],
) {
    let mut sums = [[0f32; LANES]; ROWS];
    for (d, &q_d) in q.iter().enumerate() {
        let column = &keys_t[d * padded..][..ROWS * LANES];
        for (row, keys) in sums.iter_mut().zip(column.chunks_exact(LANES)) {
            for (sum, key) in row.iter_mut().zip(keys) {
                *sum += q_d * key;
            }
        }
    }
    for (chunk, row) in scores.chunks_exact_mut(LANES).zip(&sums) {
        chunk.copy_from_slice(row);
    }
}
