//! The few-rows product of a decode step: `y ← x·Wᵀ (+ bias)` for up to
//! [`GEMV_ROWS`] rows, reading the weight once, in its storage dtype, widening it in
//! registers ([`super::simd`]). Memory traffic is the weight's own bytes: half of
//! f32's for bf16, a quarter for FP8. Each group of weight rows stays in L1 while
//! every row of `x` passes it, so up to 32 rows this beats widening the weight into
//! panels for the GEMM (`cpu-kernels`: 24 rows × 1024² f32 0.26 ms against 0.60,
//! 32 rows × 2048 → 8192 f32 7.9 ms against 11.0; at 64 rows the GEMM is as fast or
//! faster).
//!
//! The output features are split into one contiguous range per compute thread. The
//! split only decides who computes an element, never how: every `y[r, o]` is one dot
//! product in one fixed order — lane `l` of sixteen sums the elements `i ≡ l (mod 16)`
//! with fused multiply-adds in increasing `i`, the lanes are added by halving
//! (`l + 8`, `+ 4`, `+ 2`, `+ 1`), then the FP8 scale multiplies and the bias adds —
//! so the bits depend on neither the thread count nor the instruction set.

use crate::compute::DType;

use super::dots::{dots, dots_chunked, dots_rows};
use super::pool::{share, Pool, SharedOut};
use super::simd::{self, Format, Isa, Lanes, Portable};

/// Products with at most this many rows take this path (with `compute_dtype = f32`;
/// see `CpuCompute::gemv_rows`).
pub(super) const GEMV_ROWS: usize = 32;

/// The same under `compute_dtype = bf16`, on every CPU: longer products get bf16
/// operands (AMX tiles run a 17-row product faster than this path: a 17-token
/// prefill 0.12 s against 0.24 s for 16). Shorter ones — decode — stay f32, bound by
/// reading the weights, which bf16 operands would not change.
pub(super) const GEMV_ROWS_BF16: usize = 16;

/// Below this many multiply-adds a product runs on the calling thread alone: the
/// hand-off would cost more than the second core saves.
const PARALLEL_MIN_MACS: usize = 1 << 16;

/// Weight rows read together: four independent dot products hide the FMA latency
/// and give the prefetcher four streams.
const GROUP: usize = 4;

/// Rows of `x` that share one widened weight chunk on AVX-512: `GROUP × 4`
/// accumulators, the widened pairs and two `x` chunks fit its 32 registers.
const AVX512_ROWS: usize = 4;

/// The same on AVX2, whose sixteen registers hold two rows' accumulators for half a
/// group at a time ([`dots_chunked`]).
const AVX2_ROWS: usize = 2;

/// One few-rows product.
pub(super) struct Gemv<'a> {
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

/// `y[r, o] ← bias[o] + scale·Σ_i x[r, i]·W[o, i]` (see the module docs for the order).
pub(super) fn gemv(pool: &Pool, product: &Gemv<'_>, y: &mut [f32]) {
    assert_eq!(product.x.len(), product.rows * product.inner);
    assert_eq!(
        product.weight.len(),
        product.out * product.inner * product.dtype.size_bytes()
    );
    assert_eq!(y.len(), product.rows * product.out);
    assert!(product.bias.is_none_or(|bias| bias.len() == product.out));
    let macs = product.rows * product.inner * product.out;
    let parts = if macs < PARALLEL_MIN_MACS {
        1
    } else {
        pool.threads()
    };
    let output = SharedOut::new(y);
    let part = |index: usize| {
        let (first, end) = share(product.out, parts, index, GROUP);
        if first < end {
            // SAFETY: the parts write the disjoint output columns `first..end` of `y`
            // (`share` ranges never overlap), which outlives the job.
            unsafe { features(product, first, end, output) };
        }
    };
    if parts == 1 {
        part(0);
    } else {
        pool.run(&|index| {
            if index < parts {
                part(index);
            }
        });
    }
}

/// Output features `first..end`, on the widest lanes this CPU has.
///
/// # Safety
/// `output` is `y` of `product`, and no other thread writes its columns `first..end`.
unsafe fn features(product: &Gemv<'_>, first: usize, end: usize, output: SharedOut) {
    macro_rules! on {
        ($format:ty) => {
            match Isa::detect() {
                // SAFETY: the lanes were chosen by `Isa::detect` for this CPU.
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512 => unsafe { features_avx512::<$format>(product, first, end, output) },
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => unsafe { features_avx2::<$format>(product, first, end, output) },
                // SAFETY: portable lanes run everywhere; the range is the caller's.
                _ => unsafe {
                    features_on::<Portable, $format, 1, true>(product, first, end, output)
                },
            }
        };
    }
    match product.dtype {
        DType::F32 => on!(simd::F32),
        DType::F16 => on!(simd::F16),
        DType::Bf16 => on!(simd::Bf16),
        DType::F8E4M3 => on!(simd::E4M3),
        DType::F8E5M2 => on!(simd::E5M2),
        DType::I8 => on!(simd::I8),
        // `products::linear` dequantises group-quantised weights into f32 panels
        // (`grouped`) before they reach a product.
        DType::U4 => unreachable!("a U4 weight reached gemv"),
    }
}

/// # Safety
/// As [`features`], on a CPU with AVX-512F, AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
unsafe fn features_avx512<F: Format>(
    product: &Gemv<'_>,
    first: usize,
    end: usize,
    output: SharedOut,
) {
    // SAFETY: the caller's contract.
    unsafe { features_on::<simd::Avx512, F, AVX512_ROWS, true>(product, first, end, output) }
}

/// # Safety
/// As [`features`], on a CPU with AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn features_avx2<F: Format>(
    product: &Gemv<'_>,
    first: usize,
    end: usize,
    output: SharedOut,
) {
    // SAFETY: the caller's contract.
    unsafe { features_on::<simd::Avx2, F, AVX2_ROWS, false>(product, first, end, output) }
}

/// # Safety
/// As [`features`], with lanes `L` this CPU runs; `R` rows of `x` share each widened
/// chunk of the weight (as many as the lanes' registers hold); `PAIRED`: by
/// [`dots_rows`], else by [`dots_chunked`] (see [`group_dots`]).
#[inline(always)]
unsafe fn features_on<L: Lanes, F: Format, const R: usize, const PAIRED: bool>(
    product: &Gemv<'_>,
    first: usize,
    end: usize,
    output: SharedOut,
) {
    let row_bytes = product.inner * F::BYTES;
    let weight = product.weight.as_ptr();
    let x_row = |row: usize| product.x[row * product.inner..].as_ptr();
    let store = |row: usize, feature: usize, sums: &[f32]| {
        for (at, sum) in sums.iter().enumerate() {
            let column = feature + at;
            let scaled = product.scale.map_or(*sum, |scale| sum * scale);
            let value = product.bias.map_or(scaled, |bias| scaled + bias[column]);
            let index = row * product.out + column;
            debug_assert!(index < output.len());
            // SAFETY: `index` is inside `y` (row < rows, column < out) and in this
            // part's columns (the caller's contract).
            unsafe { *output.pointer().add(index) = value };
        }
    };
    let mut feature = first;
    while feature < end {
        let count = GROUP.min(end - feature);
        let mut row = 0;
        if count == GROUP {
            // SAFETY: rows `feature..feature + GROUP` of the weight are inside it
            // (`end <= out`, length asserted in `gemv`), each x row has `inner` values.
            let rows: [*const u8; GROUP] =
                std::array::from_fn(|at| unsafe { weight.add((feature + at) * row_bytes) });
            while row + R <= product.rows {
                // SAFETY: as above, for the R rows from `row`.
                let sums = unsafe {
                    group_dots::<L, F, R, PAIRED>(
                        rows,
                        std::array::from_fn(|at| x_row(row + at)),
                        product.inner,
                    )
                };
                for (at, sums) in sums.iter().enumerate() {
                    store(row + at, feature, sums);
                }
                row += R;
            }
            for row in row..product.rows {
                // SAFETY: as above.
                let [sums] =
                    unsafe { group_dots::<L, F, 1, PAIRED>(rows, [x_row(row)], product.inner) };
                store(row, feature, &sums);
            }
        } else {
            for row in 0..product.rows {
                let mut sums = [0.0; GROUP];
                for (at, sum) in sums.iter_mut().take(count).enumerate() {
                    // SAFETY: as above, for the `count` rows left.
                    let rows = [unsafe { weight.add((feature + at) * row_bytes) }];
                    *sum = unsafe { dots::<L, F, 1>(rows, x_row(row), product.inner) }[0];
                }
                store(row, feature, &sums[..count]);
            }
        }
        feature += count;
    }
}

/// The group's `GROUP` weight rows against `R` rows of `x`. `PAIRED`: in one pass of
/// [`dots_rows`] (two widened chunks of every row live at once: AVX-512, portable);
/// else by [`dots_chunked`], all four rows for one row of `x`, or two rows at a time
/// for several (what AVX2's registers hold). Every dot gets the same bits either way.
///
/// # Safety
/// As [`dots_rows`].
#[inline(always)]
unsafe fn group_dots<L: Lanes, F: Format, const R: usize, const PAIRED: bool>(
    rows: [*const u8; GROUP],
    xs: [*const f32; R],
    inner: usize,
) -> [[f32; GROUP]; R] {
    // SAFETY: the caller's contract, for each subset of the rows.
    unsafe {
        if PAIRED {
            return dots_rows::<L, F, GROUP, R>(rows, xs, inner);
        }
        if R == 1 {
            return dots_chunked::<L, F, GROUP, R>(rows, xs, inner);
        }
        let [first, second, third, fourth] = rows;
        let low = dots_chunked::<L, F, 2, R>([first, second], xs, inner);
        let high = dots_chunked::<L, F, 2, R>([third, fourth], xs, inner);
        let mut sums = [[0.0; GROUP]; R];
        for ((sums, low), high) in sums.iter_mut().zip(low).zip(high) {
            *sums = [low[0], low[1], high[0], high[1]];
        }
        sums
    }
}

#[cfg(test)]
mod tests {
    use super::super::dots::halving_sum;
    use super::*;

    /// The dot of `a` and `b` in the documented order, written out plainly.
    fn documented_order(a: &[f32], b: &[f32]) -> f32 {
        let mut lanes = [0f32; 16];
        for (index, (a, b)) in a.iter().zip(b).enumerate() {
            lanes[index % 16] = a.mul_add(*b, lanes[index % 16]);
        }
        halving_sum(&mut lanes)
    }

    #[test]
    fn every_lane_implementation_sums_in_the_documented_order() {
        // Proves the vector and portable dots give the bits of the documented order,
        // for lengths around every chunk edge, grouped or alone.
        for length in [0usize, 1, 15, 16, 17, 31, 33, 100, 2048] {
            let a: Vec<f32> = (0..length)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
                .collect();
            let b: Vec<f32> = (0..length)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 5.0)
                .collect();
            let bytes: Vec<u8> = a.iter().flat_map(|value| value.to_le_bytes()).collect();
            let expected = documented_order(&a, &b).to_bits();
            let rows = [bytes.as_ptr(); 4];
            // SAFETY: each row is `length` f32, so is b; portable lanes run anywhere.
            let portable = unsafe { dots::<Portable, simd::F32, 4>(rows, b.as_ptr(), length) };
            assert!(
                portable.iter().all(|sum| sum.to_bits() == expected),
                "{length}"
            );
            #[cfg(target_arch = "x86_64")]
            {
                let isa = Isa::detect();
                if isa != Isa::Portable {
                    // SAFETY: AVX2/FMA/F16C detected; same buffers as above.
                    let sums = unsafe { dots_avx2(rows, b.as_ptr(), length) };
                    assert!(
                        sums.iter().all(|sum| sum.to_bits() == expected),
                        "avx2 {length}"
                    );
                    // SAFETY: as above.
                    let sums = unsafe { dots_chunked_avx2(rows, b.as_ptr(), length) };
                    assert!(
                        sums.iter().flatten().all(|sum| sum.to_bits() == expected),
                        "avx2, a chunk at a time, {length}"
                    );
                }
                if isa == Isa::Avx512 {
                    // SAFETY: AVX-512F detected; same buffers as above.
                    let sums = unsafe { dots_avx512(rows, b.as_ptr(), length) };
                    assert!(
                        sums.iter().all(|sum| sum.to_bits() == expected),
                        "avx512 {length}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_row_gets_the_same_bits_in_a_product_of_many_rows_as_alone() {
        // Proves that rows sharing a widened weight chunk (AVX-512's four at a time,
        // AVX2's two) get the bits each gets in a one-row product — what lets decode rows of
        // several sequences stack into one product — for bf16 and f32 weights, every
        // row count up to GEMV_ROWS, and edges in both dimensions.
        let pool = Pool::new(2);
        for (inner, out) in [(2048usize, 36usize), (77, 9), (16, 4)] {
            for dtype in [DType::F32, DType::Bf16] {
                let weight: Vec<u8> = (0..out * inner)
                    .flat_map(|i| {
                        let value = ((i * 29 % 113) as f32 - 56.0) / 9.0;
                        match dtype {
                            DType::Bf16 => (value.to_bits() >> 16).to_le_bytes()[..2].to_vec(),
                            _ => value.to_le_bytes().to_vec(),
                        }
                    })
                    .collect();
                let bias: Vec<f32> = (0..out).map(|o| o as f32 / 3.0).collect();
                let x: Vec<f32> = (0..GEMV_ROWS * inner)
                    .map(|i| ((i * 61 % 89) as f32 - 44.0) / 11.0)
                    .collect();
                let product = |rows: usize, x: &[f32]| {
                    let mut y = vec![0f32; rows * out];
                    let gemv_product = Gemv {
                        x,
                        rows,
                        inner,
                        weight: &weight,
                        dtype,
                        scale: Some(0.75),
                        bias: Some(&bias),
                        out,
                    };
                    gemv(&pool, &gemv_product, &mut y);
                    y
                };
                for rows in 1..=GEMV_ROWS {
                    let together = product(rows, &x[..rows * inner]);
                    for row in 0..rows {
                        let alone = product(1, &x[row * inner..(row + 1) * inner]);
                        let bits =
                            |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&together[row * out..(row + 1) * out]),
                            bits(&alone),
                            "{dtype:?} {inner}x{out}, row {row} of {rows}"
                        );
                    }
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots_avx2(rows: [*const u8; 4], x: *const f32, inner: usize) -> [f32; 4] {
        // SAFETY: the caller's contract.
        unsafe { dots::<simd::Avx2, simd::F32, 4>(rows, x, inner) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dots_chunked_avx2(
        rows: [*const u8; 4],
        x: *const f32,
        inner: usize,
    ) -> [[f32; 2]; 2] {
        // SAFETY: the caller's contract; both rows of x are `x`.
        unsafe { dots_chunked::<simd::Avx2, simd::F32, 2, 2>([rows[0], rows[1]], [x, x], inner) }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn dots_avx512(rows: [*const u8; 4], x: *const f32, inner: usize) -> [f32; 4] {
        // SAFETY: the caller's contract.
        unsafe { dots::<simd::Avx512, simd::F32, 4>(rows, x, inner) }
    }
}
