//! The stream-verify checksum every adapter computes on a block's bytes in the device
//! tier ([`super::Compute::checksum`]), defined here once.
//!
//! Split the bytes into little-endian 32-bit words, the last one zero-padded. Word `i`
//! has the key `g = i · φ (mod 2⁶⁴)`; its term is the 64-bit product
//! `(word ⊕ low32(g)) × (high32(g) | 1)` of two 32-bit numbers. The sum of the terms
//! modulo 2⁶⁴, `s`, gives the checksum `mix64(s ⊕ length)`.
//!
//! Why this shape: a sum parallelises on a GPU (one atomic add per warp) and does not
//! depend on the order threads finish in. A changed word always changes the sum — its
//! term moves by (an odd multiplier) × (a difference below 2³²), never a multiple of
//! 2⁶⁴ — and the index's key and multiplier in each term catch moved words. One
//! 32 × 32 → 64-bit multiply a word is what a CPU core does at memory speed (AVX-512's
//! `vpmuludq`, one micro-op for eight words); the 64-bit multiplies of a full mixer
//! on every word held one core to 8–14 GB/s, and `verify = weights` checks every byte
//! that lands, each time it lands.

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's finaliser: the last mix of the sum with the length.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The term of `word` under the key `key = index · φ`.
fn word_term(key: u64, word: u32) -> u64 {
    let multiplier = (key >> 32) as u32 | 1;
    u64::from(word ^ key as u32) * u64::from(multiplier)
}

/// The sum of word terms of `bytes`, whose first word has index `first_word`, so a
/// block can be folded in pieces (pieces must start on 4-byte boundaries). Eight
/// words at a time where the CPU has AVX-512 (the same sum: its terms' order does not
/// matter).
pub fn partial_sum(bytes: &[u8], first_word: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            let whole = bytes.len() / 32 * 32;
            // SAFETY: the feature was detected just now.
            let head = unsafe { x86::sum_avx512(&bytes[..whole], first_word) };
            let tail = scalar_sum(&bytes[whole..], first_word + whole as u64 / 4);
            return head.wrapping_add(tail);
        }
    }
    scalar_sum(bytes, first_word)
}

/// [`partial_sum`] a word at a time: the definition as written.
fn scalar_sum(bytes: &[u8], first_word: u64) -> u64 {
    let mut sum = 0u64;
    let mut words = bytes.chunks_exact(4);
    // index·φ (mod 2⁶⁴) as a running sum: one add a word.
    let mut key = first_word.wrapping_mul(GOLDEN_GAMMA);
    for word in &mut words {
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        sum = sum.wrapping_add(word_term(key, word));
        key = key.wrapping_add(GOLDEN_GAMMA);
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut padded = [0u8; 4];
        padded[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(word_term(key, u32::from_le_bytes(padded)));
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::GOLDEN_GAMMA;

    /// Streams read side by side: one sequential stream leaves the memory system
    /// idle between its misses (4.5 GB/s a core from memory here); four overlap them.
    const STREAMS: usize = 4;

    /// How far ahead each stream asks for its lines (in 32-byte chunks: 2 KiB).
    const PREFETCH_CHUNKS: usize = 64;

    /// The partial sum of `bytes` (a multiple of 32 bytes: eight words a step), as
    /// [`STREAMS`] equal parts read in lockstep, then the rest (a wrapping sum: the
    /// order of its terms does not matter).
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn sum_avx512(bytes: &[u8], first_word: u64) -> u64 {
        let one = _mm512_set1_epi64(1);
        // The next eight words' keys are these plus 8φ: one add a step.
        let step = _mm512_set1_epi64(GOLDEN_GAMMA.wrapping_mul(8) as i64);
        let keys_at = |word: u64| {
            let mut keys = [0u64; 8];
            for (lane, key) in keys.iter_mut().enumerate() {
                *key = (word + lane as u64).wrapping_mul(GOLDEN_GAMMA);
            }
            // SAFETY: `keys` is 64 readable bytes.
            unsafe { _mm512_loadu_si512(keys.as_ptr() as *const __m512i) }
        };
        let term = |keys: __m512i, at: *const u8| {
            // SAFETY: `at` starts 32 readable bytes (the callers' loops); unaligned load.
            let words = _mm512_cvtepu32_epi64(unsafe { _mm256_loadu_si256(at as *const __m256i) });
            // `vpmuludq` multiplies the low 32 bits of each lane: the word ⊕ low32(key)
            // by high32(key) | 1, whatever the high halves hold.
            let multipliers = _mm512_or_si512(_mm512_srli_epi64::<32>(keys), one);
            _mm512_mul_epu32(_mm512_xor_si512(words, keys), multipliers)
        };
        let chunks = bytes.len() / 32;
        let per_stream = chunks / STREAMS;
        let mut sum = _mm512_setzero_si512();
        let mut keys: [__m512i; STREAMS] = [_mm512_setzero_si512(); STREAMS];
        for (stream, value) in keys.iter_mut().enumerate() {
            *value = keys_at(first_word + (stream * per_stream * 8) as u64);
        }
        let base = bytes.as_ptr();
        for chunk in 0..per_stream {
            for (stream, keys) in keys.iter_mut().enumerate() {
                let at = base.add((stream * per_stream + chunk) * 32);
                if chunk % 2 == 0 && chunk + PREFETCH_CHUNKS < per_stream {
                    _mm_prefetch::<_MM_HINT_T0>(at.add(PREFETCH_CHUNKS * 32) as *const i8);
                }
                sum = _mm512_add_epi64(sum, term(*keys, at));
                *keys = _mm512_add_epi64(*keys, step);
            }
        }
        let mut keys = keys_at(first_word + (STREAMS * per_stream * 8) as u64);
        for chunk in STREAMS * per_stream..chunks {
            sum = _mm512_add_epi64(sum, term(keys, base.add(chunk * 32)));
            keys = _mm512_add_epi64(keys, step);
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

    #[test]
    fn the_vector_sum_is_the_word_at_a_time_sum() {
        // Proves the eight-lane, four-stream sum equals the definition for every
        // length class: under a lane, a tail, under and over one chunk a stream.
        let bytes: Vec<u8> = (0..70_001u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for (offset, length) in [
            (0, 0),
            (0, 31),
            (4, 32),
            (8, 127),
            (0, 128),
            (12, 4097),
            (0, 70_001),
        ] {
            let part = &bytes[offset..offset + length];
            let first_word = offset as u64 / 4;
            assert_eq!(
                partial_sum(part, first_word),
                scalar_sum(part, first_word),
                "{offset}+{length}"
            );
        }
    }
}
