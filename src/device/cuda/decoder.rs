//! The port's decoder operations on the GPU: SwiGLU, the rotary embedding, KV-cache
//! rows (growing a cache, writing new rows into it) and causal attention of new
//! queries over the cache.
//!
//! A cache grows into room it already has: its buffer is reallocated only when the
//! rows outgrow it, by half again, so a cache that grows a row per token reallocates a
//! logarithmic number of times (each reallocation waits for the stream before it
//! frees the old buffer).

use stagehand_actors::DevicePtr;

use super::blas::Gemm;
use super::compute::{compute_error, CudaCompute};
use super::memory::{copy_on_device, zero_on_device, DeviceBuffer};
use super::tensor::{
    check_cached_attention, f32_bytes, same_shape, tensor_bytes, u32_bytes, CudaTensor,
};
use crate::compute::shapes;
use crate::compute::{CachedAttention, ComputeError};

pub(super) fn silu_mul(
    compute: &CudaCompute,
    gate: &mut CudaTensor,
    up: &CudaTensor,
) -> Result<(), ComputeError> {
    same_shape("silu_mul", gate, up)?;
    // SAFETY: two tensors of the same shape (gate borrowed mutably, so distinct).
    compute.queue(|| unsafe {
        compute
            .kernels
            .silu_mul(gate.ptr(), up.ptr(), gate.elements() as u64)
    })
}

pub(super) fn rope(
    compute: &CudaCompute,
    x: &mut CudaTensor,
    heads: usize,
    head_dim: usize,
    positions: &[u32],
    inv_freq: &[f32],
) -> Result<(), ComputeError> {
    shapes::rope(
        (x.rows(), x.cols()),
        heads,
        head_dim,
        positions.len(),
        inv_freq.len(),
    )?;
    // One upload: the positions, then the frequencies on a 16-byte boundary.
    let mut bytes = u32_bytes(positions.iter().copied());
    let frequencies_at = bytes.len().next_multiple_of(16);
    bytes.resize(frequencies_at, 0);
    bytes.extend(f32_bytes(inv_freq));
    compute.queue(|| {
        let uploaded = compute.upload(&bytes)?;
        // SAFETY: x is [rows, heads·head_dim]; one position per row and head_dim / 2
        // frequencies were just uploaded.
        unsafe {
            compute.kernels.rope(
                x.ptr(),
                uploaded,
                uploaded.offset(frequencies_at as u64),
                x.rows(),
                heads,
                head_dim,
            )
        }
    })
}

/// Bytes a cache of `needed` bytes is given when it outgrows `current`.
fn grown_capacity(current: u64, needed: u64) -> u64 {
    needed.max(current.saturating_add(current / 2))
}

pub(super) fn resize_rows(
    compute: &CudaCompute,
    tensor: &mut CudaTensor,
    rows: usize,
) -> Result<(), ComputeError> {
    let needed = tensor_bytes(rows, tensor.cols)?;
    let kept = tensor.value_bytes().min(needed);
    if needed > tensor.buffer.bytes() {
        let capacity = grown_capacity(tensor.buffer.bytes(), needed);
        let buffer = DeviceBuffer::allocate(&compute.stream, &compute.footprint, capacity)
            .map_err(|error| {
                if error.is_out_of_memory() {
                    ComputeError::OutOfMemory(format!(
                        "growing a [{}, {}] cache to {rows} rows does not fit in VRAM",
                        tensor.rows, tensor.cols
                    ))
                } else {
                    compute_error(error)
                }
            })?;
        // SAFETY: both buffers hold at least `kept` bytes and are distinct; the old one
        // is freed (by its drop) only after the stream passed the copy.
        unsafe { copy_on_device(&compute.stream, tensor.ptr(), buffer.ptr(), kept) }
            .map_err(compute_error)?;
        tensor.buffer = buffer;
    }
    // New rows read as zeros, as on the CPU.
    // SAFETY: the buffer holds `needed` bytes; the fill covers the rows past `kept`.
    unsafe { zero_on_device(&compute.stream, tensor.ptr().offset(kept), needed - kept) }
        .map_err(compute_error)?;
    tensor.rows = rows;
    Ok(())
}

pub(super) fn slice_rows(
    compute: &CudaCompute,
    from: &CudaTensor,
    first: usize,
    to: &mut CudaTensor,
) -> Result<(), ComputeError> {
    shapes::slice_rows((from.rows, from.cols), first, (to.rows, to.cols))?;
    let offset = (first * from.cols) as u64 * 4;
    // SAFETY: the rows lie inside `from` (checked) and `to` holds exactly them; `to` is
    // borrowed mutably, so the ranges are distinct.
    unsafe {
        copy_on_device(
            &compute.stream,
            from.ptr().offset(offset),
            to.ptr(),
            to.value_bytes(),
        )
    }
    .map_err(compute_error)
}

pub(super) fn write_rows(
    compute: &CudaCompute,
    cache: &mut CudaTensor,
    at: usize,
    rows: &CudaTensor,
) -> Result<(), ComputeError> {
    shapes::write_rows((cache.rows, cache.cols), at, (rows.rows, rows.cols))?;
    let offset = (at * cache.cols) as u64 * 4;
    // SAFETY: the rows fit in the cache from row `at` (checked); the cache is borrowed
    // mutably, so the two ranges are distinct.
    unsafe {
        copy_on_device(
            &compute.stream,
            rows.ptr(),
            cache.ptr().offset(offset),
            rows.value_bytes(),
        )
    }
    .map_err(compute_error)
}

/// The products of a cached attention, per head: the scores of the new queries
/// against every cached key, and `P·V` into the head's columns of the output.
pub(super) fn cached_plan(
    shape: &CachedAttention,
    q: DevicePtr,
    k_cache: DevicePtr,
    v_cache: DevicePtr,
    out: DevicePtr,
    scores: DevicePtr,
) -> (Vec<Gemm>, Vec<Gemm>) {
    let (queries, keys, dim) = (shape.queries, shape.past + shape.queries, shape.head_dim);
    let q_stride = shape.heads * dim;
    let kv_stride = shape.kv_heads * dim;
    let group = shape.heads / shape.kv_heads.max(1);
    let head_scores = (queries * keys) as u64 * 4;
    let column = |base: DevicePtr, head: usize| base.offset((head * dim) as u64 * 4);
    let product = |head: usize, scores_first: bool| {
        let scores = scores.offset(head as u64 * head_scores);
        if scores_first {
            Gemm {
                lda: q_stride,
                ldb: kv_stride,
                ..Gemm::dense(
                    queries,
                    keys,
                    dim,
                    column(q, head),
                    column(k_cache, head / group),
                    true,
                    scores,
                    shape.scale,
                    0.0,
                )
            }
        } else {
            Gemm {
                ldb: kv_stride,
                ldc: q_stride,
                ..Gemm::dense(
                    queries,
                    dim,
                    keys,
                    scores,
                    column(v_cache, head / group),
                    false,
                    column(out, head),
                    1.0,
                    0.0,
                )
            }
        }
    };
    (
        (0..shape.heads).map(|head| product(head, true)).collect(),
        (0..shape.heads).map(|head| product(head, false)).collect(),
    )
}

pub(super) fn attention_cached(
    compute: &CudaCompute,
    q: &CudaTensor,
    k_cache: &CudaTensor,
    v_cache: &CudaTensor,
    shape: &CachedAttention,
    out: &mut CudaTensor,
) -> Result<(), ComputeError> {
    check_cached_attention(
        shape,
        (q.rows, q.cols),
        (k_cache.rows, k_cache.cols),
        (v_cache.rows, v_cache.cols),
    )?;
    same_shape("attention output", q, out)?;
    let keys = shape.past + shape.queries;
    let bytes = tensor_bytes(shape.heads * shape.queries, keys)?;
    if shape.queries == 0 || shape.head_dim == 0 {
        return Ok(());
    }
    compute.queue(|| {
        let scores =
            compute
                .scores
                .borrow_mut()
                .at_least(&compute.stream, &compute.footprint, bytes)?;
        let (score_products, mix_products) = cached_plan(
            shape,
            q.ptr(),
            k_cache.ptr(),
            v_cache.ptr(),
            out.ptr(),
            scores,
        );
        for gemm in &score_products {
            // SAFETY: the head's columns of q and of the first `keys` cache rows lie
            // inside the tensors (checked shapes); the scratch holds every head's
            // scores.
            unsafe { compute.blas().gemm(gemm) }?;
        }
        // SAFETY: heads × queries rows of `keys` scores; causal, so no lengths.
        unsafe {
            compute.kernels.masked_softmax(
                scores,
                DevicePtr(0),
                shape.heads,
                1,
                shape.queries,
                keys,
                shape.past,
                true,
            )
        }?;
        for gemm in &mix_products {
            // SAFETY: as above; out is borrowed mutably and each head writes only its
            // own columns.
            unsafe { compute.blas().gemm(gemm) }?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::blas::emulate;

    #[test]
    fn a_cache_grows_by_half_again_at_least() {
        // Proves a cache growing a row at a time reallocates geometrically.
        assert_eq!(grown_capacity(0, 64), 64);
        assert_eq!(grown_capacity(1000, 1010), 1500);
        assert_eq!(grown_capacity(1000, 4000), 4000);
        let mut capacity = 0;
        let mut reallocations = 0;
        for row in 1..=4096u64 {
            if row * 64 > capacity {
                capacity = grown_capacity(capacity, row * 64);
                reallocations += 1;
            }
        }
        assert!(reallocations < 25, "{reallocations}");
    }

    fn values(count: usize, seed: u32) -> Vec<f32> {
        (0..count as u32)
            .map(|i| (((i * 37 + seed * 101) % 97) as f32 / 48.0) - 1.0)
            .collect()
    }

    #[test]
    fn the_cached_plan_computes_causal_attention_of_the_new_rows() {
        // Proves the per-head products around the causal softmax (offset by the rows
        // already cached) give, for the new queries, what attention over the whole
        // sequence gives for its last rows, through cuBLAS's column-major definition
        // on host memory; grouped-query heads share their key/value head.
        let (heads, kv_heads, dim, past, queries) = (4, 2, 8, 3, 2);
        let keys = past + queries;
        let (q_cols, kv_cols) = (heads * dim, kv_heads * dim);
        let q = values(queries * q_cols, 1);
        // A cache with two spare rows past the keys, which must not be read.
        let k = values((keys + 2) * kv_cols, 2);
        let v = values((keys + 2) * kv_cols, 3);
        let shape = CachedAttention {
            heads,
            kv_heads,
            head_dim: dim,
            scale: 0.35,
            past,
            queries,
        };
        let mut scores = vec![f32::NAN; heads * queries * keys];
        let mut out = vec![f32::NAN; queries * q_cols];
        let scores_at = scores.as_mut_ptr();
        let host = |values: &[f32]| DevicePtr(values.as_ptr() as u64);
        let (score_products, mix_products) = cached_plan(
            &shape,
            host(&q),
            host(&k),
            host(&v),
            DevicePtr(out.as_mut_ptr() as u64),
            DevicePtr(scores_at as u64),
        );
        for gemm in &score_products {
            // SAFETY: host arrays of the sizes the plan implies.
            unsafe { emulate(gemm) };
        }
        // SAFETY: the scores array, written above through the same pointer.
        let rows = unsafe { std::slice::from_raw_parts_mut(scores_at, scores.len()) };
        for (row, values) in rows.chunks_exact_mut(keys).enumerate() {
            let visible = past + row % queries + 1;
            let top = values[..visible]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = values[..visible].iter().map(|v| (v - top).exp()).sum();
            for (j, value) in values.iter_mut().enumerate() {
                *value = if j < visible {
                    (*value - top).exp() / total
                } else {
                    0.0
                };
            }
        }
        for gemm in &mix_products {
            // SAFETY: as above.
            unsafe { emulate(gemm) };
        }
        for query in 0..queries {
            for head in 0..heads {
                let kv_head = head / (heads / kv_heads);
                let visible = past + query + 1;
                let scores: Vec<f32> = (0..visible)
                    .map(|j| {
                        (0..dim)
                            .map(|d| {
                                q[query * q_cols + head * dim + d]
                                    * k[j * kv_cols + kv_head * dim + d]
                            })
                            .sum::<f32>()
                            * shape.scale
                    })
                    .collect();
                let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f32 = weights.iter().sum();
                for d in 0..dim {
                    let expected: f32 = (0..visible)
                        .map(|j| weights[j] / total * v[j * kv_cols + kv_head * dim + d])
                        .sum();
                    let got = out[query * q_cols + head * dim + d];
                    assert!(
                        (got - expected).abs() < 1e-5,
                        "query {query} head {head}: {got} vs {expected}"
                    );
                }
            }
        }
    }
}
