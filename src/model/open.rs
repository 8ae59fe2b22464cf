//! Opening an input file so that nothing about it can hang the process.
//!
//! `open` of a FIFO for reading blocks until a writer appears, forever if none does,
//! and a check of the path before opening it races with whoever replaces the path. So
//! the file is opened with `O_NONBLOCK` (which makes `open` of a FIFO return at once
//! and changes nothing for a regular file) and then `fstat`ed: what was opened is what
//! is checked.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

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
