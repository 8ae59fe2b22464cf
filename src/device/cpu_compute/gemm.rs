//! The many-rows product (prefill, encoders, batched decode): `y ← x·Wᵀ (+ bias)`
//! through the `gemm` crate's f32 kernels (the crate candle's CPU backend uses;
//! AVX-512 and AVX2/FMA microkernels chosen at run time).
//!
//! The product is tiled by shape alone: the inner dimension into [`slices`] of at
//! most [`SLICE_MAX`] values (one slice up to [`ONE_SLICE_MAX`]), the output features
//! into column blocks of [`block_width`]. `x` is copied once into its slices, each
//! contiguous (unless it is one slice: it is then read in place); a thread
//! widens one (block, slice) tile of the weight at a time into its panel — whatever
//! the dtype, so the panel is also contiguous — and adds that tile's product into its
//! block of `y` with one single-threaded `gemm` call, slices in order. Contiguous
//! operands of at most [`SLICE_MAX`] columns are what keeps `gemm` at full speed: the
//! same call reading the rows of a 2048-wide `x` in place ran at about half the rate
//! here (their 8 KiB stride maps every row to the same cache sets). The blocks are
//! split over the compute threads; a tile's call sees the same shape and values
//! whichever thread runs it and however many there are, so the bits of `y` depend
//! on neither.

use crate::compute::DType;

use super::pool::{share, Pool, SharedOut};
use super::simd::{self, Format, Isa, Lanes, Portable};

/// Floats in one thread's widened panel: 1 MiB, one tile, read by `gemm` from cache.
const PANEL_FLOATS: usize = 256 * 1024;

/// The longest slice of the inner dimension one `gemm` call takes, when there are
/// several.
const SLICE_MAX: usize = 768;

/// Inner dimensions up to this are one slice: `x` is then read in place and an f32
/// weight's rows are the panel, no copy of either. Its 6 KiB row stride reads at full
/// rate (MiniLM's 1536 → 384 product: 5.5 → 4.5 ms against two packed slices), where
/// the 8 KiB of a 2048-wide row did not.
const ONE_SLICE_MAX: usize = 1536;

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
    /// Round `x` and an f32/f16 weight to bf16 before multiplying (`compute_dtype =
    /// bf16` where the CPU has no AMX tiles): the operands of the tiles' products.
    pub bf16_operands: bool,
}

impl Gemm<'_> {
    /// The operands and `y` have the product's shapes.
    pub(super) fn assert_shapes(&self, y: &[f32]) {
        assert_eq!(self.x.len(), self.rows * self.inner);
        assert_eq!(
            self.weight.len(),
            self.out * self.inner * self.dtype.size_bytes()
        );
        assert_eq!(y.len(), self.rows * self.out);
        assert!(self.bias.is_none_or(|bias| bias.len() == self.out));
    }
}

/// The slices of an inner dimension: `(first, length)` each, equal but for rounding.
pub(super) fn slices(inner: usize) -> impl Iterator<Item = (usize, usize)> {
    let count = if one_slice(inner) {
        1
    } else {
        inner.div_ceil(SLICE_MAX)
    };
    let length = inner.div_ceil(count).div_ceil(WIDTH_GRANULE) * WIDTH_GRANULE;
    (0..count)
        .map(move |index| {
            (
                index * length,
                length.min(inner.saturating_sub(index * length)),
            )
        })
        .filter(|&(_, length)| length > 0)
}

/// Whether the inner dimension is one slice (`x` and an f32 weight then in place).
fn one_slice(inner: usize) -> bool {
    inner <= ONE_SLICE_MAX
}

/// The width of the column blocks of a product with `out` features of `inner`
/// values: as wide as a panel of one slice allows, narrow enough for [`MIN_BLOCKS`].
pub(super) fn block_width(out: usize, inner: usize) -> usize {
    let slice = slices(inner).map(|(_, length)| length).max().unwrap_or(1);
    let by_panel = (PANEL_FLOATS / slice) / WIDTH_GRANULE * WIDTH_GRANULE;
    let by_blocks = out.div_ceil(MIN_BLOCKS).div_ceil(WIDTH_GRANULE) * WIDTH_GRANULE;
    by_panel.min(by_blocks).max(WIDTH_GRANULE)
}

/// `y ← x·Wᵀ·scale (+ bias)`. `panels` holds one reusable buffer per pool thread;
/// `packed` takes the slices of `x` (reused between products).
pub(super) fn gemm(
    pool: &Pool,
    panels: &[std::sync::Mutex<Vec<f32>>],
    packed: &mut Vec<f32>,
    product: &Gemm<'_>,
    y: &mut [f32],
) {
    product.assert_shapes(y);
    assert!(panels.len() >= pool.threads());
    // x in its slices, one after the other, each `[rows, length]` — x itself when it
    // is one slice (it is then already that layout).
    let packed: &[f32] = if one_slice(product.inner) && !product.bf16_operands {
        product.x
    } else {
        packed.clear();
        for (first, length) in slices(product.inner) {
            for row in product.x.chunks_exact(product.inner) {
                packed.extend_from_slice(&row[first..first + length]);
            }
        }
        if product.bf16_operands {
            packed.iter_mut().for_each(|value| *value = to_bf16(*value));
        }
        packed
    };
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
            unsafe { one_block(product, packed, (column, columns), &mut panel, output) };
        }
    });
}

/// The block of output columns `column..column + columns`, slice by slice.
///
/// # Safety
/// `output` is `y` of `product`, and no other thread writes these columns meanwhile.
unsafe fn one_block(
    product: &Gemm<'_>,
    packed: &[f32],
    (column, columns): (usize, usize),
    panel: &mut Vec<f32>,
    output: SharedOut,
) {
    let (inner, out, rows) = (product.inner, product.out, product.rows);
    // SAFETY: the columns are inside `y` (`column + columns <= out`).
    let destination = unsafe { output.pointer().add(column) };
    let element = product.dtype.size_bytes();
    for (first, length) in slices(inner) {
        let panel: &[f32] = match in_place(product, column, columns) {
            Some(rows) => rows,
            None => {
                panel.clear();
                panel.resize(columns * length, 0.0);
                for (feature, target) in panel.chunks_exact_mut(length).enumerate() {
                    let start = ((column + feature) * inner + first) * element;
                    widen(
                        product.dtype,
                        &product.weight[start..start + length * element],
                        target,
                    );
                }
                if product.bf16_operands && matches!(product.dtype, DType::F32 | DType::F16) {
                    panel.iter_mut().for_each(|value| *value = to_bf16(*value));
                }
                panel
            }
        };
        let x_slice = &packed[first * rows..(first + length) * rows];
        let accumulate = first > 0;
        // `gemm` computes dst ← alpha·dst + beta·lhs·rhs with dst `[m, n]`. Here dst is
        // the block transposed (`[columns, rows]`: row stride 1, column stride `out`),
        // lhs the panel `[columns, length]` and rhs the slice of `x` transposed
        // (`[length, rows]`); this orientation ran fastest for Llama's shapes.
        // SAFETY: every pointer covers its matrix with the strides given: the panel
        // `columns × length`, the slice `rows × length`, both contiguous, and the block
        // of y that is this thread's; dst aliases neither input.
        unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                columns,
                rows,
                length,
                destination,
                out as isize,
                1,
                accumulate,
                panel.as_ptr(),
                1,
                length as isize,
                x_slice.as_ptr(),
                length as isize,
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
    if let Some(bias) = product.bias {
        // SAFETY: rows `0..rows`, columns `column..column + columns` of `y`: this
        // block's, written by this thread only (the caller's contract).
        unsafe { add_to_rows(&bias[column..column + columns], destination, rows, out) };
    }
}

/// The weight rows `column..column + columns` as the panel itself, when the weight is
/// f32 (aligned, unscaled, not rounded) and its inner dimension one slice: the rows
/// are then already the panel's contiguous `[columns, inner]` layout.
fn in_place<'w>(product: &Gemm<'w>, column: usize, columns: usize) -> Option<&'w [f32]> {
    let usable = product.dtype == DType::F32 && one_slice(product.inner) && !product.bf16_operands;
    if !usable {
        return None;
    }
    let start = column * product.inner * 4;
    let bytes = &product.weight[start..start + columns * product.inner * 4];
    // SAFETY: every bit pattern is a valid f32; `align_to` yields the aligned middle,
    // used only when it is the whole range.
    let (head, floats, tail) = unsafe { bytes.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(floats)
}

/// `value` rounded to the nearest bf16 (ties to even), as an f32.
pub(super) fn to_bf16(value: f32) -> f32 {
    half::bf16::from_f32(value).to_f32()
}

/// Widens `stored` (elements of `dtype`) into `out`, sixteen at a time in registers;
/// exact, so the panel holds the weight's values bit for bit.
pub(super) fn widen(dtype: DType, stored: &[u8], out: &mut [f32]) {
    assert_eq!(stored.len(), dtype.bytes(out.len()));
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
        DType::I8 => on!(simd::I8),
        // Codes alone (U4's scales are per group): `grouped` widens U4 weights.
        DType::U4 => dtype.widen(stored, out),
    }
}

/// Adds `bias` to the start of each of `rows` rows, `stride` floats apart, from
/// `destination`: a block's bias, added once its product is in the block — then in
/// the core's cache. Written into the block before the product instead (and the
/// product added to it), the bias took the block's first touch of memory: 5 % of an
/// encoder batch, where the product's own stores hide those misses behind its
/// multiply-adds.
///
/// # Safety
/// Every row `destination + r·stride .. + bias.len()`, `r < rows`, is writable and
/// written by no other thread meanwhile.
pub(super) unsafe fn add_to_rows(bias: &[f32], destination: *mut f32, rows: usize, stride: usize) {
    match Isa::detect() {
        // SAFETY: the lanes were chosen by `Isa::detect`; rows are the caller's contract.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { add_to_rows_avx512(bias, destination, rows, stride) },
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { add_to_rows_avx2(bias, destination, rows, stride) },
        // SAFETY: portable lanes run anywhere; rows are the caller's contract.
        _ => unsafe { add_to_rows_on::<Portable>(bias, destination, rows, stride) },
    }
}

/// # Safety
/// AVX-512F is present; [`add_to_rows`]' contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn add_to_rows_avx512(bias: &[f32], destination: *mut f32, rows: usize, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe { add_to_rows_on::<simd::Avx512>(bias, destination, rows, stride) }
}

/// # Safety
/// AVX2 is present; [`add_to_rows`]' contract.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_to_rows_avx2(bias: &[f32], destination: *mut f32, rows: usize, stride: usize) {
    // SAFETY: the caller's contract.
    unsafe { add_to_rows_on::<simd::Avx2>(bias, destination, rows, stride) }
}

/// # Safety
/// The CPU runs `L`; [`add_to_rows`]' contract.
#[inline(always)]
unsafe fn add_to_rows_on<L: Lanes>(
    bias: &[f32],
    destination: *mut f32,
    rows: usize,
    stride: usize,
) {
    let chunks = bias.len() / 16;
    for row in 0..rows {
        // SAFETY: row `row` of the caller's block; chunk `c` covers columns
        // `16c .. 16c + 16` of `bias.len()`, the tail the rest one at a time.
        unsafe {
            let target = destination.add(row * stride);
            for chunk in 0..chunks {
                let at = target.add(chunk * 16);
                L::add(L::load(at), L::load(bias.as_ptr().add(chunk * 16))).store(at);
            }
            for (column, &value) in bias.iter().enumerate().skip(chunks * 16) {
                *target.add(column) += value;
            }
        }
    }
}

/// # Safety
/// AVX-512F, AVX2 and F16C are present; `stored` holds `out.len()` elements of `F`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
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
            let longest_slice = slices(inner).map(|(_, length)| length).max().unwrap_or(1);
            assert_eq!(width % WIDTH_GRANULE, 0);
            assert!(
                width * longest_slice <= PANEL_FLOATS || width == WIDTH_GRANULE,
                "{out}×{inner}"
            );
            if out >= MIN_BLOCKS * WIDTH_GRANULE {
                assert!(out.div_ceil(width) >= MIN_BLOCKS, "{out}×{inner}");
            }
        }
    }

    #[test]
    fn slices_cover_the_inner_dimension_in_order() {
        // Proves the slices are contiguous, in order, cover it, and are one slice up
        // to ONE_SLICE_MAX, at most SLICE_MAX long beyond.
        for inner in [1, 16, 37, 384, 768, 769, 1536, 1537, 2048, 8192] {
            let mut next = 0;
            let longest = if inner <= ONE_SLICE_MAX {
                inner
            } else {
                SLICE_MAX
            };
            for (first, length) in slices(inner) {
                assert_eq!(first, next);
                assert!(length > 0 && length <= longest, "{inner}");
                next = first + length;
            }
            assert_eq!(next, inner);
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
            DType::I8,
        ] {
            let values: Vec<f32> = match dtype {
                DType::I8 => (0..37).map(|i| (i * 7) as f32 - 128.0).collect(),
                _ => values.clone(),
            };
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
