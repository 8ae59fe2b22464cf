//! Plain reads of a block's bytes straight from its files, for references and
//! checksums computed outside the pipeline (never on the streaming path).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use stagehand_actors::Extent;

use super::ModelIndex;

/// A file of the model that could not be opened or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct BlockReadError {
    pub path: PathBuf,
    pub reason: String,
}

/// The model's files, opened once, and reads of whole blocks from them.
pub struct BlockReader<'a> {
    index: &'a ModelIndex,
    files: Vec<File>,
}

impl<'a> BlockReader<'a> {
    pub fn open(index: &'a ModelIndex) -> Result<Self, BlockReadError> {
        let files = index
            .files
            .iter()
            .map(|shard| {
                File::open(&shard.path).map_err(|error| BlockReadError {
                    path: shard.path.clone(),
                    reason: error.to_string(),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { index, files })
    }

    /// Fills `bytes` (at least the block's size) with block `block`'s extents laid end
    /// to end, as the block sits in its device slot.
    pub fn read_into(&self, block: usize, bytes: &mut [u8]) -> Result<(), BlockReadError> {
        self.read_extents(&self.index.blocks[block].extents, bytes)
    }

    /// Fills `bytes` with `extents` of the model's files laid end to end (a layout
    /// other than the index's own blocks, such as MoE experts).
    pub fn read_extents(&self, extents: &[Extent], bytes: &mut [u8]) -> Result<(), BlockReadError> {
        let mut at = 0usize;
        for extent in extents {
            let length = extent.length as usize;
            let file = extent.file.0 as usize;
            self.files[file]
                .read_exact_at(&mut bytes[at..at + length], extent.offset)
                .map_err(|error| BlockReadError {
                    path: self.index.files[file].path.clone(),
                    reason: error.to_string(),
                })?;
            at += length;
        }
        Ok(())
    }

    /// Tells the kernel the page cache may drop `extents`: a read for a reference or a
    /// checksum is one-off, and must not leave behind the pages a run's pinned blocks
    /// freed. Advice only: a failure changes nothing that matters.
    pub fn forget(&self, extents: &[Extent]) {
        for extent in extents {
            if let Some(file) = self.files.get(extent.file.0 as usize) {
                let _ = crate::storage::advise_dont_need(file, extent.offset, extent.length);
            }
        }
    }

    /// Block `block`'s bytes in a new buffer.
    pub fn read(&self, block: usize) -> Result<Vec<u8>, BlockReadError> {
        let mut bytes = vec![0u8; self.index.blocks[block].bytes as usize];
        self.read_into(block, &mut bytes)?;
        Ok(bytes)
    }
}
