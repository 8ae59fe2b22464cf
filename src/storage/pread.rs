//! Buffered `pread` storage: the default adapter, where pinned RAM is the cache.

use std::io;
use std::os::unix::fs::FileExt;

use stagehand_actors::{Extent, HostBuffer, OpFuture, Storage, StorageError};

use super::engine::{ReadEngine, ReadMode};
use super::file_table::{FileTable, OpenFile};
use super::{StorageFile, StorageOptions};

/// Reads with buffered `pread` on a pool of `reader_threads` workers.
pub struct PreadStorage {
    engine: ReadEngine,
}

impl PreadStorage {
    /// Opens the files (index = `FileId`) and starts the workers. A file missing or of
    /// another length than `expected_bytes` is an error now, not at the first read.
    pub fn open(files: &[StorageFile], options: &StorageOptions) -> Result<Self, StorageError> {
        options.validate()?;
        let (table, _) = FileTable::open(files, false)?;
        let engine = ReadEngine::start(
            table,
            options,
            ReadMode::Buffered,
            options.read_request_bytes,
        )?;
        Ok(Self { engine })
    }

    /// Prefix of this storage's worker thread names (tests check they all exit).
    pub fn thread_name_prefix(&self) -> &str {
        self.engine.thread_name_prefix()
    }
}

impl Storage for PreadStorage {
    fn name(&self) -> String {
        "pread".to_string()
    }

    fn read(
        &self,
        extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        self.engine.read(extents, into, into_offset)
    }

    fn forget_cached(&self, extents: &[Extent]) {
        for extent in extents {
            if let Ok(file) = self.engine.files().get(extent.file) {
                // Whole ranges at once: the kernel skips folios a range only partly covers.
                let _ = super::drop_page_cache(&file.path, extent.offset, extent.length);
            }
        }
    }
}

/// Fills `destination` from `offset`; a short read means the file shrank under us.
pub(crate) fn read_exact(
    file: &OpenFile,
    offset: u64,
    destination: &mut [u8],
) -> Result<(), StorageError> {
    match file.buffered.read_exact_at(destination, offset) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => Err(file.changed_now()),
        Err(error) => Err(file.io_error(&format!("read at offset {offset} failed"), &error)),
    }
}
