//! Attention of a few wide heads over long sequences (a VAE's mid-block: one head of
//! 512 channels over every latent pixel, 16384 of them at 1024²): the tiled kernel's
//! split — one task per K/V head — would run it on one thread, and its per-row
//! products are slow at that width. Here the queries are cut into blocks of
//! [`QUERY_BLOCK`], split over the threads, and each block's scores and output are two
//! `gemm` products: `S = Q·Kᵀ·scale` (`[block, keys]`, a few MiB), a row softmax on
//! the vectorisable `exp`, `O = S·V / Σ`. The blocks and every sum's order are fixed
//! by the shape, so the bits do not depend on the number of threads.

use super::super::elementwise::exp;
use super::super::pool::{share, Pool, SharedOut};
use crate::compute::{Attention, Mask};

/// Queries of one block.
const QUERY_BLOCK: usize = 128;

/// Heads at least this wide take this path (with a padding mask).
pub(super) const MIN_HEAD_DIM: usize = 256;

/// Whether `shape` is one for this path: wide heads, one K/V head per query head, a
/// padding mask.
pub(super) fn takes(shape: &Attention<'_>) -> bool {
    shape.head_dim >= MIN_HEAD_DIM
        && shape.heads == shape.kv_heads
        && matches!(shape.mask, Mask::Padding(_))
}

/// `Compute::attention` for a shape [`takes`] accepts.
pub(super) fn attention(
    pool: &Pool,
    scratch: &[std::sync::Mutex<Vec<f32>>],
    (q, k, v): (&[f32], &[f32], &[f32]),
    shape: &Attention<'_>,
    out: &mut [f32],
) {
    let Mask::Padding(lengths) = shape.mask else {
        return;
    };
    let heads = Blocked {
        sequences: shape.sequences,
        length: shape.sequence_length,
        heads: shape.heads,
        dim: shape.head_dim,
        scale: shape.scale,
        keys: &|sequence| lengths[sequence].min(shape.sequence_length),
        bias: None,
    };
    run(pool, scratch, (q, k, v), &heads, out);
}

/// T5's attention (`Pipeline::attention_biased`) on the same blocked path: the first
/// `keys[s]` keys of sequence `s` visible (every key when `keys` is empty), no
/// scaling, each score offset by `bias[(i·length + j)·heads + head]`.
pub(in super::super) fn biased(
    pool: &Pool,
    scratch: &[std::sync::Mutex<Vec<f32>>],
    (q, k, v): (&[f32], &[f32], &[f32]),
    (bias, keys): (&[f32], &[usize]),
    (sequences, length, heads, dim): (usize, usize, usize, usize),
    out: &mut [f32],
) {
    let blocked = Blocked {
        sequences,
        length,
        heads,
        dim,
        scale: 1.0,
        keys: &|sequence| keys.get(sequence).copied().unwrap_or(length),
        bias: Some(bias),
    };
    run(pool, scratch, (q, k, v), &blocked, out);
}

/// An attention as this path runs it.
struct Blocked<'a> {
    sequences: usize,
    length: usize,
    heads: usize,
    dim: usize,
    scale: f32,
    /// The keys sequence `s` sees.
    keys: &'a (dyn Fn(usize) -> usize + Sync),
    /// T5's `[length·length, heads]` offsets, the same for every sequence.
    bias: Option<&'a [f32]>,
}

/// Splits the (sequence, head, query block) tasks over the threads, in index order.
fn run(
    pool: &Pool,
    scratch: &[std::sync::Mutex<Vec<f32>>],
    (q, k, v): (&[f32], &[f32], &[f32]),
    shape: &Blocked<'_>,
    out: &mut [f32],
) {
    let (length, dim) = (shape.length, shape.dim);
    let width = shape.heads * dim;
    let blocks_per_head = length.div_ceil(QUERY_BLOCK);
    let tasks = shape.sequences * shape.heads * blocks_per_head;
    let threads = pool.threads().min(tasks).max(1);
    let output = SharedOut::new(out);
    pool.run(&|index| {
        if index >= threads {
            return;
        }
        let mut scores = scratch[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (first, end) = share(tasks, threads, index, 1);
        for task in first..end {
            let block = task % blocks_per_head;
            let head = (task / blocks_per_head) % shape.heads;
            let sequence = task / (blocks_per_head * shape.heads);
            let keys = (shape.keys)(sequence).min(length);
            let queries = QUERY_BLOCK.min(length - block * QUERY_BLOCK);
            let row = sequence * length + block * QUERY_BLOCK;
            let column = head * dim;
            scores.clear();
            scores.resize(queries * keys.max(1), 0.0);
            let base = sequence * length * width + column;
            let operands = Operands {
                q: &q[row * width + column..],
                k: &k[base..],
                v: &v[base..],
                width,
            };
            let bias = shape.bias.map(|bias| Offsets {
                bias,
                first_query: block * QUERY_BLOCK,
                length,
                heads: shape.heads,
                head,
            });
            // SAFETY: task (sequence, head, block) alone writes the head's columns of
            // the block's rows; `out` outlives the job.
            let out_rows = unsafe { output.pointer().add(row * width + column) };
            unsafe {
                block_attention(
                    &operands,
                    (queries, keys, dim),
                    (shape.scale, bias),
                    &mut scores,
                    out_rows,
                )
            };
        }
    });
}

/// A block's slice of T5's offsets.
struct Offsets<'a> {
    bias: &'a [f32],
    first_query: usize,
    length: usize,
    heads: usize,
    head: usize,
}

/// One block's operands: its queries' rows, the sequence's keys and values, all with
/// row stride `width`, starting at the head's first column.
struct Operands<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    width: usize,
}

/// `out ← softmax(Q·Kᵀ·scale)·V` for `queries` rows against `keys` keys of `dim`.
///
/// # Safety
/// `out` points at `queries` rows of `dim` values with row stride `operands.width`,
/// written by this thread only; the operands cover their rows.
unsafe fn block_attention(
    operands: &Operands<'_>,
    (queries, keys, dim): (usize, usize, usize),
    (scale, bias): (f32, Option<Offsets<'_>>),
    scores: &mut [f32],
    out: *mut f32,
) {
    let width = operands.width as isize;
    if keys == 0 {
        for query in 0..queries {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::write_bytes(out.add(query * operands.width), 0, dim) };
        }
        return;
    }
    let gemm = gemm_f32::gemm::f32::get_gemm_fn();
    // SAFETY: dst `scores` is `[queries, keys]` row-major; lhs Q `[queries, dim]` with
    // row stride `width`; rhs Kᵀ `[dim, keys]`: element (d, j) is K[j][d].
    unsafe {
        gemm(
            queries,
            keys,
            dim,
            scores.as_mut_ptr(),
            1,
            keys as isize,
            false,
            operands.q.as_ptr(),
            1,
            width,
            operands.k.as_ptr(),
            width,
            1,
            1.0,
            scale,
            false,
            false,
            false,
            gemm_common::Parallelism::None,
        );
    }
    if let Some(offsets) = bias {
        for (query, row) in scores.chunks_exact_mut(keys).enumerate() {
            let at = (offsets.first_query + query) * offsets.length * offsets.heads;
            let line = &offsets.bias[at..at + keys * offsets.heads];
            for (score, pair) in row.iter_mut().zip(line.chunks_exact(offsets.heads)) {
                *score += pair[offsets.head];
            }
        }
    }
    let mut sums = Vec::with_capacity(queries);
    for row in scores.chunks_exact_mut(keys) {
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut sum = 0.0f32;
        for score in row.iter_mut() {
            *score = exp(*score - max);
            sum += *score;
        }
        sums.push(sum);
    }
    // SAFETY: dst is the caller's `[queries, dim]` rows (stride `width`); lhs the
    // weights `[queries, keys]`; rhs V `[keys, dim]` with row stride `width`.
    unsafe {
        gemm(
            queries,
            dim,
            keys,
            out,
            1,
            width,
            false,
            scores.as_ptr(),
            1,
            keys as isize,
            operands.v.as_ptr(),
            1,
            width,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm_common::Parallelism::None,
        );
    }
    for (query, sum) in sums.iter().enumerate() {
        let inverse = 1.0 / sum;
        // SAFETY: the caller's contract: row `query` of the block's output.
        let row = unsafe { std::slice::from_raw_parts_mut(out.add(query * operands.width), dim) };
        row.iter_mut().for_each(|value| *value *= inverse);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t5s_biased_attention_matches_f64_across_query_blocks() {
        // Proves the biased path (two sequences of 200 rows: two query blocks each, 2
        // heads of 8, every score offset by its head's bias, no scaling) against f64,
        // with the same bits on 1 and 2 threads; and with a key mask (the second
        // sequence's last 70 keys padding), every query attends to its visible keys only.
        let (sequences, length, heads, dim) = (2, 200, 2, 8);
        let width = heads * dim;
        let values = |count: usize, seed: u32| -> Vec<f32> {
            (0..count)
                .map(|i| {
                    ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                        / (1 << 24) as f32
                        - 0.5
                })
                .collect()
        };
        let rows = sequences * length * width;
        let (q, k, v) = (values(rows, 4), values(rows, 5), values(rows, 6));
        let bias = values(length * length * heads, 7);
        let run = |threads: usize, keys: &[usize]| {
            let pool = Pool::new(threads);
            let scratch: Vec<_> = (0..threads).map(|_| std::sync::Mutex::default()).collect();
            let mut out = vec![0.0f32; rows];
            biased(
                &pool,
                &scratch,
                (&q, &k, &v),
                (&bias, keys),
                (sequences, length, heads, dim),
                &mut out,
            );
            out
        };
        for keys in [&[][..], &[200, 130][..]] {
            let one = run(1, keys);
            assert_eq!(one, run(2, keys), "the bits do not depend on the threads");
            check_biased(&one, (&q, &k, &v), &bias, keys, (length, heads, dim));
        }
    }

    /// Checks sampled rows of a biased attention's output against f64.
    fn check_biased(
        out: &[f32],
        (q, k, v): (&[f32], &[f32], &[f32]),
        bias: &[f32],
        keys: &[usize],
        (length, heads, dim): (usize, usize, usize),
    ) {
        let width = heads * dim;
        let one = out;
        for (sequence, query, head) in [(0, 0, 0), (0, 199, 1), (1, 128, 0), (1, 150, 1)] {
            let visible = keys.get(sequence).copied().unwrap_or(length);
            let row = |i: usize| sequence * length + i;
            let scores: Vec<f64> = (0..visible)
                .map(|j| {
                    let dot: f64 = (0..dim)
                        .map(|d| {
                            f64::from(q[row(query) * width + head * dim + d])
                                * f64::from(k[row(j) * width + head * dim + d])
                        })
                        .sum();
                    dot + f64::from(bias[(query * length + j) * heads + head])
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..dim {
                let expected: f64 = (0..visible)
                    .map(|j| weights[j] * f64::from(v[row(j) * width + head * dim + d]))
                    .sum::<f64>()
                    / total;
                let got = f64::from(one[row(query) * width + head * dim + d]);
                assert!(
                    (got - expected).abs() < 1e-5,
                    "{sequence} {query} {head} {d}: {got} vs {expected}"
                );
            }
        }
    }

    #[test]
    fn wide_heads_match_an_f64_softmax_attention_on_any_thread_count() {
        // Proves the blocked GEMM path (a 300-row sequence in blocks of 128, one head of
        // 256, a padding length of 290) against f64, and the same bits on 1 and 2 threads.
        let (length, dim, keys) = (300, 256, 290);
        let values = |seed: u32| -> Vec<f32> {
            (0..length * dim)
                .map(|i| {
                    ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 8) as f32
                        / (1 << 24) as f32
                        - 0.5
                })
                .collect()
        };
        let (q, k, v) = (values(1), values(2), values(3));
        let lengths = [keys];
        let shape = Attention {
            sequences: 1,
            sequence_length: length,
            heads: 1,
            kv_heads: 1,
            head_dim: dim,
            scale: 1.0 / (dim as f32).sqrt(),
            mask: Mask::Padding(&lengths),
        };
        assert!(takes(&shape));
        let run = |threads: usize| {
            let pool = Pool::new(threads);
            let scratch: Vec<_> = (0..threads).map(|_| std::sync::Mutex::default()).collect();
            let mut out = vec![0.0f32; length * dim];
            attention(&pool, &scratch, (&q, &k, &v), &shape, &mut out);
            out
        };
        let one = run(1);
        assert_eq!(one, run(2), "the bits do not depend on the threads");
        for query in [0, 127, 128, 299] {
            let scores: Vec<f64> = (0..keys)
                .map(|j| {
                    (0..dim)
                        .map(|d| f64::from(q[query * dim + d]) * f64::from(k[j * dim + d]))
                        .sum::<f64>()
                        / (dim as f64).sqrt()
                })
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in [0, 100, 255] {
                let expected: f64 = (0..keys)
                    .map(|j| weights[j] * f64::from(v[j * dim + d]))
                    .sum::<f64>()
                    / total;
                let got = f64::from(one[query * dim + d]);
                assert!(
                    (got - expected).abs() < 1e-5,
                    "query {query} dim {d}: {got} vs {expected}"
                );
            }
        }
    }
}
