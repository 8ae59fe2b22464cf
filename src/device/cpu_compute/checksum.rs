//! The block checksum of the compute port (`compute::checksum`: a wrapping sum of one
//! keyed 32 × 32 → 64-bit product per 32-bit word of the block) at memory speed: the
//! words split over the pool by position alone, each part summed by the definition's
//! [`partial_sum`] (eight lanes at a time where the CPU has AVX-512). A wrapping sum does not depend on the order its terms are added in,
//! so the result is the definition's, bit for bit, for any thread count and
//! instruction set. It is what `verify = weights` pays for each block that
//! lands, so it must cost about one read of the block.
//!
//! A pool that spans every core sums on the calling thread alone. Blocks land while
//! the copy thread fills the next slots, and then it has one of the pool's cores: a
//! split waits for the part whose core it took. MiniLM streamed at its default budget
//! on 2 cores (694 MB landed a run): 0.083–0.100 s split over 2 threads, 0.062 s on
//! one (0.049 s with the sum's prefetches).

use super::pool::Pool;
use crate::compute::checksum::{finish, partial_sum};

/// Bytes below which one thread sums alone (a hand-off costs more than the work).
const PARALLEL_BYTES: usize = 1 << 20;

/// The checksum of `bytes`, on the pool when it leaves the copy thread a core
/// (`cores`: the cores this process may run on).
pub(super) fn checksum(pool: &Pool, bytes: &[u8], cores: usize) -> u64 {
    let threads = if bytes.len() < PARALLEL_BYTES || pool.threads() >= cores {
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
            let sum = partial_sum(&bytes[start_byte..end_byte], first as u64);
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
                    checksum(&pool, part, 4),
                    crate::compute::checksum::checksum(part),
                    "{threads} threads, {offset}+{length}"
                );
            }
        }
    }
}
