//! The `weights` check (`verify = weights | first`): every block's bytes, each time they
//! land in the device tier, against the checksum of the same bytes in the file — the
//! stream-verify mechanism, applied as a run goes. Streamed data then cannot differ
//! from the file, at the cost of one pass of the compute device over the bytes that
//! landed (a resident block once, a streamed one each step), instead of a second,
//! fully-resident forward pass.
//!
//! A block is checked when its residency generation is new (it was loaded again). Its
//! file checksum is computed once, from plain reads of the file the first time the
//! block lands, a mebibyte at a time through one buffer that stays in cache (not
//! a block-sized allocation, faulted in and dropped per block) — or taken from the
//! checksums an earlier run on the same, unchanged files kept ([`KnownChecksums`]);
//! a landing that differs from a kept checksum is checked against the file again
//! before it is called corrupt. Blocks a LoRA adapter
//! patches are checked too: a streamed one keeps the file's bytes (the adapter is a
//! separate low-rank pass), and a resident one is checked as it lands, before the
//! adapter is baked into it.

use stagehand_actors::{BlockHandle, Extent, ModelLayout};

use super::FamilyError;
use crate::compute::checksum::{finish, partial_sum};
use crate::compute::{BlockView, Compute};
use crate::model::{BlockReader, KnownChecksums};

/// Checks landed blocks against the file.
pub struct LandingCheck<'a> {
    reader: &'a BlockReader<'a>,
    layout: &'a ModelLayout,
    /// Per block: the checksum of its bytes in the file, once known.
    expected: Vec<Option<Expected>>,
    /// Checksums kept between runs: read before a file is, learned as files are read,
    /// saved when the check is dropped.
    known: KnownChecksums,
    /// Per block: the generation last checked.
    checked: Vec<Option<u32>>,
    /// The file's bytes on their way into an expected checksum ([`PIECE_BYTES`]).
    piece: Vec<u8>,
    /// Landings checked so far.
    pub landings: u64,
    /// Bytes of them.
    pub bytes: u64,
    /// Blocks whose expected checksum was read from the files (not kept from before).
    pub read_from_files: u64,
}

impl<'a> LandingCheck<'a> {
    /// A check of the blocks of `layout` (the session's), read from the files by `reader`.
    pub fn new(reader: &'a BlockReader<'a>, layout: &'a ModelLayout) -> Self {
        Self {
            reader,
            layout,
            expected: vec![None; layout.len()],
            known: KnownChecksums::none(),
            checked: vec![None; layout.len()],
            piece: Vec::new(),
            landings: 0,
            bytes: 0,
            read_from_files: 0,
        }
    }

    /// Takes expected checksums from `known` where it has them, and keeps there those
    /// read from the files, for the next run.
    pub fn with_known(mut self, known: KnownChecksums) -> Self {
        self.known = known;
        self
    }

    /// Checks the held block if it landed since it was last checked; a mismatch is a
    /// [`FamilyError::Corrupt`] naming the block.
    pub fn check<C: Compute>(
        &mut self,
        compute: &C,
        handle: &BlockHandle,
    ) -> Result<(), FamilyError> {
        let block = handle.block.index();
        let Some(info) = self.layout.block(handle.block) else {
            return Ok(());
        };
        if self.checked[block] == Some(handle.generation) {
            return Ok(());
        }
        let expected = match self.expected[block] {
            Some(expected) => expected,
            None => {
                let expected = match self.known.get(&info.extents) {
                    Some(sum) => Expected { sum, read: false },
                    None => self.read_expected(&info.extents)?,
                };
                self.expected[block] = Some(expected);
                expected
            }
        };
        // SAFETY: the caller holds `handle`: the block is in the compute adapter's
        // memory space (the block source checked it) and stays put while held.
        let view = unsafe { BlockView::new(handle.ptr, handle.bytes) };
        let landed = compute.checksum(&view)?;
        if landed != expected.sum {
            // A kept checksum may be stale or damaged: the file has the last word.
            let from_file = match expected.read {
                true => expected,
                false => self.read_expected(&info.extents)?,
            };
            self.expected[block] = Some(from_file);
            if landed != from_file.sum {
                return Err(FamilyError::Corrupt {
                    block: info.name.clone(),
                    offset: 0,
                });
            }
        }
        self.checked[block] = Some(handle.generation);
        self.landings += 1;
        self.bytes += handle.bytes;
        Ok(())
    }
}

impl LandingCheck<'_> {
    /// The checksum of `extents` in the files, read now and kept in [`KnownChecksums`].
    fn read_expected(&mut self, extents: &[Extent]) -> Result<Expected, FamilyError> {
        let sum = file_checksum(self.reader, extents, &mut self.piece)?;
        self.known.learn(extents, sum);
        self.read_from_files += 1;
        Ok(Expected { sum, read: true })
    }
}

impl Drop for LandingCheck<'_> {
    fn drop(&mut self) {
        self.known.save();
    }
}

/// A block's checksum in the file, and whether this run read it from the file (or
/// took it from [`KnownChecksums`]).
#[derive(Debug, Clone, Copy)]
struct Expected {
    sum: u64,
    read: bool,
}

/// Bytes read from the file per piece of an expected checksum: a multiple of the
/// checksum's 4-byte word, small enough to stay in L2. (The unit test's pieces are a
/// few words, so its tensors cross them.)
const PIECE_BYTES: usize = if cfg!(test) { 12 } else { 1 << 20 };

/// The checksum of `extents` laid end to end, read [`PIECE_BYTES`] at a time into
/// `piece`: each full piece (a whole number of words) is folded in as it fills, so the
/// buffer stays in the core's cache and no block-sized allocation is made.
fn file_checksum(
    reader: &BlockReader<'_>,
    extents: &[Extent],
    piece: &mut Vec<u8>,
) -> Result<u64, FamilyError> {
    piece.resize(PIECE_BYTES, 0);
    let (mut sum, mut folded, mut filled) = (0u64, 0u64, 0usize);
    for extent in extents {
        let mut done = 0u64;
        while done < extent.length {
            let length = (extent.length - done).min((PIECE_BYTES - filled) as u64);
            let part = Extent {
                offset: extent.offset + done,
                length,
                ..*extent
            };
            reader.read_once(&[part], &mut piece[filled..filled + length as usize])?;
            (done, filled) = (done + length, filled + length as usize);
            if filled == PIECE_BYTES {
                sum = sum.wrapping_add(partial_sum(piece, folded / 4));
                (folded, filled) = (folded + PIECE_BYTES as u64, 0);
            }
        }
    }
    sum = sum.wrapping_add(partial_sum(&piece[..filled], folded / 4));
    Ok(finish(sum, folded + filled as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::checksum::checksum;
    use crate::model::ModelIndex;

    #[test]
    fn a_file_checksum_read_in_pieces_equals_the_checksum_of_the_whole_block() {
        // Proves the piecewise fold: tensors of odd byte lengths (words straddle both
        // the tensors and the pieces) give the checksum of their bytes laid end to end.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let data: Vec<Vec<u8>> = [14usize, 66, 20, 3]
            .iter()
            .map(|&length| (0..length).map(|i| (i * 37 + length) as u8).collect())
            .collect();
        let tensors = [
            ("layers.0.a", safetensors::Dtype::F16, 0),
            ("layers.0.b", safetensors::Dtype::F16, 1),
            ("layers.0.c", safetensors::Dtype::F32, 2),
            ("layers.1.d", safetensors::Dtype::U8, 3),
        ];
        let views: Vec<_> = tensors
            .iter()
            .map(|&(name, dtype, at)| {
                let elements = data[at].len() * 8 / dtype.bitsize();
                let view = safetensors::tensor::TensorView::new(dtype, vec![elements], &data[at]);
                (name, view.unwrap())
            })
            .collect();
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let index = ModelIndex::open(&path, None).unwrap();
        let reader = BlockReader::open(&index).unwrap();
        let mut piece = Vec::new();
        for block in &index.blocks {
            let mut whole = vec![0u8; block.bytes as usize];
            reader.read_extents(&block.extents, &mut whole).unwrap();
            let pieces = file_checksum(&reader, &block.extents, &mut piece).unwrap();
            assert_eq!(pieces, checksum(&whole), "{}", block.name);
        }
        assert!(index
            .blocks
            .iter()
            .any(|block| block.bytes > 2 * PIECE_BYTES as u64));
    }
}
