//! A block's bytes straight from its files — plain reads, or the file's cached pages
//! mapped — for references and checksums computed outside the pipeline (never on the
//! streaming path).
//!
//! Every read first checks that the file is still the one indexed (one `fstat`): a file
//! truncated or rewritten while a reference is computed from it fails at the next
//! block, not once the run has started.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use stagehand_actors::Extent;

use super::ModelIndex;
use crate::compute::SharedBytes;
use crate::os::PageCacheView;

/// A file of the model that could not be opened or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct BlockReadError {
    pub path: PathBuf,
    pub reason: String,
    /// The read was not tried: a stop was requested (a signal).
    pub interrupted: bool,
    /// The file is no longer the one indexed (its stamp differs, or it ends early).
    pub changed: bool,
}

/// The model's files, opened once, and reads of whole blocks from them.
pub struct BlockReader<'a> {
    index: &'a ModelIndex,
    files: Vec<File>,
    /// Per file, which pages the page cache holds (`None` where it cannot be mapped:
    /// a one-off read from it then drops every page it read).
    pages: Vec<Option<PageCacheView>>,
    /// Pages [`Self::prefetch`] brought in, dropped with the reader.
    kept_pages: Mutex<Vec<(usize, (u64, u64))>>,
}

impl Drop for BlockReader<'_> {
    fn drop(&mut self) {
        let kept = std::mem::take(
            self.kept_pages
                .get_mut()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );
        self.drop_pages(&kept);
    }
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
                        changed: false,
                    })
            })
            .collect::<Result<Vec<File>, _>>()?;
        let pages = files
            .iter()
            .map(|file| PageCacheView::of(file).ok())
            .collect();
        let reader = Self {
            index,
            files,
            pages,
            kept_pages: Mutex::new(Vec::new()),
        };
        for file in 0..reader.files.len() {
            reader.check_unchanged(file)?;
        }
        Ok(reader)
    }

    /// The index whose files this reads.
    pub fn index(&self) -> &'a ModelIndex {
        self.index
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
            changed: true,
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
                changed: false,
            })?;
            self.check_unchanged(file)?;
            self.files[file]
                .read_exact_at(&mut bytes[at..at + length], extent.offset)
                .map_err(|error| BlockReadError {
                    path: self.index.files[file].path.clone(),
                    reason: error.to_string(),
                    interrupted: false,
                    // The index saw these bytes: a file that ends before them changed.
                    changed: error.kind() == std::io::ErrorKind::UnexpectedEof,
                })?;
            at += length;
        }
        Ok(())
    }

    /// Fills `bytes` as [`Self::read_extents`] does, for a one-off read (a reference,
    /// a checksum, a table copied to the host), and leaves the page cache as it found
    /// it: the pages the read brought in are dropped, those it found cached stay. A run
    /// streams its unpinned blocks from those cached pages; a reference that dropped
    /// them all made the run's next reads of them, and the read rate its bound is
    /// measured with, go to the disk. Advice only: a failure costs RAM, never bytes.
    pub fn read_once(&self, extents: &[Extent], bytes: &mut [u8]) -> Result<(), BlockReadError> {
        let brought_in = self.uncached_of(extents);
        self.read_extents(extents, bytes)?;
        self.drop_pages(&brought_in);
        Ok(())
    }

    /// Asks the kernel to bring `extents` into the page cache in the background, for
    /// one-off reads that come later (the `first` reference's, while the run's other
    /// steps compute from pinned blocks and the disk idles). The pages it brings in stay
    /// until the reader is dropped, so a [`Self::read_once`] in between finds them
    /// cached and keeps them.
    pub fn prefetch(&self, extents: &[Extent]) {
        let brought_in = self.uncached_of(extents);
        for &(file, (start, end)) in &brought_in {
            if let Some(file) = self.files.get(file) {
                let _ = crate::os::advise_will_need(file, start, end - start);
            }
        }
        if let Ok(mut kept) = self.kept_pages.lock() {
            kept.extend(brought_in);
        }
    }

    /// The ranges of `extents` the page cache does not hold now, by file (the whole
    /// extent where the file could not be mapped).
    fn uncached_of(&self, extents: &[Extent]) -> Vec<(usize, (u64, u64))> {
        let mut uncached = Vec::new();
        for extent in extents {
            let file = extent.file.0 as usize;
            let whole = vec![(extent.offset, extent.offset + extent.length)];
            let ranges = match self.pages.get(file) {
                Some(Some(view)) => view
                    .uncached_within(extent.offset, extent.length)
                    .unwrap_or(whole),
                _ => whole,
            };
            uncached.extend(ranges.into_iter().map(|range| (file, range)));
        }
        uncached
    }

    fn drop_pages(&self, ranges: &[(usize, (u64, u64))]) {
        for &(file, (start, end)) in ranges {
            if let Some(file) = self.files.get(file) {
                let _ = crate::os::advise_dont_need(file, start, end - start);
            }
        }
    }

    /// `extents`' bytes where they are one range of one file and the page cache holds
    /// all of it: the file's own cached pages, mapped, nothing copied — the reference
    /// computes from them in place (MiniLM: 43 MB that a read copied at ~3 GB/s on a
    /// 2-vCPU VM, 15–40 ms a run). `None` otherwise, or where the file changed since it
    /// was indexed: read them then ([`Self::read_once`]), which says what is wrong.
    pub fn cached(&self, extents: &[Extent]) -> Option<SharedBytes> {
        let [extent] = extents else {
            return None;
        };
        let file = extent.file.0 as usize;
        self.check_unchanged(file).ok()?;
        let view = self.pages.get(file)?.as_ref()?;
        let uncached = view.uncached_within(extent.offset, extent.length).ok()?;
        if !uncached.is_empty() {
            return None;
        }
        let range = view.map_range(extent.offset, extent.length)?;
        Some(SharedBytes::new(Arc::new(range)))
    }

    /// Block `block`'s bytes in a new buffer, read once ([`Self::read_once`]).
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
                changed: false,
            })?;
        bytes.resize(length as usize, 0);
        self.read_once(&self.index.blocks[block].extents, &mut bytes)?;
        Ok(bytes)
    }
}
