//! The checksum a generated model carries in its header, and its check.
//!
//! A generated model's `__metadata__` holds `stagehand.data_checksum`: an FNV-1a hash
//! over the data section's 64-bit little-endian words (the tail bytes one by one).
//! The writer does not know the hash before the data is written, so the header goes
//! out with a placeholder of the same length, and the real value is written over it
//! once the data is complete — before the file is renamed into place. A model whose
//! data no longer hashes to its header's value (zeroed, bit-flipped, half-written by a
//! tool that kept the header) is corrupt; the cache rebuilds it instead of trusting it.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;

use super::{FileStamp, ModelIndex};

/// The `__metadata__` key of a generated model's data checksum.
pub const DATA_CHECKSUM_KEY: &str = "stagehand.data_checksum";
const CHECKSUM_PREFIX: &str = "fnv1a64:";
/// What the header holds until the data is written: as long as a real value.
pub const PENDING_CHECKSUM: &str = "fnv1a64:----------------";

/// The header value for a data section hashing to `hash`.
pub fn checksum_text(hash: u64) -> String {
    format!("{CHECKSUM_PREFIX}{hash:016x}")
}

/// FNV-1a over 64-bit little-endian words, fed in pieces of any size: the same value
/// as hashing the whole section at once.
#[derive(Debug, Clone)]
pub struct DataChecksum {
    hash: u64,
    partial: [u8; 8],
    partial_bytes: usize,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

impl Default for DataChecksum {
    fn default() -> Self {
        Self {
            hash: FNV_OFFSET,
            partial: [0; 8],
            partial_bytes: 0,
        }
    }
}

impl DataChecksum {
    pub fn update(&mut self, mut bytes: &[u8]) {
        if self.partial_bytes > 0 {
            let take = (8 - self.partial_bytes).min(bytes.len());
            self.partial[self.partial_bytes..self.partial_bytes + take]
                .copy_from_slice(&bytes[..take]);
            self.partial_bytes += take;
            bytes = &bytes[take..];
            if self.partial_bytes < 8 {
                return;
            }
            self.word(u64::from_le_bytes(self.partial));
            self.partial_bytes = 0;
        }
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            let mut array = [0u8; 8];
            array.copy_from_slice(word);
            self.word(u64::from_le_bytes(array));
        }
        let tail = words.remainder();
        self.partial[..tail.len()].copy_from_slice(tail);
        self.partial_bytes = tail.len();
    }

    fn word(&mut self, value: u64) {
        self.hash = (self.hash ^ value).wrapping_mul(FNV_PRIME);
    }

    /// The hash of everything fed so far.
    pub fn value(&self) -> u64 {
        self.partial[..self.partial_bytes]
            .iter()
            .fold(self.hash, |hash, &byte| {
                (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
            })
    }
}

/// Writes a generated model: the header (holding [`PENDING_CHECKSUM`]), then the data
/// through [`GeneratedWriter::write`], then [`GeneratedWriter::finish`] puts the data's
/// checksum into the header and syncs the file.
pub struct GeneratedWriter<'f> {
    writer: BufWriter<&'f File>,
    checksum: DataChecksum,
    /// File offset of the placeholder.
    checksum_offset: u64,
}

impl<'f> GeneratedWriter<'f> {
    /// Writes the model into `file` (an unnamed file [`crate::os::write_atomically`]
    /// names once complete).
    pub fn new(file: &'f File, header_json: &[u8]) -> io::Result<Self> {
        let position = header_json
            .windows(PENDING_CHECKSUM.len())
            .position(|window| window == PENDING_CHECKSUM.as_bytes())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the header has no checksum placeholder",
                )
            })?;
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        writer.write_all(&(header_json.len() as u64).to_le_bytes())?;
        writer.write_all(header_json)?;
        Ok(Self {
            writer,
            checksum: DataChecksum::default(),
            checksum_offset: 8 + position as u64,
        })
    }

    /// Appends data (and hashes it). Polls the stop flag: a signal ends a long write
    /// here, and the caller removes the partial file.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        crate::signals::check()
            .map_err(|interrupted| io::Error::new(io::ErrorKind::Interrupted, interrupted))?;
        self.checksum.update(bytes);
        self.writer.write_all(bytes)
    }

    /// Writes the checksum into the header and syncs the file to disk.
    pub fn finish(self) -> io::Result<u64> {
        let file = self
            .writer
            .into_inner()
            .map_err(|error| error.into_error())?;
        let hash = self.checksum.value();
        file.write_all_at(checksum_text(hash).as_bytes(), self.checksum_offset)?;
        file.sync_all()?;
        Ok(hash)
    }
}

/// Why a generated model failed its check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    #[error("its header carries no data checksum (written by an older stagehand?)")]
    Missing,
    #[error("its data hashes to {found} but its header says {expected}: the file is corrupt")]
    Mismatch { expected: String, found: String },
    #[error("{0}")]
    Read(String),
}

/// Bytes read per `pread` while checking.
const VERIFY_CHUNK_BYTES: usize = 4 << 20;

/// Reads a one-file generated model's data section and checks it against the checksum
/// in its header. Returns the stamp of the file that was checked. Polls the stop flag
/// between reads.
pub fn verify_data_checksum(index: &ModelIndex) -> Result<FileStamp, ChecksumError> {
    let expected = index
        .metadata
        .get(DATA_CHECKSUM_KEY)
        .ok_or(ChecksumError::Missing)?;
    let [shard] = index.files.as_slice() else {
        return Err(ChecksumError::Read(
            "a generated model is one file".to_string(),
        ));
    };
    let read_error = |error: io::Error| ChecksumError::Read(error.to_string());
    let (file, metadata) = super::open_regular(&shard.path).map_err(read_error)?;
    let stamp = FileStamp::of(&metadata);
    let mut checksum = DataChecksum::default();
    let mut buffer = vec![0u8; VERIFY_CHUNK_BYTES];
    let mut offset = shard.header_bytes;
    while offset < stamp.bytes {
        crate::signals::check()
            .map_err(|interrupted| ChecksumError::Read(interrupted.to_string()))?;
        let length = (stamp.bytes - offset).min(VERIFY_CHUNK_BYTES as u64) as usize;
        file.read_exact_at(&mut buffer[..length], offset)
            .map_err(read_error)?;
        checksum.update(&buffer[..length]);
        offset += length as u64;
    }
    let after = file.metadata().map_err(read_error)?;
    if let Some(difference) = stamp.difference(&FileStamp::of(&after)) {
        return Err(ChecksumError::Read(format!(
            "the file changed while it was checked ({difference})"
        )));
    }
    let found = checksum_text(checksum.value());
    if &found != expected {
        return Err(ChecksumError::Mismatch {
            expected: expected.clone(),
            found,
        });
    }
    Ok(stamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_does_not_depend_on_how_the_data_is_cut() {
        // Proves a streamed checksum equals the one-shot one for any split, including
        // splits inside a word, and that it sees every byte.
        let bytes: Vec<u8> = (0..1003u32).map(|value| (value * 7 + 3) as u8).collect();
        let mut whole = DataChecksum::default();
        whole.update(&bytes);
        for cut in [1, 3, 7, 8, 9, 64, 500, 1002] {
            let mut pieces = DataChecksum::default();
            for piece in bytes.chunks(cut) {
                pieces.update(piece);
            }
            assert_eq!(pieces.value(), whole.value(), "pieces of {cut}");
        }
        let mut flipped = bytes.clone();
        flipped[1001] ^= 1;
        let mut other = DataChecksum::default();
        other.update(&flipped);
        assert_ne!(other.value(), whole.value());
        assert_eq!(checksum_text(0).len(), PENDING_CHECKSUM.len());
    }
}
