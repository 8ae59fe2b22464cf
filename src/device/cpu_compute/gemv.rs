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
/// accumulators, the widened pairs and two `x` chunks fit its 32 registers. (AVX2's
/// sixteen registers hold one row's.)
const AVX512_ROWS: usize = 4;

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
                _ => unsafe { features_on::<Portable, $format, 1>(product, first, end, output) },
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
    unsafe { features_on::<simd::Avx512, F, AVX512_ROWS>(product, first, end, output) }
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
    unsafe { features_on::<simd::Avx2, F, 1>(product, first, end, output) }
}

/// # Safety
/// As [`features`], with lanes `L` this CPU runs; `R` rows of `x` share each widened
/// chunk of the weight (as many as the lanes' registers hold).
#[inline(always)]
unsafe fn features_on<L: Lanes, F: Format, const R: usize>(
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
                    dots_rows::<L, F, GROUP, R>(
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
                let sums = unsafe { dots::<L, F, GROUP>(rows, x_row(row), product.inner) };
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

/// The dot products of `W` weight rows (in format `F`) with one row of `inner`
/// values, each in the fixed order of the module docs.
///
/// # Safety
/// Each of `rows` is valid for `inner` elements of `F`, `x` for `inner` f32, and the
/// CPU runs `L`.
#[inline(always)]
pub(super) unsafe fn dots<L: Lanes, F: Format, const W: usize>(
    rows: [*const u8; W],
    x: *const f32,
    inner: usize,
) -> [f32; W] {
    // SAFETY: the caller's contract.
    unsafe { dots_rows::<L, F, W, 1>(rows, [x], inner)[0] }
}

/// The dot products of `W` weight rows with each of `R` rows of `inner` values: every
/// chunk of the weight is widened once for all `R` rows. Each accumulator still
/// takes its chunks in increasing order, so every dot has the bits [`dots`] gives it
/// alone.
///
/// # Safety
/// As [`dots`], for every one of `xs`.
#[inline(always)]
unsafe fn dots_rows<L: Lanes, F: Format, const W: usize, const R: usize>(
    rows: [*const u8; W],
    xs: [*const f32; R],
    inner: usize,
) -> [[f32; W]; R] {
    let chunks = inner / 16;
    // SAFETY: every read is inside the first `chunks·16` elements (the caller's contract).
    unsafe {
        let mut sums = [[L::zero(); W]; R];
        // Two chunks at a time (the same lane order: chunk c, then c + 1).
        for pair in 0..chunks / 2 {
            let at = pair * 32;
            // Ask for the next group's rows (`W` rows on) as far along as this one
            // has read: each row is a stream the hardware prefetcher follows only
            // after misses, and a decode step is nothing but those streams. FP8
            // decode 101 → 70 ms a token, bf16 95 → 90 (1B, two threads). A
            // prefetch past the weight's end is dropped by the CPU, never faults.
            #[cfg(target_arch = "x86_64")]
            {
                let (start, end) = (at * F::BYTES, (at + 32) * F::BYTES);
                let mut line = start.next_multiple_of(64);
                while line < end {
                    for row in rows {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            row.wrapping_add(W * inner * F::BYTES + line) as *const i8,
                        );
                    }
                    line += 64;
                }
            }
            // Loops, not `array::from_fn`: its closure does not inherit the caller's
            // target features, so every intrinsic in it became a call (AVX2 decode
            // at 0.1 of the memory roofline).
            let mut widened = [(L::zero(), L::zero()); W];
            for (pair, row) in widened.iter_mut().zip(rows) {
                *pair = L::widen_pair::<F>(row.add(at * F::BYTES));
            }
            for (sums, x) in sums.iter_mut().zip(xs) {
                let (first, second) = (L::load(x.add(at)), L::load(x.add(at + 16)));
                for (sum, (low, high)) in sums.iter_mut().zip(widened) {
                    *sum = L::fma(high, second, L::fma(low, first, *sum));
                }
            }
        }
        if chunks % 2 == 1 {
            let at = (chunks - 1) * 16;
            let mut widened = [L::zero(); W];
            for (lanes, row) in widened.iter_mut().zip(rows) {
                *lanes = L::widen::<F>(row.add(at * F::BYTES));
            }
            for (sums, x) in sums.iter_mut().zip(xs) {
                let values = L::load(x.add(at));
                for (sum, weight) in sums.iter_mut().zip(widened) {
                    *sum = L::fma(weight, values, *sum);
                }
            }
        }
        let mut totals = [[0.0; W]; R];
        for ((totals, sums), x) in totals.iter_mut().zip(sums).zip(xs) {
            for ((total, sum), row) in totals.iter_mut().zip(sums).zip(rows) {
                let mut lanes = [0f32; 16];
                sum.store(lanes.as_mut_ptr());
                for index in chunks * 16..inner {
                    let lane = &mut lanes[index - chunks * 16];
                    *lane = F::scalar(row.add(index * F::BYTES)).mul_add(*x.add(index), *lane);
                }
                *total = halving_sum(&mut lanes);
            }
        }
        totals
    }
}

/// The sixteen lanes added by halving: `l + 8`, then `+ 4`, `+ 2`, `+ 1`.
#[inline(always)]
pub(super) fn halving_sum(lanes: &mut [f32; 16]) -> f32 {
    let mut width = 8;
    while width > 0 {
        for lane in 0..width {
            lanes[lane] += lanes[lane + width];
        }
        width /= 2;
    }
    lanes[0]
}

#[cfg(test)]
mod tests {
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
        // Proves that rows sharing a widened weight chunk (AVX-512's four at a time)
        // get the bits each gets in a one-row product — what lets decode rows of
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
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    unsafe fn dots_avx512(rows: [*const u8; 4], x: *const f32, inner: usize) -> [f32; 4] {
        // SAFETY: the caller's contract.
        unsafe { dots::<simd::Avx512, simd::F32, 4>(rows, x, inner) }
    }
}
