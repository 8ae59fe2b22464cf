//! O_DIRECT storage for `--fast-disk`: large aligned reads that bypass the page cache,
//! so streaming a model from disk every step neither pollutes the cache nor competes
//! with the pin budget for RAM.
//!
//! O_DIRECT wants the file offset, the memory address and the length to be multiples
//! of the logical block size. A request that satisfies that (the staging ring's slots,
//! page-aligned tensors) is read straight into its destination. Anything else — and
//! safetensors tensors usually start at arbitrary offsets after the JSON header — is
//! read through the enclosing aligned range into the worker's aligned bounce buffer and
//! copied out; a request whose start is aligned only bounces its unaligned tail.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

use stagehand_actors::{Extent, HostBuffer, OpFuture, Storage, StorageError};

use super::engine::{ReadEngine, ReadMode};
use super::file_table::{FileTable, OpenFile};
use super::worker_pool::WorkerScratch;
use super::{pread, StorageFile, StorageOptions};

/// Largest bounce read: bounds each worker's scratch memory whatever the request size.
const BOUNCE_WINDOW_BYTES: u64 = 4 << 20;

/// Reads with O_DIRECT on a pool of `reader_threads` workers; files whose filesystem
/// refuses O_DIRECT are read buffered instead (logged once).
pub struct DirectStorage {
    engine: ReadEngine,
}

impl DirectStorage {
    pub fn open(files: &[StorageFile], options: &StorageOptions) -> Result<Self, StorageError> {
        options.validate()?;
        let (table, refused) = FileTable::open(files, true)?;
        if let Some(first) = refused.first() {
            tracing::warn!(
                "O_DIRECT refused by the filesystem of {} ({} of {} files, tmpfs?): reading them with buffered pread instead",
                first.display(),
                refused.len(),
                files.len()
            );
        }
        // Requests start on aligned file offsets only if their size is a block multiple.
        let align_bytes = table.max_align_bytes();
        let request_bytes = options.read_request_bytes.div_ceil(align_bytes) * align_bytes;
        let engine = ReadEngine::start(table, options, ReadMode::Direct, request_bytes)?;
        Ok(Self { engine })
    }

    /// True when every file is being read with O_DIRECT (no fallback happened).
    pub fn is_direct(&self) -> bool {
        self.engine
            .files()
            .iter()
            .all(|file| file.direct_handle().is_some())
    }

    /// Prefix of this storage's worker thread names (tests check they all exit).
    pub fn thread_name_prefix(&self) -> &str {
        self.engine.thread_name_prefix()
    }
}

impl Storage for DirectStorage {
    fn name(&self) -> String {
        if self.is_direct() {
            "o_direct".to_string()
        } else {
            "o_direct (buffered fallback)".to_string()
        }
    }

    fn read(
        &self,
        extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        self.engine.read(extents, into, into_offset)
    }
}

enum DirectFailure {
    /// EINVAL from an O_DIRECT read: this file cannot be read directly after all.
    Refused,
    Failed(StorageError),
}

impl From<StorageError> for DirectFailure {
    fn from(error: StorageError) -> Self {
        DirectFailure::Failed(error)
    }
}

/// Fills `destination` with the file's bytes from `offset`, directly where aligned.
pub(crate) fn read_exact(
    file: &OpenFile,
    offset: u64,
    destination: &mut [u8],
    scratch: &mut WorkerScratch,
    refusal_logged: &AtomicBool,
) -> Result<(), StorageError> {
    let Some(handle) = file.direct_handle() else {
        return pread::read_exact(file, offset, destination);
    };
    match read_direct(file, handle, offset, destination, scratch) {
        Ok(()) => Ok(()),
        Err(DirectFailure::Failed(error)) => Err(error),
        Err(DirectFailure::Refused) => {
            file.direct_refused.store(true, Ordering::Relaxed);
            if !refusal_logged.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "O_DIRECT read refused (EINVAL) on {}: reading it with buffered pread from now on",
                    file.display()
                );
            }
            pread::read_exact(file, offset, destination)
        }
    }
}

fn read_direct(
    file: &OpenFile,
    handle: &File,
    offset: u64,
    destination: &mut [u8],
    scratch: &mut WorkerScratch,
) -> Result<(), DirectFailure> {
    let align_bytes = file.align_bytes;
    let length = destination.len() as u64;
    let start_aligned = offset % align_bytes == 0 && destination.as_ptr() as u64 % align_bytes == 0;
    let direct_bytes = if start_aligned {
        length / align_bytes * align_bytes
    } else {
        0
    };
    let (direct_part, bounced_part) = destination.split_at_mut(direct_bytes as usize);
    if !direct_part.is_empty() {
        let read_bytes = pread_until_eof(file, handle, direct_part, offset)?;
        if read_bytes < direct_part.len() {
            return Err(file.changed_now().into());
        }
    }
    if !bounced_part.is_empty() {
        read_through_bounce(file, handle, offset + direct_bytes, bounced_part, scratch)?;
    }
    Ok(())
}

/// Reads the aligned range enclosing `[offset, offset + destination.len())` into the
/// bounce buffer, window by window, and copies the wanted bytes out.
fn read_through_bounce(
    file: &OpenFile,
    handle: &File,
    offset: u64,
    destination: &mut [u8],
    scratch: &mut WorkerScratch,
) -> Result<(), DirectFailure> {
    let align_bytes = file.align_bytes;
    let mut done_bytes = 0usize;
    while done_bytes < destination.len() {
        let position = offset + done_bytes as u64;
        let aligned_start = position / align_bytes * align_bytes;
        let head_bytes = position - aligned_start;
        let wanted_bytes = (destination.len() - done_bytes) as u64;
        let take_bytes = wanted_bytes.min(BOUNCE_WINDOW_BYTES);
        let span_bytes = (head_bytes + take_bytes).div_ceil(align_bytes) * align_bytes;
        let bounce = scratch.bounce(span_bytes as usize, align_bytes as usize)?;
        // Near the end of the file the aligned span runs past it; the read stops at EOF.
        let read_bytes = pread_until_eof(file, handle, bounce, aligned_start)? as u64;
        if read_bytes < head_bytes + take_bytes {
            return Err(file.changed_now().into());
        }
        let from = head_bytes as usize;
        let to = from + take_bytes as usize;
        destination[done_bytes..done_bytes + take_bytes as usize]
            .copy_from_slice(&bounce[from..to]);
        done_bytes += take_bytes as usize;
    }
    Ok(())
}

/// `pread`s until `buffer` is full or the file ends; returns the bytes read.
fn pread_until_eof(
    file: &OpenFile,
    handle: &File,
    buffer: &mut [u8],
    offset: u64,
) -> Result<usize, DirectFailure> {
    let mut read_bytes = 0usize;
    // Bounded: each pass reads at least one byte or returns.
    while read_bytes < buffer.len() {
        match handle.read_at(&mut buffer[read_bytes..], offset + read_bytes as u64) {
            Ok(0) => break,
            Ok(count) => read_bytes += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                return Err(DirectFailure::Refused)
            }
            Err(error) => {
                let position = offset + read_bytes as u64;
                return Err(file
                    .io_error(
                        &format!("O_DIRECT read at offset {position} failed"),
                        &error,
                    )
                    .into());
            }
        }
    }
    Ok(read_bytes)
}
