//! The file the disk measurements read: the user's own (nothing is written), or a
//! scratch file of seeded bytes written in the model's directory and removed on drop.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::PROBE_BYTES;

/// Bytes written per `write` call of the scratch file.
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// The file read: the user's, or a scratch file removed on drop.
pub(super) enum Target {
    Existing {
        path: PathBuf,
        bytes: u64,
        file_bytes: u64,
    },
    Scratch(ScratchFile),
}

impl Target {
    pub(super) fn path(&self) -> &Path {
        match self {
            Target::Existing { path, .. } => path,
            Target::Scratch(scratch) => &scratch.path,
        }
    }

    /// Bytes each pass reads.
    pub(super) fn bytes(&self) -> u64 {
        match self {
            Target::Existing { bytes, .. } => *bytes,
            Target::Scratch(scratch) => scratch.bytes,
        }
    }

    pub(super) fn file_bytes(&self) -> u64 {
        match self {
            Target::Existing { file_bytes, .. } => *file_bytes,
            Target::Scratch(scratch) => scratch.bytes,
        }
    }
}

pub(super) fn existing_file(path: &Path, wanted: u64) -> Result<Target, String> {
    let metadata = std::fs::metadata(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let file_bytes = metadata.len();
    // Whole 4 KiB pages only, so O_DIRECT passes read aligned lengths.
    let bytes = wanted.min(file_bytes) / PROBE_BYTES * PROBE_BYTES;
    if bytes < PROBE_BYTES {
        return Err(format!(
            "{} has {file_bytes} bytes: too small to time reads on",
            path.display()
        ));
    }
    Ok(Target::Existing {
        path: path.to_path_buf(),
        bytes,
        file_bytes,
    })
}

/// A file of seeded bytes written for the measurement and removed afterwards.
pub(super) struct ScratchFile {
    path: PathBuf,
    bytes: u64,
}

impl ScratchFile {
    pub(super) fn write(dir: &Path, bytes: u64) -> Result<Self, String> {
        let bytes = bytes.max(PROBE_BYTES) / PROBE_BYTES * PROBE_BYTES;
        let path = dir.join(format!(".stagehand-calibrate-{}.bin", std::process::id()));
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|error| why_not_written(dir, &error))?;
        let scratch = Self { path, bytes };
        let mut chunk = vec![0u8; WRITE_CHUNK_BYTES];
        let mut random = crate::sim::SplitMix64::new(bytes);
        let mut written = 0u64;
        while written < bytes {
            let length = (bytes - written).min(WRITE_CHUNK_BYTES as u64) as usize;
            for word in chunk[..length].chunks_mut(8) {
                let value = random.next_u64().to_le_bytes();
                word.copy_from_slice(&value[..word.len()]);
            }
            file.write_all(&chunk[..length])
                .map_err(|error| why_not_written(dir, &error))?;
            written += length as u64;
        }
        file.sync_all()
            .map_err(|error| why_not_written(dir, &error))?;
        Ok(scratch)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The reason a scratch file could not be written, in words a user can act on.
fn why_not_written(dir: &Path, error: &io::Error) -> String {
    let dir = dir.display();
    match error.raw_os_error() {
        Some(libc::EROFS) => format!(
            "{dir} is on a read-only filesystem; give an existing file there with --file to measure reads without writing"
        ),
        Some(libc::ENOSPC) | Some(libc::EDQUOT) => format!(
            "the filesystem of {dir} is full (or over quota): free some space, lower --disk-bytes, or give an existing file with --file"
        ),
        Some(libc::EACCES) | Some(libc::EPERM) => format!(
            "no permission to write in {dir}; give an existing file there with --file"
        ),
        Some(libc::ENOENT) | Some(libc::ENOTDIR) => format!("{dir} is not a directory"),
        _ => format!("cannot write a scratch file in {dir}: {error}"),
    }
}
