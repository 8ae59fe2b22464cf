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
    let (sequences, length, dim) = (shape.sequences, shape.sequence_length, shape.head_dim);
    if sequences == 0 || length == 0 || dim == 0 {
        return Ok(());
    }
    let q_stride = shape.heads * dim;
    let kv_stride = shape.kv_heads * dim;
    let group = shape.heads / shape.kv_heads;
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
        let head_scores = (sequences * length * length) as u64 * 4;
        for head in 0..shape.heads {
            let kv_head = head / group;
            // scores[head][s] = scale · Q[s, head] · K[s, kv_head]ᵀ for every sequence s.
            let gemm = Gemm {
                m: length,
                n: length,
                k: dim,
                a: q.ptr().offset((head * dim) as u64 * 4),
                lda: q_stride,
                b: k.ptr().offset((kv_head * dim) as u64 * 4),
                ldb: kv_stride,
                b_transposed: true,
                c: scores.offset(head as u64 * head_scores),
                ldc: length,
                alpha: shape.scale,
                beta: 0.0,
                batch: sequences,
                stride_a: length * q_stride,
                stride_b: length * kv_stride,
                stride_c: length * length,
            };
            // SAFETY: the head's columns of q and k for every sequence lie inside the
            // tensors (checked shapes); the scores scratch holds every head's block.
            unsafe { compute.blas().gemm(&gemm) }?;
        }
        // SAFETY: the scratch holds heads × sequences × length² f32; the lengths (one
        // per sequence, each in 1..=length, checked) were just uploaded.
        unsafe {
            compute.kernels.masked_softmax(
                scores,
                lengths,
                shape.heads,
                sequences,
                length,
                matches!(shape.mask, Mask::Causal),
            )
        }?;
        for head in 0..shape.heads {
            let kv_head = head / group;
            // out[s, head] = P[head][s] · V[s, kv_head] for every sequence s.
            let gemm = Gemm {
                m: length,
                n: dim,
                k: length,
                a: scores.offset(head as u64 * head_scores),
                lda: length,
                b: v.ptr().offset((kv_head * dim) as u64 * 4),
                ldb: kv_stride,
                b_transposed: false,
                c: out.ptr().offset((head * dim) as u64 * 4),
                ldc: q_stride,
                alpha: 1.0,
                beta: 0.0,
                batch: sequences,
                stride_a: length * length,
                stride_b: length * kv_stride,
                stride_c: length * q_stride,
            };
            // SAFETY: as above; out is borrowed mutably, so it aliases neither the
            // scores nor v, and each head writes only its own columns.
            unsafe { compute.blas().gemm(&gemm) }?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
