//! Opening an input file so that nothing about it can hang the process.
//!
//! `open` of a FIFO for reading blocks until a writer appears, forever if none does,
//! and a check of the path before opening it races with whoever replaces the path. So
//! the file is opened with `O_NONBLOCK` (which makes `open` of a FIFO return at once
//! and changes nothing for a regular file) and then `fstat`ed: what was opened is what
//! is checked.

use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// What a file looked like when it was read: any write (its modification and change
/// times), truncation (its length) or replacement (its inode) gives another stamp. The
/// change time cannot be set back by `touch`, so a rewrite never passes for the file
/// that was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
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

/// Writes `path` so that a reader, and whoever runs after a crash or a `kill -9`,
/// sees the whole new file or none of it: the bytes go into an unnamed file
/// (`O_TMPFILE`) in `path`'s folder, which is synced and only then given a name
/// (`linkat`) and renamed over `path`. A writer killed midway leaves nothing behind.
/// Where the filesystem has no `O_TMPFILE`, a named `.<name>.<pid>.tmp` takes its place
/// (removed on failure, and by [`remove_stale_temporaries`] after a crash).
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|dir| !dir.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?
        .to_string_lossy()
        .into_owned();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = match open_unnamed(dir) {
        Ok(file) => write_unnamed(file, &temp, path, write),
        Err(error) if unnamed_unsupported(&error) => write_named(&temp, path, write),
        Err(error) => Err(error),
    };
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result?;
    // The rename is durable once the folder is synced.
    File::open(dir).and_then(|folder| folder.sync_all())
}

/// An unnamed regular file in `dir`, visible to no one until it is linked.
fn open_unnamed(dir: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .read(true)
        .mode(0o644)
        .custom_flags(libc::O_TMPFILE)
        .open(dir)
}

/// Errors that mean "this filesystem (or kernel) has no `O_TMPFILE`".
fn unnamed_unsupported(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL) | Some(libc::ENOENT)
    )
}

fn write_unnamed(
    file: File,
    temp: &Path,
    path: &Path,
    write: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<()> {
    write(&file)?;
    file.sync_all()?;
    // The file gets a name only now, complete; the rename then replaces `path` in one
    // step (linkat cannot replace an existing name).
    let source = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let target = std::ffi::CString::new(temp.as_os_str().as_bytes())
        .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let _ = std::fs::remove_file(temp);
    // SAFETY: both paths are NUL-terminated C strings that outlive the call; no memory
    // is shared with the kernel beyond them.
    let status = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            source.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if status != 0 {
        return Err(io::Error::last_os_error());
    }
    std::fs::rename(temp, path)
}

fn write_named(
    temp: &Path,
    path: &Path,
    write: impl FnOnce(&File) -> io::Result<()>,
) -> io::Result<()> {
    let file = File::create(temp)?;
    write(&file)?;
    file.sync_all()?;
    std::fs::rename(temp, path)
}

/// Removes `.<name>.<pid>.tmp` files in `dir` whose process no longer exists (left by
/// a writer killed on a filesystem without `O_TMPFILE`).
pub fn remove_stale_temporaries(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let own = std::process::id();
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(owner) = file_name.to_str().and_then(temporary_owner) else {
            continue;
        };
        if owner == own || Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        match std::fs::remove_file(entry.path()) {
            Ok(()) => tracing::info!(
                "removed {} (left by process {owner}, which no longer runs)",
                entry.path().display()
            ),
            Err(error) => tracing::debug!("{}: {error}", entry.path().display()),
        }
    }
}

/// The pid in a temporary file's name `.<name>.<pid>.tmp`.
fn temporary_owner(file_name: &str) -> Option<u32> {
    let stem = file_name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (_, pid) = stem.rsplit_once('.')?;
    pid.parse().ok().filter(|&pid| pid > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_temporary_names_with_a_pid_are_recognised() {
        // Proves stale-file cleaning touches nothing but `.<name>.<pid>.tmp`.
        assert_eq!(
            temporary_owner(".linear-stack.safetensors.123.tmp"),
            Some(123)
        );
        assert_eq!(temporary_owner("linear-stack.safetensors"), None);
        assert_eq!(temporary_owner(".linear-stack.safetensors.lock"), None);
        assert_eq!(temporary_owner(".x.abc.tmp"), None);
        assert_eq!(temporary_owner(".x.0.tmp"), None);
        assert_eq!(temporary_owner("x.12.tmp"), None);
    }

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
