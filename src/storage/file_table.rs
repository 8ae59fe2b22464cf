//! The files a storage serves: open handles, the identity each had at open, and the
//! checks that turn a file changed under a running session into `FileChanged`.
//!
//! Reads go through `pread` on file descriptors, never through a mapping, so a file
//! truncated under us shows up as a short read or a length mismatch, never as SIGBUS.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use stagehand_actors::{FileId, StorageError};

use super::StorageFile;

/// O_DIRECT alignment used when the filesystem does not ask for more. Linux exposes the
/// logical block size only for block devices (`ioctl BLKSSZGET`), not for a regular
/// file, and 4096 covers every common disk (512e and 4Kn alike).
pub(crate) const DEFAULT_DIRECT_ALIGN_BYTES: u64 = 4096;
/// `st_blksize` above this is a preferred I/O size (RAID stripe, NFS rsize), not a
/// block size we must align to; we ignore it rather than bounce megabytes per tensor.
const MAX_DIRECT_ALIGN_BYTES: u64 = 64 << 10;

/// What a file looked like at open: a different inode at the path, another length or
/// another modification time later means it was replaced, truncated or rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    device: u64,
    inode: u64,
    modified_seconds: i64,
    modified_nanoseconds: i64,
}

impl FileIdentity {
    fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            modified_seconds: metadata.mtime(),
            modified_nanoseconds: metadata.mtime_nsec(),
        }
    }
}

pub(crate) struct OpenFile {
    pub path: PathBuf,
    pub buffered: File,
    /// The O_DIRECT handle; `None` when not asked for or refused by the filesystem.
    pub direct: Option<File>,
    /// Set when an O_DIRECT read failed with EINVAL: later reads of this file go buffered.
    pub direct_refused: AtomicBool,
    pub expected_bytes: u64,
    /// File offsets and memory addresses of O_DIRECT reads are multiples of this.
    pub align_bytes: u64,
    identity: FileIdentity,
}

impl OpenFile {
    pub fn display(&self) -> String {
        self.path.display().to_string()
    }

    pub fn io_error(&self, what: &str, error: &io::Error) -> StorageError {
        StorageError::Io {
            path: self.display(),
            reason: format!("{what}: {error}"),
        }
    }

    /// The O_DIRECT handle while O_DIRECT still works for this file.
    pub fn direct_handle(&self) -> Option<&File> {
        if self.direct_refused.load(Ordering::Relaxed) {
            return None;
        }
        self.direct.as_ref()
    }

    /// Fails with `FileChanged` unless the file is still the one opened, at its length.
    /// One `fstat` and one `stat` per read request: microseconds against a multi-MiB read.
    pub fn check_unchanged(&self) -> Result<(), StorageError> {
        let metadata = self
            .buffered
            .metadata()
            .map_err(|error| self.io_error("fstat failed", &error))?;
        let found_bytes = metadata.len();
        if found_bytes != self.expected_bytes || FileIdentity::of(&metadata) != self.identity {
            return Err(self.changed(found_bytes));
        }
        // A file replaced by rename keeps our descriptor on the old inode: look at the path.
        match std::fs::metadata(&self.path) {
            Ok(at_path) => {
                let identity = FileIdentity::of(&at_path);
                if identity.device != self.identity.device || identity.inode != self.identity.inode
                {
                    return Err(self.changed(at_path.len()));
                }
                Ok(())
            }
            Err(_) => Err(self.changed(0)),
        }
    }

    /// The error for a short read: the file got shorter than the extents we were given.
    pub fn changed_now(&self) -> StorageError {
        let found_bytes = self
            .buffered
            .metadata()
            .map(|metadata| metadata.len())
            .unwrap_or(0);
        self.changed(found_bytes)
    }

    fn changed(&self, found_bytes: u64) -> StorageError {
        StorageError::FileChanged {
            path: self.display(),
            expected_bytes: self.expected_bytes,
            found_bytes,
        }
    }
}

pub(crate) struct FileTable {
    files: Vec<OpenFile>,
}

impl FileTable {
    /// Opens every file, with an O_DIRECT handle too when `direct`. Returns the table and
    /// the paths whose filesystem refused O_DIRECT (they will be read buffered).
    pub fn open(files: &[StorageFile], direct: bool) -> Result<(Self, Vec<PathBuf>), StorageError> {
        let mut opened = Vec::with_capacity(files.len());
        let mut refused = Vec::new();
        for file in files {
            let open_file = open_one(file, direct)?;
            if direct && open_file.direct.is_none() {
                refused.push(file.path.clone());
            }
            opened.push(open_file);
        }
        Ok((Self { files: opened }, refused))
    }

    pub fn get(&self, id: FileId) -> Result<&OpenFile, StorageError> {
        self.files
            .get(id.0 as usize)
            .ok_or(StorageError::UnknownFile(id))
    }

    pub fn iter(&self) -> impl Iterator<Item = &OpenFile> {
        self.files.iter()
    }

    /// The largest O_DIRECT alignment of any file (sizes the bounce buffers).
    pub fn max_align_bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|file| file.align_bytes)
            .max()
            .unwrap_or(DEFAULT_DIRECT_ALIGN_BYTES)
    }
}

fn open_one(file: &StorageFile, direct: bool) -> Result<OpenFile, StorageError> {
    let display = file.path.display().to_string();
    // O_NONBLOCK: a path swapped for a FIFO fails the checks below instead of
    // blocking the open; it changes nothing for a regular file.
    let buffered = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&file.path)
        .map_err(|error| StorageError::Io {
            path: display.clone(),
            reason: format!("cannot open: {error}; check the path and its permissions"),
        })?;
    let metadata = buffered.metadata().map_err(|error| StorageError::Io {
        path: display.clone(),
        reason: format!("fstat failed: {error}"),
    })?;
    if !metadata.is_file() {
        return Err(StorageError::Io {
            path: display,
            reason: "not a regular file".to_string(),
        });
    }
    if metadata.len() != file.expected_bytes {
        return Err(StorageError::FileChanged {
            path: display,
            expected_bytes: file.expected_bytes,
            found_bytes: metadata.len(),
        });
    }
    let direct_handle = if direct {
        direct_open_outcome(open_direct(&file.path)).map_err(|error| StorageError::Io {
            path: display.clone(),
            reason: format!("cannot open with O_DIRECT: {error}"),
        })?
    } else {
        None
    };
    Ok(OpenFile {
        path: file.path.clone(),
        buffered,
        direct: direct_handle,
        direct_refused: AtomicBool::new(false),
        expected_bytes: file.expected_bytes,
        align_bytes: direct_align_bytes(metadata.blksize()),
        identity: FileIdentity::of(&metadata),
    })
}

fn open_direct(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_NONBLOCK)
        .open(path)
}

/// EINVAL from an O_DIRECT open means "this filesystem does not do direct I/O" (tmpfs
/// before Linux 6.6, some FUSE mounts): read buffered instead. Any other error is real.
pub(crate) fn direct_open_outcome(result: io::Result<File>) -> io::Result<Option<File>> {
    match result {
        Ok(file) => Ok(Some(file)),
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => Ok(None),
        Err(error) => Err(error),
    }
}

/// 4096 unless the filesystem's `st_blksize` is a larger power of two (up to 64 KiB).
pub(crate) fn direct_align_bytes(st_blksize: u64) -> u64 {
    if st_blksize.is_power_of_two()
        && st_blksize > DEFAULT_DIRECT_ALIGN_BYTES
        && st_blksize <= MAX_DIRECT_ALIGN_BYTES
    {
        st_blksize
    } else {
        DEFAULT_DIRECT_ALIGN_BYTES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn einval_at_direct_open_means_fall_back_and_other_errors_fail() {
        let refused = direct_open_outcome(Err(io::Error::from_raw_os_error(libc::EINVAL)));
        assert!(matches!(refused, Ok(None)));
        let denied = direct_open_outcome(Err(io::Error::from_raw_os_error(libc::EACCES)));
        assert!(denied.is_err());
    }

    #[test]
    fn alignment_is_4096_unless_blksize_is_a_larger_sane_power_of_two() {
        assert_eq!(direct_align_bytes(512), 4096);
        assert_eq!(direct_align_bytes(4096), 4096);
        assert_eq!(direct_align_bytes(16384), 16384);
        assert_eq!(direct_align_bytes(3 << 12), 4096);
        assert_eq!(direct_align_bytes(1 << 20), 4096);
    }
}
