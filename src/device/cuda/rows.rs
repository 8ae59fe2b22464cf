//! The port's row-wise operations: elementwise adds, the MoE row mix, the embedding
//! gather, the norms and GELU, each one NVRTC kernel on the compute stream (per-call
//! host data such as token ids is uploaded in stream order first).

use stagehand_actors::DevicePtr;

use super::compute::CudaCompute;
use super::tensor::{f32_bytes, same_shape, u32_bytes, CudaTensor};
use crate::compute::shapes;
use crate::compute::{ComputeError, Weight};

pub(super) fn add(
    compute: &CudaCompute,
    x: &mut CudaTensor,
    y: &CudaTensor,
) -> Result<(), ComputeError> {
    same_shape("add", x, y)?;
    // SAFETY: two tensors of the same shape (x borrowed mutably, so distinct).
    compute.queue(|| unsafe { compute.kernels.add(x.ptr(), y.ptr(), x.elements() as u64) })
}

pub(super) fn add_scaled_rows(
    compute: &CudaCompute,
    acc: &mut CudaTensor,
    y: &CudaTensor,
    scales: &[f32],
) -> Result<(), ComputeError> {
    shapes::scaled_rows((acc.rows, acc.cols), (y.rows, y.cols), scales.len())?;
    let bytes = f32_bytes(scales);
    compute.queue(|| {
        let scales = compute.upload(&bytes)?;
        // SAFETY: acc and y [rows, cols] (distinct), `rows` scales just uploaded.
        unsafe {
            compute
                .kernels
                .add_scaled_rows(acc.ptr(), y.ptr(), scales, acc.rows, acc.cols)
        }
    })
}

pub(super) fn gather_add(
    compute: &CudaCompute,
    table: &Weight<'_>,
    rows: &[u32],
    out: &mut CudaTensor,
) -> Result<(), ComputeError> {
    shapes::gather(table, rows, (out.rows, out.cols))?;

    let ids = u32_bytes(rows.iter().copied());
    compute.queue(|| {
        let ids = compute.upload(&ids)?;
        // SAFETY: every id was checked to lie in the table, which the caller
        // holds; out is [ids, cols]; the ids were just uploaded.
        unsafe {
            compute.kernels.gather_add(
                table.ptr(),
                table.dtype(),
                table.scale(),
                ids,
                out.ptr(),
                out.rows,
                out.cols,
            )
        }
    })
}

pub(super) fn layer_norm(
    compute: &CudaCompute,
    x: &CudaTensor,
    gamma: &Weight<'_>,
    beta: &Weight<'_>,
    eps: f32,
    y: &mut CudaTensor,
) -> Result<(), ComputeError> {
    same_shape("layer_norm", x, y)?;
    for (what, weight) in [("layer_norm weight", gamma), ("layer_norm bias", beta)] {
        shapes::vector(what, weight, x.cols)?;
    }
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let gamma = cast.f32_of(&compute.kernels, gamma)?;
        let beta = cast.f32_of(&compute.kernels, beta)?;
        // SAFETY: x and y [rows, cols] (distinct), gamma and beta `cols` f32.
        unsafe {
            compute
                .kernels
                .layer_norm(x.ptr(), gamma, beta, eps, y.ptr(), x.rows, x.cols)
        }
    })
}

pub(super) fn rms_norm(
    compute: &CudaCompute,
    x: &CudaTensor,
    gamma: Option<&Weight<'_>>,
    eps: f32,
    y: &mut CudaTensor,
) -> Result<(), ComputeError> {
    same_shape("rms_norm", x, y)?;
    if let Some(gamma) = gamma {
        shapes::vector("rms_norm weight", gamma, x.cols)?;
    }
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let gamma = match gamma {
            Some(gamma) => cast.f32_of(&compute.kernels, gamma)?,
            None => DevicePtr(0),
        };
        // SAFETY: x and y [rows, cols] (distinct), gamma `cols` f32 or null.
        unsafe {
            compute
                .kernels
                .rms_norm(x.ptr(), gamma, eps, y.ptr(), x.rows, x.cols)
        }
    })
}

/// Per-head RMSNorm in place: the rows kernel over `rows · heads` rows of
/// `head_dim`, reading and writing the same buffer (each thread reads its own values
/// before the block's reduction and writes them after it).
pub(super) fn rms_norm_heads(
    compute: &CudaCompute,
    x: &mut CudaTensor,
    heads: usize,
    gamma: &Weight<'_>,
    eps: f32,
) -> Result<(), ComputeError> {
    let head_dim = shapes::norm_heads((x.rows, x.cols), heads, gamma)?;
    compute.queue(|| {
        let mut cast = compute.cast.borrow_mut();
        cast.begin();
        let gamma = cast.f32_of(&compute.kernels, gamma)?;
        // SAFETY: x holds rows · heads rows of head_dim f32, read and written in place
        // (see above); gamma is head_dim f32.
        unsafe {
            compute
                .kernels
                .rms_norm(x.ptr(), gamma, eps, x.ptr(), x.rows * heads, head_dim)
        }
    })
}

pub(super) fn gelu_erf(compute: &CudaCompute, x: &mut CudaTensor) -> Result<(), ComputeError> {
    // SAFETY: the tensor holds `elements` f32.
    compute.queue(|| unsafe { compute.kernels.gelu_erf(x.ptr(), x.elements() as u64) })
}
