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
//!
//! Heads of 256 values and more under a padding mask (a VAE's mid-block attention)
//! take `wide` instead: query blocks over the threads, each two `gemm` products.

mod block;
#[cfg(test)]
mod tests;
mod wide;

pub(super) use wide::biased;

use crate::compute::{Attention, CachedAttention, Mask};

use block::{run_block, Keys, QueryRow, Rows};

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
    if wide::takes(shape) {
        return wide::attention(pool, scratch, (q, k, v), shape, out);
    }
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
                4 => run_block::<L, 4>(std::array::from_fn(row), &keys),
                3 => run_block::<L, 3>(std::array::from_fn(row), &keys),
                2 => run_block::<L, 2>(std::array::from_fn(row), &keys),
                _ => run_block::<L, 1>(std::array::from_fn(row), &keys),
            }
        }
        first += count;
    }
}
