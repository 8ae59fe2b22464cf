//! Plain reads of a block's bytes straight from its files, for references and
//! checksums computed outside the pipeline (never on the streaming path).
//!
//! Every read first checks that the file is still the one indexed (one `fstat`): a file
//! truncated or rewritten while a reference is computed from it fails at the next
//! block, not once the run has started.

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
    /// The read was not tried: a stop was requested (a signal).
    pub interrupted: bool,
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
                super::open_regular(&shard.path)
                    .map(|(file, _)| file)
                    .map_err(|error| BlockReadError {
                        path: shard.path.clone(),
                        reason: error.to_string(),
                        interrupted: false,
                    })
            })
            .collect::<Result<Vec<File>, _>>()?;
        let reader = Self { index, files };
        for file in 0..reader.files.len() {
            reader.check_unchanged(file)?;
        }
        Ok(reader)
    }

    /// Fails unless file `file` is still what the index read (length, times, inode).
    fn check_unchanged(&self, file: usize) -> Result<(), BlockReadError> {
        let shard = &self.index.files[file];
        let Some(stamp) = shard.stamp else {
            return Ok(());
        };
        let changed = |reason: String| BlockReadError {
            path: shard.path.clone(),
            reason,
            interrupted: false,
        };
        let now = self.files[file]
            .metadata()
            .map_err(|error| changed(format!("fstat failed: {error}")))?;
        match stamp.difference(&super::FileStamp::of(&now)) {
            None => Ok(()),
            Some(difference) => Err(changed(format!(
                "the file changed while it was being read ({difference}); run again once \
                 nothing writes to it"
            ))),
        }
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
            // Between reads: a stop request ends a long reference or checksum pass here.
            crate::signals::check().map_err(|interrupted| BlockReadError {
                path: self.index.files[file].path.clone(),
                reason: interrupted.to_string(),
                interrupted: true,
            })?;
            self.check_unchanged(file)?;
            self.files[file]
                .read_exact_at(&mut bytes[at..at + length], extent.offset)
                .map_err(|error| BlockReadError {
                    path: self.index.files[file].path.clone(),
                    reason: error.to_string(),
                    interrupted: false,
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
                let _ = crate::os::advise_dont_need(file, extent.offset, extent.length);
            }
        }
    }

    /// Block `block`'s bytes in a new buffer.
    pub fn read(&self, block: usize) -> Result<Vec<u8>, BlockReadError> {
        let length = self.index.blocks[block].bytes;
        let mut bytes = Vec::new();
        // A block larger than memory is an error to report, not an abort.
        bytes
            .try_reserve_exact(usize::try_from(length).unwrap_or(usize::MAX))
            .map_err(|_| BlockReadError {
                path: self.index.path.clone(),
                reason: format!(
                    "block `{}` is {length} bytes, more than this machine can hold in memory",
                    self.index.blocks[block].name
                ),
                interrupted: false,
            })?;
        bytes.resize(length as usize, 0);
        self.read_into(block, &mut bytes)?;
        Ok(bytes)
    }
}
