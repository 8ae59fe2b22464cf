//! The block checksum of the compute port (`compute::checksum`: a wrapping sum of
//! `mix64(index · φ ⊕ word)` over the block's 32-bit words) at memory speed: the words
//! split over the pool by position alone, eight lanes at a time where the CPU has
//! AVX-512 with 64-bit multiplies. A wrapping sum does not depend on the order its
//! terms are added in, so the result is the definition's, bit for bit, for any thread
//! count and instruction set. It is what `verify = weights` pays for each block that
//! lands, so it must cost about one read of the block.

use super::pool::Pool;
use crate::compute::checksum::{finish, partial_sum};

/// Bytes below which one thread sums alone (a hand-off costs more than the work).
const PARALLEL_BYTES: usize = 1 << 20;

/// The checksum of `bytes`, on the pool.
pub(super) fn checksum(pool: &Pool, bytes: &[u8]) -> u64 {
    let threads = if bytes.len() < PARALLEL_BYTES {
        1
    } else {
        pool.threads()
    };
    let words = bytes.len().div_ceil(4);
    let sums: Vec<std::sync::atomic::AtomicU64> = (0..threads)
        .map(|_| std::sync::atomic::AtomicU64::new(0))
        .collect();
    let part = |index: usize| {
        let (first, end) = super::pool::share(words, threads, index, 1024);
        let (start_byte, end_byte) = (first * 4, (end * 4).min(bytes.len()));
        if start_byte < end_byte {
            let sum = sum_words(&bytes[start_byte..end_byte], first as u64);
            sums[index].store(sum, std::sync::atomic::Ordering::Relaxed);
        }
    };
    if threads == 1 {
        part(0);
    } else {
        pool.run(&part);
    }
    let total = sums.iter().fold(0u64, |total, sum| {
        total.wrapping_add(sum.load(std::sync::atomic::Ordering::Relaxed))
    });
    finish(total, bytes.len() as u64)
}

/// The definition's partial sum of `bytes` (whose first word has index `first_word`),
/// by the widest lanes this CPU runs.
fn sum_words(bytes: &[u8], first_word: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            let whole = bytes.len() / 32 * 32;
            // SAFETY: the features were detected just now.
            let head = unsafe { x86::sum_avx512(&bytes[..whole], first_word) };
            let tail = partial_sum(&bytes[whole..], first_word + whole as u64 / 4);
            return head.wrapping_add(tail);
        }
    }
    partial_sum(bytes, first_word)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// The partial sum of `bytes` (a multiple of 32 bytes: eight words a step).
    ///
    /// # Safety
    /// The CPU must have AVX-512F and AVX-512DQ.
    #[target_feature(enable = "avx512f,avx512dq")]
    pub(super) unsafe fn sum_avx512(bytes: &[u8], first_word: u64) -> u64 {
        const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
        let gamma = _mm512_set1_epi64(GAMMA as i64);
        let c1 = _mm512_set1_epi64(0xbf58_476d_1ce4_e5b9_u64 as i64);
        let c2 = _mm512_set1_epi64(0x94d0_49bb_1331_11eb_u64 as i64);
        // index·γ (mod 2⁶⁴) kept as a running product: the next eight indices' are
        // these plus 8γ, one add instead of a 64-bit multiply (the slow part).
        let step = _mm512_set1_epi64(GAMMA.wrapping_mul(8) as i64);
        let index = _mm512_add_epi64(
            _mm512_set1_epi64(first_word as i64),
            _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0),
        );
        let mut index_gamma = _mm512_mullo_epi64(index, gamma);
        let mut sum = _mm512_setzero_si512();
        for chunk in bytes.chunks_exact(32) {
            // SAFETY: `chunk` is 32 readable bytes; the load is unaligned.
            let words = _mm256_loadu_si256(chunk.as_ptr() as *const __m256i);
            let words = _mm512_cvtepu32_epi64(words);
            let mut z = _mm512_xor_si512(index_gamma, words);
            z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64::<30>(z)), c1);
            z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64::<27>(z)), c2);
            z = _mm512_xor_si512(z, _mm512_srli_epi64::<31>(z));
            sum = _mm512_add_epi64(sum, z);
            index_gamma = _mm512_add_epi64(index_gamma, step);
        }
        let mut lanes = [0u64; 8];
        // SAFETY: `lanes` is 64 writable bytes.
        _mm512_storeu_si512(lanes.as_mut_ptr() as *mut __m512i, sum);
        lanes
            .iter()
            .fold(0u64, |total, &lane| total.wrapping_add(lane))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parallel_lanes_give_the_definitions_checksum() {
        // Every length class (under a lane, lanes and a tail, over the parallel
        // threshold, odd byte counts) and every thread count give the same bits as
        // `compute::checksum`.
        let bytes: Vec<u8> = (0..(3 << 20) + 13u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        for threads in [1, 2, 3] {
            let pool = Pool::new(threads);
            for (offset, length) in [
                (0, 0),
                (0, 3),
                (1, 31),
                (0, 32),
                (4, 1000),
                (2, 1 << 20),
                (0, bytes.len()),
            ] {
                let part = &bytes[offset..offset + length];
                assert_eq!(
                    checksum(&pool, part),
                    crate::compute::checksum::checksum(part),
                    "{threads} threads, {offset}+{length}"
                );
            }
        }
    }
}
