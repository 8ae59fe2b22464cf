//! The port's products against weights: `linear` (with its bias), the low-rank LoRA
//! update of a streamed weight, and the merge of a LoRA into a resident weight. Each
//! casts the weights it reads to f32 in the cast buffer (`cast.rs`) and runs cuBLAS on
//! the compute stream.

use super::blas::Gemm;
use super::cast::readable_in_place;
use super::compute::CudaCompute;
use super::kernels::GEMV_ROWS_MAX;
use super::tensor::CudaTensor;
use crate::compute::shapes;
use crate::compute::{Compute, ComputeError, LowRank, Weight};

pub(super) fn linear(
    compute: &CudaCompute,
    x: &CudaTensor,
    weight: &Weight<'_>,
    bias: Option<&Weight<'_>>,
    y: &mut CudaTensor,
) -> Result<(), ComputeError> {
    let (out_features, in_features) = (weight.rows(), weight.cols());
    shapes::linear((x.rows, x.cols), weight, (y.rows, y.cols))?;
    if let Some(bias) = bias {
        shapes::vector("linear bias", bias, out_features)?;
    }
    if x.rows <= GEMV_ROWS_MAX && !readable_in_place(weight) {
        return gemv(compute, x, weight, bias, y);
    }
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let weights = cast.f32_of(&compute.kernels, weight)?;
        let beta = match bias {
            Some(bias) => {
                let bias = cast.f32_of(&compute.kernels, bias)?;
                // SAFETY: y is [rows, out] and the bias `out` f32, both alive
                // until the stream passes (the tensor's drop waits; the bias is in
                // the cast region or a held block).
                unsafe {
                    compute
                        .kernels
                        .fill_rows(y.ptr(), bias, y.rows, out_features)
                }?;
                1.0
            }
            None => 0.0,
        };
        let gemm = Gemm::dense(
            x.rows,
            out_features,
            in_features,
            x.ptr(),
            weights,
            true,
            y.ptr(),
            1.0,
            beta,
        );
        // SAFETY: x [rows, in], W [out, in] as f32, y [rows, out], checked above;
        // y is borrowed mutably so it aliases neither input.
        unsafe { compute.blas().gemm(&gemm) }
    })
}

/// A decode product (at most [`GEMV_ROWS_MAX`] rows) of a weight that would need a
/// widened copy for cuBLAS (f16, bf16, FP8 and its scale, unaligned f32): read once
/// in its storage dtype by `stagehand_gemv`, as the CPU backend's decode products do.
/// Only the bias (a vector) goes through the cast buffer.
fn gemv(
    compute: &CudaCompute,
    x: &CudaTensor,
    weight: &Weight<'_>,
    bias: Option<&Weight<'_>>,
    y: &mut CudaTensor,
) -> Result<(), ComputeError> {
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let bias = bias
            .map(|bias| cast.f32_of(&compute.kernels, bias))
            .transpose()?;
        // SAFETY: x [rows ≤ 8, in] f32, W [out, in] in its dtype inside a block the
        // caller holds, the bias `out` f32 (cast region or held block), y [rows, out]
        // borrowed mutably so it aliases no input; all alive until the stream passes.
        unsafe {
            compute.kernels.gemv(
                x.ptr(),
                x.rows,
                weight.ptr(),
                weight.dtype(),
                weight.scale(),
                bias,
                y.ptr(),
                weight.rows(),
                weight.cols(),
            )
        }
    })
}

pub(super) fn low_rank_add(
    compute: &CudaCompute,
    x: &CudaTensor,
    factors: &LowRank<'_>,
    scale: f32,
    scratch: &mut CudaTensor,
    y: &mut CudaTensor,
) -> Result<(), ComputeError> {
    let (rank, input, out) = (
        factors.rank(),
        factors.in_features(),
        factors.out_features(),
    );
    shapes::low_rank((x.rows, x.cols), factors, (y.rows, y.cols))?;
    if scratch.rows != x.rows || scratch.cols != rank {
        *scratch = compute.tensor(x.rows, rank)?;
    }
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let a = cast.f32_of(&compute.kernels, factors.a())?;
        let b = cast.f32_of(&compute.kernels, factors.b())?;
        let down = Gemm::dense(
            x.rows,
            rank,
            input,
            x.ptr(),
            a,
            true,
            scratch.ptr(),
            1.0,
            0.0,
        );
        let up = Gemm::dense(
            x.rows,
            out,
            rank,
            scratch.ptr(),
            b,
            true,
            y.ptr(),
            scale,
            1.0,
        );
        // SAFETY: x [rows, in], A [rank, in], scratch [rows, rank], B [out, rank],
        // y [rows, out], all checked above and alive until the stream passes;
        // scratch and y are borrowed mutably, so no output aliases an input.
        unsafe {
            compute.blas().gemm(&down)?;
            compute.blas().gemm(&up)
        }
    })
}

pub(super) fn merge_low_rank(
    compute: &CudaCompute,
    weight: &Weight<'_>,
    factors: &LowRank<'_>,
    scale: f32,
) -> Result<(), ComputeError> {
    shapes::merge(weight, factors)?;
    let (out, input, rank) = (weight.rows(), weight.cols(), factors.rank());
    let count = weight.elements() as u64;
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let a = cast.f32_of(&compute.kernels, factors.a())?;
        let b = cast.f32_of(&compute.kernels, factors.b())?;
        // An aligned f32 weight takes the update where it lies; any other is
        // widened, updated in the cast buffer and narrowed back, rounded to
        // nearest even.
        let in_place = readable_in_place(weight);
        let target = if in_place {
            weight.ptr()
        } else {
            let region = cast.region(count)?;
            // SAFETY: the weight is in a block the caller holds alone (the
            // port's merge contract); the region holds `count` f32.
            unsafe {
                compute
                    .kernels
                    .widen(weight.ptr(), weight.dtype(), weight.scale(), region, count)
            }?;
            region
        };
        let update = Gemm::dense(out, input, rank, b, a, false, target, scale, 1.0);
        // SAFETY: B [out, rank], A [rank, in], target [out, in] f32, checked
        // above; the target is the held weight or its own cast region, distinct
        // from the factors' memory.
        unsafe { compute.blas().gemm(&update) }?;
        if !in_place {
            // SAFETY: as above; the weight's bytes are written by this one kernel.
            unsafe {
                compute
                    .kernels
                    .narrow(target, weight.ptr(), weight.dtype(), weight.scale(), count)
            }?;
        }
        Ok(())
    })
}
