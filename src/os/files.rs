//! Opening an input file so that nothing about it can hang the process.
//!
//! `open` of a FIFO for reading blocks until a writer appears, forever if none does,
//! and a check of the path before opening it races with whoever replaces the path. So
//! the file is opened with `O_NONBLOCK` (which makes `open` of a FIFO return at once
//! and changes nothing for a regular file) and then `fstat`ed: what was opened is what
//! is checked.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// What a file looked like when it was read: any write (its modification and change
/// times), truncation (its length) or replacement (its inode) gives another stamp. The
/// change time cannot be set back by `touch`, so a rewrite never passes for the file
/// that was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub device: u64,
    pub inode: u64,
    pub bytes: u64,
    pub modified_ns: i128,
    pub changed_ns: i128,
}

impl FileStamp {
    pub fn of(metadata: &Metadata) -> Self {
        let nanoseconds = |seconds: i64, nanoseconds: i64| {
            i128::from(seconds) * 1_000_000_000 + i128::from(nanoseconds)
        };
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            bytes: metadata.len(),
            modified_ns: nanoseconds(metadata.mtime(), metadata.mtime_nsec()),
            changed_ns: nanoseconds(metadata.ctime(), metadata.ctime_nsec()),
        }
    }

    /// What is different now, in words; `None` if nothing is.
    pub fn difference(&self, now: &FileStamp) -> Option<String> {
        if now.device != self.device || now.inode != self.inode {
            return Some("it was replaced by another file".to_string());
        }
        if now.bytes != self.bytes {
            return Some(format!(
                "its length went from {} to {} bytes",
                self.bytes, now.bytes
            ));
        }
        if now.modified_ns != self.modified_ns || now.changed_ns != self.changed_ns {
            return Some("it was written to".to_string());
        }
        None
    }
}

/// Opens `path` for reading if it is a regular file; an error saying what it is
/// otherwise (a FIFO, a socket, a device, a folder).
pub fn open_regular(path: &Path) -> io::Result<(File, Metadata)> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let metadata = file.metadata()?;
    let file_type = metadata.file_type();
    if file_type.is_file() {
        return Ok((file, metadata));
    }
    let what = if file_type.is_dir() {
        "a folder"
    } else if file_type.is_fifo() {
        "a FIFO (named pipe)"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_block_device() || file_type.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("not a regular file: it is {what}"),
    ))
}

/// Creates (or truncates) `path` for writing if it is, or will be, a regular file. A
/// FIFO with no reader fails at once (ENXIO) instead of blocking, and one with a reader
/// is refused too: output goes to files.
pub fn create_regular(path: &Path) -> io::Result<File> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    let file_type = file.metadata()?.file_type();
    if !file_type.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, a socket or a device); write to a file",
        ));
    }
    // Truncated only now that it is known to be a regular file.
    file.set_len(0)?;
    Ok(file)
}

/// The whole of a regular file of at most `max_bytes` bytes.
pub fn read_regular(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    let (file, metadata) = open_regular(path)?;
    if metadata.len() > max_bytes {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} bytes is more than the {max_bytes} this file may hold",
                metadata.len()
            ),
        ));
    }
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(metadata.len() as usize)
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("{} bytes do not fit in memory", metadata.len()),
            )
        })?;
    // A file that grew since the fstat is read only up to the limit.
    io::Read::read_to_end(&mut io::Read::take(file, max_bytes), &mut bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_at_once_instead_of_blocking() {
        // Proves opening a FIFO with no writer returns an error instead of waiting.
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let error = open_regular(&fifo).unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
        let error = open_regular(dir.path()).unwrap_err();
        assert!(error.to_string().contains("folder"), "{error}");
        std::fs::write(dir.path().join("file"), b"x").unwrap();
        let (_, metadata) = open_regular(&dir.path().join("file")).unwrap();
        assert_eq!(metadata.len(), 1);
    }
}
