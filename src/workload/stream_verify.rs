//! stream-verify: any safetensors checkpoint. Every block crosses the tiers and its
//! bytes, as they sit in the device, are checksummed against the file's.

use crate::model::ModelIndex;

use super::WorkloadError;

/// FNV-1a over 64-bit little-endian words (the tail bytes one by one): fast enough to
/// keep up with the copy engine, and the same function the CUDA kernel computes.
pub fn checksum(bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let value = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
        hash = (hash ^ value).wrapping_mul(PRIME);
    }
    for &byte in words.remainder() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(PRIME);
    }
    hash
}

/// The expected checksum of each block, computed from the files with plain reads.
pub fn expected_checksums(index: &ModelIndex) -> Result<Vec<u64>, WorkloadError> {
    let reader = crate::model::BlockReader::open(index)?;
    (0..index.blocks.len())
        .map(|block| Ok(checksum(&reader.read(block)?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::checksum;

    #[test]
    fn checksum_sees_every_byte() {
        let mut bytes = vec![0u8; 1001];
        let base = checksum(&bytes);
        for index in [0, 7, 8, 999, 1000] {
            bytes[index] ^= 1;
            assert_ne!(checksum(&bytes), base, "flip at {index}");
            bytes[index] ^= 1;
        }
    }
}
