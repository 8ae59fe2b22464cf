//! The stream-verify checksum every adapter computes on a block's bytes in the device
//! tier ([`super::Compute::checksum`]), defined here once.
//!
//! Split the bytes into little-endian 32-bit words, the last one zero-padded; sum
//! `mix64(index · φ ⊕ word)` over all words modulo 2^64; the checksum is
//! `mix64(sum ⊕ length)`. A sum parallelises on a GPU (one atomic add per warp) and does
//! not depend on the order threads finish in; `mix64` (splitmix64's finaliser) is a
//! bijection, so any changed word changes its term and the sum, and the index in each
//! term catches moved words.

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn word_term(index: u64, word: u32) -> u64 {
    mix64(index.wrapping_mul(GOLDEN_GAMMA) ^ u64::from(word))
}

/// The sum of word terms of `bytes`, whose first word has index `first_word`, so a
/// block can be folded in pieces (pieces must start on 4-byte boundaries).
pub fn partial_sum(bytes: &[u8], first_word: u64) -> u64 {
    let mut sum = 0u64;
    let mut words = bytes.chunks_exact(4);
    // index·φ (mod 2⁶⁴) as a running sum: the term of `word_term`, one add a word.
    let mut index_gamma = first_word.wrapping_mul(GOLDEN_GAMMA);
    for word in &mut words {
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        sum = sum.wrapping_add(mix64(index_gamma ^ u64::from(word)));
        index_gamma = index_gamma.wrapping_add(GOLDEN_GAMMA);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let index = first_word + (bytes.len() / 4) as u64;
        let mut padded = [0u8; 4];
        padded[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(word_term(index, u32::from_le_bytes(padded)));
    }
    sum
}

/// Finishes a sum of word terms over `length_bytes` bytes into the checksum.
pub fn finish(sum: u64, length_bytes: u64) -> u64 {
    mix64(sum ^ length_bytes)
}

/// The checksum of `bytes`.
pub fn checksum(bytes: &[u8]) -> u64 {
    finish(partial_sum(bytes, 0), bytes.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_and_its_place_count() {
        // Proves a flipped byte anywhere, or two swapped words, change the checksum.
        let mut bytes: Vec<u8> = (0..1001u32).map(|i| (i * 7) as u8).collect();
        let base = checksum(&bytes);
        for index in [0, 3, 4, 999, 1000] {
            bytes[index] ^= 1;
            assert_ne!(checksum(&bytes), base, "flip at {index}");
            bytes[index] ^= 1;
        }
        bytes.swap(0, 4);
        assert_ne!(checksum(&bytes), base, "moved word");
        let folded = finish(
            partial_sum(&bytes[..400], 0).wrapping_add(partial_sum(&bytes[400..], 100)),
            bytes.len() as u64,
        );
        assert_eq!(folded, checksum(&bytes), "pieces fold to the whole");
    }
}
