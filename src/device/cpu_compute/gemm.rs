//! The many-rows product (prefill, encoders, batched decode): `y ← x·Wᵀ (+ bias)`
//! through the `gemm` crate's f32 kernels (the crate candle's CPU backend uses;
//! AVX-512 and AVX2/FMA microkernels chosen at run time).
//!
//! The output features are cut into column blocks whose width is fixed by the
//! product's shape alone ([`block_width`]); each block is one single-threaded `gemm`
//! call over the whole inner dimension, and the blocks are split over the compute
//! threads. A bf16, f16, FP8 or unaligned f32 weight is widened one block at a time
//! into that thread's panel (a few MiB, reused), never as a whole f32 copy. The
//! `gemm` call for a block sees the same shape and the same values whichever thread
//! runs it and however many there are, so the bits of `y` depend on neither.

use crate::compute::DType;

use super::pool::{share, Pool, SharedOut};
use super::simd::{self, Format, Isa, Lanes, Portable};

/// Floats in one thread's widened panel: 2 MiB, a share of the last-level cache that
/// `gemm`'s own packing then reads from cache, not from memory.
const PANEL_FLOATS: usize = 512 * 1024;

/// Blocks per product, at least, when the output is wide enough: enough to share
/// over the cores of a small machine without one thread getting the whole product.
const MIN_BLOCKS: usize = 8;

/// Block widths are multiples of this (the microkernels' register width).
const WIDTH_GRANULE: usize = 16;

/// One many-rows product.
pub(super) struct Gemm<'a> {
    /// `[rows, inner]`, row-major.
    pub x: &'a [f32],
    pub rows: usize,
    pub inner: usize,
    /// `[out, inner]` in `dtype`, as stored (any alignment).
    pub weight: &'a [u8],
    pub dtype: DType,
    pub scale: Option<f32>,
    pub bias: Option<&'a [f32]>,
    pub out: usize,
}

/// The width of the column blocks of a product with `out` features of `inner`
/// values: as wide as a panel allows, narrow enough for [`MIN_BLOCKS`] blocks.
pub(super) fn block_width(out: usize, inner: usize) -> usize {
    let by_panel = (PANEL_FLOATS / inner.max(1)) / WIDTH_GRANULE * WIDTH_GRANULE;
    let by_blocks = out.div_ceil(MIN_BLOCKS).div_ceil(WIDTH_GRANULE) * WIDTH_GRANULE;
    by_panel.min(by_blocks).max(WIDTH_GRANULE)
}

/// `y ← x·Wᵀ·scale (+ bias)`. `panels` holds one reusable buffer per pool thread.
pub(super) fn gemm(
    pool: &Pool,
    panels: &[std::sync::Mutex<Vec<f32>>],
    product: &Gemm<'_>,
    y: &mut [f32],
) {
    assert_eq!(product.x.len(), product.rows * product.inner);
    assert_eq!(
        product.weight.len(),
        product.out * product.inner * product.dtype.size_bytes()
    );
    assert_eq!(y.len(), product.rows * product.out);
    assert!(product.bias.is_none_or(|bias| bias.len() == product.out));
    assert!(panels.len() >= pool.threads());
    let width = block_width(product.out, product.inner);
    let blocks = product.out.div_ceil(width);
    let threads = pool.threads().min(blocks);
    let output = SharedOut::new(y);
    pool.run(&|index| {
        if index >= threads {
            return;
        }
        let mut panel = panels[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (first, end) = share(blocks, threads, index, 1);
        for block in first..end {
            let column = block * width;
            let columns = width.min(product.out - column);
            // SAFETY: block `block` owns the output columns `column..column + columns`,
            // and each block is run by exactly one thread.
            unsafe { one_block(product, column, columns, &mut panel, output) };
        }
    });
}

/// The block of output columns `column..column + columns`.
///
/// # Safety
/// `output` is `y` of `product`, and no other thread writes these columns meanwhile.
unsafe fn one_block(
    product: &Gemm<'_>,
    column: usize,
    columns: usize,
    panel: &mut Vec<f32>,
    output: SharedOut,
) {
    let inner = product.inner;
    let stored = &product.weight[column * inner * product.dtype.size_bytes()..]
        [..columns * inner * product.dtype.size_bytes()];
    let weights: *const f32 = match in_place(product.dtype, stored) {
        Some(floats) => floats.as_ptr(),
        None => {
            panel.clear();
            panel.resize(columns * inner, 0.0);
            widen(product.dtype, stored, panel);
            panel.as_ptr()
        }
    };
    let out = product.out;
    // SAFETY: the columns are inside `y` (`column + columns <= out`).
    let destination = unsafe { output.pointer().add(column) };
    if let Some(bias) = product.bias {
        for row in 0..product.rows {
            // SAFETY: row `row`, columns `column..column + columns` of `y`: this
            // block's, written by this thread only (the caller's contract).
            let target =
                unsafe { std::slice::from_raw_parts_mut(destination.add(row * out), columns) };
            target.copy_from_slice(&bias[column..column + columns]);
        }
    }
    // `gemm` computes dst ← alpha·dst + beta·lhs·rhs with dst `[m, n]`. Here dst is the
    // block transposed (`[columns, rows]`, so its row stride is 1 and its column
    // stride `out`), lhs the weight block `[columns, inner]` and rhs `xᵀ`
    // (`[inner, rows]`); this orientation ran fastest for Llama's shapes.
    // SAFETY: every pointer covers its matrix with the strides given: the weight
    // block `columns × inner` (contiguous rows), x `rows × inner`, and the block of y
    // that is this thread's; dst aliases neither input.
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            columns,
            product.rows,
            inner,
            destination,
            out as isize,
            1,
            product.bias.is_some(),
            weights,
            1,
            inner as isize,
            product.x.as_ptr(),
            inner as isize,
            1,
            1.0,
            product.scale.unwrap_or(1.0),
            false,
            false,
            false,
            gemm_common::Parallelism::None,
        );
    }
}

/// The weight block as f32 where it already is: unscaled, aligned f32.
fn in_place(dtype: DType, stored: &[u8]) -> Option<&[f32]> {
    if dtype != DType::F32 {
        return None;
    }
    // SAFETY: every bit pattern is a valid f32; only the aligned middle is taken, and
    // only when it is the whole slice.
    let (prefix, floats, suffix) = unsafe { stored.align_to::<f32>() };
    (prefix.is_empty() && suffix.is_empty()).then_some(floats)
}

/// Widens `stored` (elements of `dtype`) into `out`, sixteen at a time in registers;
/// exact, so the panel holds the weight's values bit for bit.
pub(super) fn widen(dtype: DType, stored: &[u8], out: &mut [f32]) {
    assert_eq!(stored.len(), out.len() * dtype.size_bytes());
    macro_rules! on {
        ($format:ty) => {
            match Isa::detect() {
                // SAFETY: the lanes were chosen by `Isa::detect`; lengths asserted above.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { widen_avx512::<$format>(stored, out) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { widen_avx2::<$format>(stored, out) },
                // SAFETY: portable lanes run anywhere; lengths asserted above.
                _ => unsafe { widen_on::<Portable, $format>(stored, out) },
            }
        };
    }
    match dtype {
        DType::F32 => on!(simd::F32),
        DType::F16 => on!(simd::F16),
        DType::Bf16 => on!(simd::Bf16),
        DType::F8E4M3 => on!(simd::E4M3),
        DType::F8E5M2 => on!(simd::E5M2),
    }
}

/// # Safety
/// AVX-512F, AVX2 and F16C are present; `stored` holds `out.len()` elements of `F`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn widen_avx512<F: Format>(stored: &[u8], out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { widen_on::<simd::Avx512, F>(stored, out) }
}

/// # Safety
/// AVX2 and F16C are present; `stored` holds `out.len()` elements of `F`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_avx2<F: Format>(stored: &[u8], out: &mut [f32]) {
    // SAFETY: the caller's contract.
    unsafe { widen_on::<simd::Avx2, F>(stored, out) }
}

/// # Safety
/// The CPU runs `L`; `stored` holds `out.len()` elements of `F`.
#[inline(always)]
unsafe fn widen_on<L: Lanes, F: Format>(stored: &[u8], out: &mut [f32]) {
    let chunks = out.len() / 16;
    let source = stored.as_ptr();
    // SAFETY: chunk `c` reads elements `16c .. 16c + 16` of `stored` and writes the
    // same of `out`, all inside (the caller's contract); the tail reads one at a time.
    unsafe {
        for chunk in 0..chunks {
            L::widen::<F>(source.add(chunk * 16 * F::BYTES))
                .store(out.as_mut_ptr().add(chunk * 16));
        }
        for (index, value) in out.iter_mut().enumerate().skip(chunks * 16) {
            *value = F::scalar(source.add(index * F::BYTES));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_widths_are_fixed_by_shape_and_fit_a_panel() {
        // Proves the block width depends on the shape alone, is a multiple of the
        // granule, fits a panel and cuts a wide output into at least MIN_BLOCKS.
        for (out, inner) in [
            (2048, 2048),
            (8192, 2048),
            (2048, 8192),
            (384, 384),
            (7, 24),
            (128_256, 2048),
        ] {
            let width = block_width(out, inner);
            assert_eq!(width % WIDTH_GRANULE, 0);
            assert!(
                width * inner <= PANEL_FLOATS || width == WIDTH_GRANULE,
                "{out}×{inner}"
            );
            if out >= MIN_BLOCKS * WIDTH_GRANULE {
                assert!(out.div_ceil(width) >= MIN_BLOCKS, "{out}×{inner}");
            }
        }
    }

    #[test]
    fn widening_is_exact_for_every_dtype() {
        // Proves the vector widening of a panel equals the scalar decoder, tails included.
        let values: Vec<f32> = (0..37).map(|i| (i as f32 - 18.0) * 0.173).collect();
        for dtype in [
            DType::F32,
            DType::F16,
            DType::Bf16,
            DType::F8E4M3,
            DType::F8E5M2,
        ] {
            let bytes = dtype.encode(&values);
            let mut out = vec![0.0; values.len()];
            widen(dtype, &bytes, &mut out);
            let expected = dtype.decode(&bytes);
            assert!(
                out.iter()
                    .zip(&expected)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}"
            );
        }
    }
}
