//! The CPU adapter's products against weights: the linear layer (few rows through
//! [`gemv`], many through [`gemm`]), LoRA low-rank and merge, embedding lookups and
//! row-scaled sums.

use crate::compute::{shapes, ComputeDtype, ComputeError, DType, LowRank, Weight};

use super::{
    amx, as_f32, gemm, gemv, grouped, kernels, vector, weight_bytes, weight_scale, CpuCompute,
    CpuTensor,
};

/// A weight whose values a plain widening does not give (U4's are per group), for
/// the operations that read a weight whole.
fn refuse_grouped(what: &str, weight: &Weight<'_>) -> Result<(), ComputeError> {
    if weight.dtype() == DType::U4 {
        return Err(ComputeError::Shape(format!(
            "{what} of a 4-bit group-quantized (awq_w4a16) weight is not implemented; dequantize the checkpoint"
        )));
    }
    Ok(())
}

pub(super) fn linear(
    compute: &CpuCompute,
    x: &CpuTensor,
    weight: &Weight<'_>,
    bias: Option<&Weight<'_>>,
    y: &mut CpuTensor,
) -> Result<(), ComputeError> {
    shapes::linear(x.dims(), weight, y.dims())?;
    let (out, inner) = (weight.rows(), weight.cols());
    let mut small = compute.cast_small.borrow_mut();
    let bias = match bias {
        Some(bias) => Some(vector("linear bias", bias, out, &mut small)?),
        None => None,
    };
    if weight.dtype() == DType::U4 {
        return grouped::linear(compute, x, weight, bias, y);
    }
    let (stored, dtype, scale) = (weight_bytes(weight), weight.dtype(), weight_scale(weight));
    if x.rows <= compute.gemv_rows() {
        let product = gemv::Gemv {
            x: &x.data,
            rows: x.rows,
            inner,
            weight: stored,
            dtype,
            scale,
            bias,
            out,
        };
        gemv::gemv(&compute.pool, &product, &mut y.data);
    } else {
        let bf16 = compute.compute_dtype == ComputeDtype::Bf16;
        let product = gemm::Gemm {
            x: &x.data,
            rows: x.rows,
            inner,
            weight: stored,
            dtype,
            scale,
            bias,
            out,
            bf16_operands: bf16,
        };
        if bf16 && compute.tiles {
            let mut packed = compute.tile_rows.borrow_mut();
            amx::gemm(
                &compute.pool,
                &compute.tile_panels,
                &mut packed,
                &product,
                &mut y.data,
            );
        } else {
            compute.f32_gemm(&product, &mut y.data);
        }
    }
    Ok(())
}

pub(super) fn low_rank_add(
    compute: &CpuCompute,
    x: &CpuTensor,
    factors: &LowRank<'_>,
    scale: f32,
    scratch: &mut CpuTensor,
    y: &mut CpuTensor,
) -> Result<(), ComputeError> {
    shapes::low_rank(x.dims(), factors, y.dims())?;
    let (rank, input, out) = (
        factors.rank(),
        factors.in_features(),
        factors.out_features(),
    );
    if scratch.dims() != (x.rows, rank) {
        *scratch = crate::compute::Compute::tensor(compute, x.rows, rank)?;
    }
    let mut cast = compute.cast.borrow_mut();
    let mut small = compute.cast_small.borrow_mut();
    let a = as_f32(factors.a(), &mut cast);
    let b = as_f32(factors.b(), &mut small);
    kernels::low_rank_add(
        &x.data,
        x.rows,
        input,
        a,
        b,
        rank,
        out,
        scale,
        &mut scratch.data,
        &mut y.data,
    );
    Ok(())
}

pub(super) fn merge_low_rank(
    compute: &CpuCompute,
    weight: &Weight<'_>,
    factors: &LowRank<'_>,
    scale: f32,
) -> Result<(), ComputeError> {
    shapes::merge(weight, factors)?;
    refuse_grouped("merging a LoRA into a resident block", weight)?;
    let mut small = compute.cast_small.borrow_mut();
    let mut widened = Vec::new();
    let a = as_f32(factors.a(), &mut widened);
    let b = as_f32(factors.b(), &mut small);
    let mut cast = compute.cast.borrow_mut();
    cast.clear();
    cast.resize(weight.elements(), 0.0);
    weight.dtype().widen(weight_bytes(weight), &mut cast);
    // A scaled weight is merged in its real values and stored back in its scale.
    let stored_scale = weight_scale(weight).unwrap_or(1.0);
    cast.iter_mut().for_each(|value| *value *= stored_scale);
    kernels::merge(
        &mut cast,
        a,
        b,
        factors.rank(),
        weight.rows(),
        weight.cols(),
        scale,
    );
    cast.iter_mut().for_each(|value| *value /= stored_scale);
    // SAFETY: the caller holds the block alone (the port's contract for merges), so
    // nothing else reads or writes this range while we write it.
    let target =
        unsafe { std::slice::from_raw_parts_mut(weight.ptr().0 as *mut u8, weight.bytes()) };
    weight.dtype().narrow(&cast, target);
    Ok(())
}

pub(super) fn add_scaled_rows(
    acc: &mut CpuTensor,
    y: &CpuTensor,
    scales: &[f32],
) -> Result<(), ComputeError> {
    shapes::scaled_rows(acc.dims(), y.dims(), scales.len())?;
    for ((out, values), scale) in acc
        .data
        .chunks_exact_mut(acc.cols)
        .zip(y.data.chunks_exact(y.cols))
        .zip(scales)
    {
        out.iter_mut()
            .zip(values)
            .for_each(|(out, value)| *out += scale * value);
    }
    Ok(())
}

pub(super) fn gather_add(
    compute: &CpuCompute,
    table: &Weight<'_>,
    rows: &[u32],
    out: &mut CpuTensor,
) -> Result<(), ComputeError> {
    shapes::gather(table, rows, out.dims())?;
    refuse_grouped("an embedding lookup", table)?;
    let bytes = weight_bytes(table);
    let row_bytes = table.cols() * table.dtype().size_bytes();
    let scale = weight_scale(table);
    let mut small = compute.cast_small.borrow_mut();
    small.clear();
    small.resize(table.cols(), 0.0);
    for (&id, out_row) in rows.iter().zip(out.data.chunks_exact_mut(out.cols)) {
        let id = id as usize;
        table
            .dtype()
            .widen(&bytes[id * row_bytes..(id + 1) * row_bytes], &mut small);
        if let Some(scale) = scale {
            small.iter_mut().for_each(|value| *value *= scale);
        }
        out_row
            .iter_mut()
            .zip(small.iter())
            .for_each(|(out, value)| *out += value);
    }
    Ok(())
}
