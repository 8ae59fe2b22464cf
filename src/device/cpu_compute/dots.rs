//! The dot products under the few-rows product ([`super::gemv`]): `W` weight rows
//! (in their storage format) against `R` rows of f32, every dot in the one order the
//! gemv module documents — lane `l` of sixteen sums the elements `i ≡ l (mod 16)`
//! with fused multiply-adds in increasing `i`, then the lanes are added by halving.
//!
//! Two loops compute that order, shaped for the registers each instruction set has:
//! [`dots_rows`] widens two chunks of every weight row first and then multiplies
//! (AVX-512's 32 zmm hold them all), and [`dots_chunked`] takes one chunk at a time,
//! widening each weight row just before its multiply-adds, so AVX2's 16 ymm hold the
//! accumulators, the chunk of `x` and one widened chunk without spilling. Both feed
//! every accumulator its chunks in increasing order, so they give the same bits.

use super::simd::{Format, Lanes};

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

/// Asks for the weight rows `W` rows on (the next group's) as far along as this
/// one has read the chunks from `at`: each row is a stream the hardware prefetcher
/// follows only after misses, and a decode step is nothing but those streams. FP8
/// decode 101 → 70 ms a token, bf16 95 → 90 (1B, two threads). A prefetch past the
/// weight's end is dropped by the CPU, never faults.
#[inline(always)]
fn prefetch_next<F: Format, const W: usize>(
    rows: [*const u8; W],
    inner: usize,
    at: usize,
    elements: usize,
) {
    #[cfg(target_arch = "x86_64")]
    {
        let (start, end) = (at * F::BYTES, (at + elements) * F::BYTES);
        let mut line = start.next_multiple_of(64);
        while line < end {
            for row in rows {
                // SAFETY: a prefetch is a hint; it never faults, whatever the address.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        row.wrapping_add(W * inner * F::BYTES + line) as *const i8,
                    )
                };
            }
            line += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (rows, inner, at, elements);
}

/// The dot products of `W` weight rows with each of `R` rows of `inner` values: every
/// chunk of the weight is widened once for all `R` rows, two chunks at a time.
///
/// # Safety
/// As [`dots`], for every one of `xs`.
#[inline(always)]
pub(super) unsafe fn dots_rows<L: Lanes, F: Format, const W: usize, const R: usize>(
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
            prefetch_next::<F, W>(rows, inner, at, 32);
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
        totals::<L, F, W, R>(sums, rows, xs, inner)
    }
}

/// As [`dots_rows`], one chunk at a time: the `R` chunks of `x` loaded, then each
/// weight row's chunk widened and multiplied into its `R` accumulators before the
/// next row's is widened. `W·R` accumulators, `R` chunks of `x` and one widened chunk
/// are live at once: on AVX2 (two ymm a lane set) `W = 4, R = 1` takes 12 of its 16
/// registers and `W = 2, R = 2` takes 14.
///
/// # Safety
/// As [`dots`], for every one of `xs`.
#[inline(always)]
pub(super) unsafe fn dots_chunked<L: Lanes, F: Format, const W: usize, const R: usize>(
    rows: [*const u8; W],
    xs: [*const f32; R],
    inner: usize,
) -> [[f32; W]; R] {
    let chunks = inner / 16;
    // SAFETY: every read is inside the first `chunks·16` elements (the caller's contract).
    unsafe {
        let mut sums = [[L::zero(); W]; R];
        for chunk in 0..chunks {
            let at = chunk * 16;
            if chunk % 2 == 0 {
                prefetch_next::<F, W>(rows, inner, at, 32);
            }
            let mut values = [L::zero(); R];
            for (values, x) in values.iter_mut().zip(xs) {
                *values = L::load(x.add(at));
            }
            for (at_row, row) in rows.iter().enumerate() {
                let weight = L::widen::<F>(row.add(at * F::BYTES));
                for (sums, values) in sums.iter_mut().zip(values) {
                    sums[at_row] = L::fma(weight, values, sums[at_row]);
                }
            }
        }
        totals::<L, F, W, R>(sums, rows, xs, inner)
    }
}

/// Each accumulator's lanes with the elements past the last whole chunk added, then
/// summed by halving.
///
/// # Safety
/// As [`dots`], for every one of `xs`.
#[inline(always)]
unsafe fn totals<L: Lanes, F: Format, const W: usize, const R: usize>(
    sums: [[L; W]; R],
    rows: [*const u8; W],
    xs: [*const f32; R],
    inner: usize,
) -> [[f32; W]; R] {
    let whole = inner / 16 * 16;
    let mut totals = [[0.0; W]; R];
    for ((totals, sums), x) in totals.iter_mut().zip(sums).zip(xs) {
        for ((total, sum), row) in totals.iter_mut().zip(sums).zip(rows) {
            let mut lanes = [0f32; 16];
            // SAFETY: the caller's contract: `inner` elements of each row and of `x`.
            unsafe {
                sum.store(lanes.as_mut_ptr());
                for index in whole..inner {
                    let lane = &mut lanes[index - whole];
                    *lane = F::scalar(row.add(index * F::BYTES)).mul_add(*x.add(index), *lane);
                }
            }
            *total = halving_sum(&mut lanes);
        }
    }
    totals
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
