//! Softmax attention on the GPU: per head, one strided-batched cuBLAS product over the
//! sequences for the scores, one masked-softmax kernel over every score row, and per
//! head one strided-batched product for `P·V`, written into the head's columns of the
//! output. Grouped-query heads read their shared key/value head's columns.
//!
//! Scores are `[heads][sequences][length][length]` f32 in a scratch buffer that grows
//! to the largest call: 12 heads × 32 sequences × 128² is 25 MiB.

use stagehand_actors::DevicePtr;

use super::blas::Gemm;
use super::compute::CudaCompute;
use super::tensor::{check_attention, same_shape, shape_error, u32_bytes, CudaTensor};
use crate::compute::{Attention, ComputeError, Mask};

/// The scores' bytes for `shape`, or a shape error when they cannot be addressed.
fn scores_bytes(shape: &Attention<'_>) -> Result<u64, ComputeError> {
    (shape.heads as u64)
        .checked_mul(shape.sequences as u64)
        .and_then(|count| count.checked_mul(shape.sequence_length as u64))
        .and_then(|count| count.checked_mul(shape.sequence_length as u64))
        .and_then(|count| count.checked_mul(4))
        .ok_or_else(|| {
            shape_error(
                "attention",
                format!(
                    "{} heads × {} sequences of {} are too many scores",
                    shape.heads, shape.sequences, shape.sequence_length
                ),
            )
        })
}

/// Where an attention's operands lie: q, k, v, the output and the scores scratch.
#[derive(Debug, Clone, Copy)]
pub(super) struct Operands {
    pub q: DevicePtr,
    pub k: DevicePtr,
    pub v: DevicePtr,
    pub out: DevicePtr,
    pub scores: DevicePtr,
}

/// The products of one attention, per head: the scores (`scale·Q·Kᵀ` over every
/// sequence) and `P·V` into the head's columns of the output. The masked softmax runs
/// between the two lists.
pub(super) fn plan(shape: &Attention<'_>, at: Operands) -> (Vec<Gemm>, Vec<Gemm>) {
    let (sequences, length, dim) = (shape.sequences, shape.sequence_length, shape.head_dim);
    let q_stride = shape.heads * dim;
    let kv_stride = shape.kv_heads * dim;
    let group = shape.heads / shape.kv_heads.max(1);
    let head_scores = (sequences * length * length) as u64 * 4;
    let column = |base: DevicePtr, head: usize| base.offset((head * dim) as u64 * 4);
    let scores = (0..shape.heads)
        .map(|head| Gemm {
            m: length,
            n: length,
            k: dim,
            a: column(at.q, head),
            lda: q_stride,
            b: column(at.k, head / group),
            ldb: kv_stride,
            b_transposed: true,
            c: at.scores.offset(head as u64 * head_scores),
            ldc: length,
            alpha: shape.scale,
            beta: 0.0,
            batch: sequences,
            stride_a: length * q_stride,
            stride_b: length * kv_stride,
            stride_c: length * length,
        })
        .collect();
    let mix = (0..shape.heads)
        .map(|head| Gemm {
            m: length,
            n: dim,
            k: length,
            a: at.scores.offset(head as u64 * head_scores),
            lda: length,
            b: column(at.v, head / group),
            ldb: kv_stride,
            b_transposed: false,
            c: column(at.out, head),
            ldc: q_stride,
            alpha: 1.0,
            beta: 0.0,
            batch: sequences,
            stride_a: length * length,
            stride_b: length * kv_stride,
            stride_c: length * q_stride,
        })
        .collect();
    (scores, mix)
}

pub(super) fn attention(
    compute: &CudaCompute,
    q: &CudaTensor,
    k: &CudaTensor,
    v: &CudaTensor,
    shape: &Attention<'_>,
    out: &mut CudaTensor,
) -> Result<(), ComputeError> {
    check_attention(
        shape,
        (q.rows(), q.cols()),
        (k.rows(), k.cols()),
        (v.rows(), v.cols()),
    )?;
    same_shape("attention output", q, out)?;
    let bytes = scores_bytes(shape)?;
    if shape.sequences == 0 || shape.sequence_length == 0 || shape.head_dim == 0 {
        return Ok(());
    }
    let lengths = match shape.mask {
        Mask::Padding(lengths) => Some(u32_bytes(lengths.iter().map(|&length| length as u32))),
        Mask::Causal => None,
    };
    compute.queue(|| {
        let scores =
            compute
                .scores
                .borrow_mut()
                .at_least(&compute.stream, &compute.footprint, bytes)?;
        let lengths = match &lengths {
            Some(lengths) => compute.upload(lengths)?,
            None => DevicePtr(0),
        };
        let operands = Operands {
            q: q.ptr(),
            k: k.ptr(),
            v: v.ptr(),
            out: out.ptr(),
            scores,
        };
        let (score_products, mix_products) = plan(shape, operands);
        for gemm in &score_products {
            // SAFETY: each head's columns of q and k for every sequence lie inside the
            // tensors (checked shapes); the scores scratch holds every head's block.
            unsafe { compute.blas().gemm(gemm) }?;
        }
        // SAFETY: the scratch holds heads × sequences × length² f32; the lengths (one
        // per sequence, each in 1..=length, checked) were just uploaded.
        unsafe {
            compute.kernels.masked_softmax(
                scores,
                lengths,
                shape.heads,
                shape.sequences,
                shape.sequence_length,
                shape.sequence_length,
                0,
                matches!(shape.mask, Mask::Causal),
            )
        }?;
        for gemm in &mix_products {
            // SAFETY: as above; out is borrowed mutably, so it aliases neither the
            // scores nor v, and each head writes only its own columns.
            unsafe { compute.blas().gemm(gemm) }?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::blas::emulate;

    fn values(count: usize, seed: u64) -> Vec<f32> {
        let mut state = seed | 1;
        (0..count)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The masked softmax kernel's definition on host rows.
    fn softmax_rows(scores: &mut [f32], shape: &Attention<'_>) {
        let length = shape.sequence_length;
        for (row, values) in scores.chunks_exact_mut(length).enumerate() {
            let (query, sequence) = (row % length, (row / length) % shape.sequences);
            let visible = match shape.mask {
                Mask::Padding(lengths) => lengths[sequence],
                Mask::Causal => query + 1,
            };
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
    }

    /// Attention the obvious way, one query at a time.
    fn naive(q: &[f32], k: &[f32], v: &[f32], shape: &Attention<'_>) -> Vec<f32> {
        let (length, dim) = (shape.sequence_length, shape.head_dim);
        let (q_stride, kv_stride) = (shape.heads * dim, shape.kv_heads * dim);
        let mut out = vec![0.0; q.len()];
        for sequence in 0..shape.sequences {
            for head in 0..shape.heads {
                let kv_head = head / (shape.heads / shape.kv_heads);
                for i in 0..length {
                    let visible = match shape.mask {
                        Mask::Padding(lengths) => lengths[sequence],
                        Mask::Causal => i + 1,
                    };
                    let row = sequence * length + i;
                    let scores: Vec<f32> = (0..visible)
                        .map(|j| {
                            let key = sequence * length + j;
                            (0..dim)
                                .map(|d| {
                                    q[row * q_stride + head * dim + d]
                                        * k[key * kv_stride + kv_head * dim + d]
                                })
                                .sum::<f32>()
                                * shape.scale
                        })
                        .collect();
                    let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
                    let total: f32 = weights.iter().sum();
                    for d in 0..dim {
                        out[row * q_stride + head * dim + d] = (0..visible)
                            .map(|j| {
                                weights[j] / total
                                    * v[(sequence * length + j) * kv_stride + kv_head * dim + d]
                            })
                            .sum();
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_planned_products_and_softmax_compute_attention() {
        // Proves the per-head strided-batched products (offsets, leading dimensions,
        // strides, grouped-query head sharing) around the masked softmax compute
        // attention, through cuBLAS's column-major definition on host memory.
        let short = [5usize, 3];
        let mixed = [7usize, 1, 4];
        for (sequences, length, heads, kv_heads, dim, mask) in [
            (2, 5, 4, 4, 8, Mask::Padding(&short)),
            (2, 5, 4, 2, 8, Mask::Causal),
            (2, 5, 6, 1, 8, Mask::Padding(&short)),
            (3, 7, 4, 2, 3, Mask::Padding(&mixed)),
        ] {
            let shape = Attention {
                sequences,
                sequence_length: length,
                heads,
                kv_heads,
                head_dim: dim,
                scale: 1.0 / (dim as f32).sqrt(),
                mask,
            };
            let rows = sequences * length;
            let q = values(rows * heads * dim, 1);
            let k = values(rows * kv_heads * dim, 2);
            let v = values(rows * kv_heads * dim, 3);
            let mut scores = vec![f32::NAN; heads * sequences * length * length];
            let mut out = vec![f32::NAN; rows * heads * dim];
            let scores_at = scores.as_mut_ptr();
            let operands = Operands {
                q: DevicePtr(q.as_ptr() as u64),
                k: DevicePtr(k.as_ptr() as u64),
                v: DevicePtr(v.as_ptr() as u64),
                out: DevicePtr(out.as_mut_ptr() as u64),
                scores: DevicePtr(scores_at as u64),
            };
            let (score_products, mix_products) = plan(&shape, operands);
            assert_eq!(score_products.len(), heads);
            for gemm in &score_products {
                // SAFETY: host arrays of the sizes the plan implies.
                unsafe { emulate(gemm) };
            }
            // SAFETY: the scores array, written above through the same pointer.
            softmax_rows(
                unsafe { std::slice::from_raw_parts_mut(scores_at, scores.len()) },
                &shape,
            );
            for gemm in &mix_products {
                // SAFETY: as above.
                unsafe { emulate(gemm) };
            }
            let expected = naive(&q, &k, &v, &shape);
            for (index, (got, expected)) in out.iter().zip(&expected).enumerate() {
                // Written as a negated `<` so a NaN fails too.
                let close = (got - expected).abs() < 1e-5;
                assert!(
                    close,
                    "{heads}/{kv_heads} {mask:?} [{index}]: {got} vs {expected}"
                );
            }
        }
    }

    #[test]
    fn scores_are_sized_per_head_and_sequence_and_overflow_is_an_error() {
        // Proves the scratch covers heads × sequences × length² f32 and that an
        // impossible size is a shape error, not a wrapped allocation.
        let lengths = [4usize];
        let shape = Attention {
            sequences: 1,
            sequence_length: 4,
            heads: 3,
            kv_heads: 1,
            head_dim: 2,
            scale: 1.0,
            mask: Mask::Padding(&lengths),
        };
        assert_eq!(scores_bytes(&shape).unwrap(), 3 * 16 * 4);
        let huge = Attention {
            sequences: usize::MAX / 2,
            sequence_length: usize::MAX / 2,
            ..shape
        };
        assert!(scores_bytes(&huge).is_err());
    }
}
