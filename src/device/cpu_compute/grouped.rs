//! Products of group-quantised 4-bit weights (ComfyUI's `awq_w4a16`, see
//! [`crate::compute::quant`]): the weight stays in its stored bytes in the device tier
//! (half a byte a value, plus its groups' scales and zeros) and is dequantised one
//! cache-sized panel of output rows at a time into f32, which the f32 product
//! ([`super::gemv`] for few rows, [`super::gemm`] for many) then reads. The panels
//! split the output features by shape alone, and each panel's product is the f32
//! product of those rows, so the bits depend neither on the thread count nor on
//! whether the block was streamed.

use crate::compute::quant::{dequantize_row, Groups};
use crate::compute::{ComputeError, DType, Weight};

use super::pool::{share, SharedOut};
use super::{gemm, gemv, weight_bytes, CpuCompute, CpuTensor};

/// Floats in one dequantised panel: 1 MiB, as a product's widened panel.
const PANEL_FLOATS: usize = 256 * 1024;

/// `y ← x·Wᵀ (+ bias)` for a U4 weight with `bias` already widened.
pub(super) fn linear(
    compute: &CpuCompute,
    x: &CpuTensor,
    weight: &Weight<'_>,
    bias: Option<&[f32]>,
    y: &mut CpuTensor,
) -> Result<(), ComputeError> {
    let groups = weight.groups().ok_or_else(|| {
        ComputeError::Shape("a 4-bit weight came without its group scales and zeros".into())
    })?;
    let (out, inner) = (weight.rows(), weight.cols());
    let extent = groups.extent_bytes(out, inner).ok_or_else(|| {
        ComputeError::Shape(format!(
            "groups of {} do not divide a [{out}, {inner}] weight's rows",
            groups.size
        ))
    })? as usize;
    // SAFETY: `BlockView::weight` checked both ranges lie inside the held block, live
    // host memory of this device for the weight's lifetime.
    let (scales, zeros) = unsafe {
        (
            std::slice::from_raw_parts(groups.scale as *const u8, extent),
            std::slice::from_raw_parts(groups.zero as *const u8, extent),
        )
    };
    let codes = weight_bytes(weight);
    let chunk = (PANEL_FLOATS / inner.max(1)).clamp(16, out.max(16));
    let mut cast = compute.cast.borrow_mut();
    cast.clear();
    cast.resize(chunk * inner + x.rows * chunk, 0.0);
    let (panel, partial) = cast.split_at_mut(chunk * inner);
    let mut first = 0;
    while first < out {
        let count = chunk.min(out - first);
        let tables = Tables {
            codes,
            scales,
            zeros,
            groups,
            inner,
        };
        dequantize_panel(compute, &tables, first, &mut panel[..count * inner]);
        let partial = &mut partial[..x.rows * count];
        product(
            compute,
            x,
            &panel[..count * inner],
            bias.map(|bias| &bias[first..first + count]),
            (count, partial),
        );
        for (row, values) in partial.chunks_exact(count).enumerate() {
            y.data[row * out + first..row * out + first + count].copy_from_slice(values);
        }
        first += count;
    }
    Ok(())
}

/// A U4 weight's stored tables, as host bytes.
struct Tables<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    zeros: &'a [u8],
    groups: Groups,
    inner: usize,
}

/// Rows `first ..` of the weight (as many as `panel` holds) dequantised into `panel`,
/// the rows shared over the compute threads.
fn dequantize_panel(compute: &CpuCompute, tables: &Tables<'_>, first: usize, panel: &mut [f32]) {
    let inner = tables.inner;
    let rows = panel.len() / inner;
    let threads = if panel.len() < 1 << 14 {
        1
    } else {
        compute.pool.threads().min(rows)
    };
    let output = SharedOut::new(panel);
    let part = |index: usize| {
        let (start, end) = share(rows, threads, index, 1);
        let count = tables.groups.count(inner);
        let (mut scales, mut zeros) = (vec![0f32; count], vec![0f32; count]);
        for row in start..end {
            group_values(tables, tables.scales, first + row, &mut scales);
            group_values(tables, tables.zeros, first + row, &mut zeros);
            let codes = &tables.codes[(first + row) * inner / 2..(first + row + 1) * inner / 2];
            // SAFETY: row `row` of the panel, `inner` floats inside it, written by
            // this part alone (`share` ranges never overlap).
            let out =
                unsafe { std::slice::from_raw_parts_mut(output.pointer().add(row * inner), inner) };
            dequantize_row(codes, &scales, &zeros, tables.groups.size, out);
        }
    };
    if threads <= 1 {
        part(0);
    } else {
        compute.pool.run(&|index| {
            if index < threads {
                part(index);
            }
        });
    }
}

/// The scale (or zero) of each group of weight row `row`: column `row` of the
/// `[groups, stride]` table.
fn group_values(tables: &Tables<'_>, table: &[u8], row: usize, out: &mut [f32]) {
    let dtype = tables.groups.dtype;
    let size = dtype.size_bytes();
    for (group, value) in out.iter_mut().enumerate() {
        let at = (group * tables.groups.stride + row) * size;
        dtype.widen(&table[at..at + size], std::slice::from_mut(value));
    }
}

/// `partial ← x·panelᵀ (+ bias)`, the panel `[out, inner]` f32 and `partial`
/// `[x rows, out]`.
fn product(
    compute: &CpuCompute,
    x: &CpuTensor,
    panel: &[f32],
    bias: Option<&[f32]>,
    (out, partial): (usize, &mut [f32]),
) {
    // SAFETY: any f32 slice is readable as its bytes (little-endian, as the F32
    // format reads them; the stagehand CPU targets are little-endian).
    let weight =
        unsafe { std::slice::from_raw_parts(panel.as_ptr().cast::<u8>(), panel.len() * 4) };
    if x.rows <= compute.gemv_rows() {
        let product = gemv::Gemv {
            x: &x.data,
            rows: x.rows,
            inner: x.cols,
            weight,
            dtype: DType::F32,
            scale: None,
            bias,
            out,
        };
        gemv::gemv(&compute.pool, &product, partial);
    } else {
        let product = gemm::Gemm {
            x: &x.data,
            rows: x.rows,
            inner: x.cols,
            weight,
            dtype: DType::F32,
            scale: None,
            bias,
            out,
            // Dequantized groups multiply on the f32 kernels, operands rounded.
            bf16_operands: compute.compute_dtype() == crate::compute::ComputeDtype::Bf16,
        };
        compute.f32_gemm(&product, partial);
    }
}
