//! The cache of generated models (`stagehand run` with no `--model`): written once,
//! shared by every run on the machine, never trusted blindly.
//!
//! - A model is written to `.<name>.<pid>.tmp` and renamed into place when complete
//!   (and synced), so the real name only ever holds a whole file. Temporary files
//!   whose process no longer exists (`/proc/<pid>` is gone: killed, crashed) are
//!   removed at the next start; those of live processes are left alone.
//! - Concurrent fills of one entry are serialised by a lock file (`.<name>.lock`,
//!   `flock`): one process writes, the others wait (a stop request ends the wait) and
//!   then reuse what it wrote. A valid model is never rewritten, so a run that has it
//!   open never sees it change under it.
//! - A generated model carries its data checksum in its header. The first use of a
//!   file checks it and records the file's stamp (inode, length, times) in
//!   `.<name>.verified`; later uses of the same, untouched file skip the read. A file
//!   that fails the check — zeroed, truncated inside, rewritten — is rebuilt, never
//!   used: a run would otherwise compute its reference from the same corrupt bytes and
//!   report it as verified.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::checksum::{verify_data_checksum, DATA_CHECKSUM_KEY};
use super::demo::{write_linear_stack_file, DemoSpec, LINEAR_STACK_FILE};
use super::demo_moe::{write_moe_file, MoeSpec, MOE_FILE};
use super::{FileStamp, ModelIndex};
use crate::signals::Interrupted;

/// Why the cache could not provide a model.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache folder cannot be used (bad input: exit 2).
    #[error("cache folder {}: {reason}; pass --cache-dir DIR", path.display())]
    Folder { path: PathBuf, reason: String },
    /// Writing the model failed (exit 1).
    #[error("{}: {reason}", path.display())]
    Write { path: PathBuf, reason: String },
    #[error("{0}")]
    Interrupted(#[from] Interrupted),
}

/// The demo model in `cache_dir`, written if missing, different or corrupt.
pub fn ensure_demo_model(cache_dir: &Path, spec: &DemoSpec) -> Result<PathBuf, CacheError> {
    spec.validate().map_err(|error| CacheError::Write {
        path: cache_dir.join(LINEAR_STACK_FILE),
        reason: error.to_string(),
    })?;
    ensure(
        cache_dir,
        LINEAR_STACK_FILE,
        &|index| DemoSpec::from_metadata(&index.metadata).as_ref() == Some(spec),
        &|file| write_linear_stack_file(file, spec),
    )
}

/// The MoE demo model in `cache_dir`, written if missing, different or corrupt.
pub fn ensure_moe_model(cache_dir: &Path, spec: &MoeSpec) -> Result<PathBuf, CacheError> {
    spec.validate().map_err(|error| CacheError::Write {
        path: cache_dir.join(MOE_FILE),
        reason: error.to_string(),
    })?;
    ensure(
        cache_dir,
        MOE_FILE,
        &|index| MoeSpec::from_metadata(&index.metadata).as_ref() == Some(spec),
        &|file| write_moe_file(file, spec),
    )
}

/// What is at an entry's path now.
enum Found {
    /// The wanted model, checked since it was last changed.
    Ready,
    /// The wanted model, not checked in this state yet.
    Unchecked(ModelIndex),
    /// Nothing, or another model (another spec, not a model at all).
    Missing,
}

fn ensure(
    dir: &Path,
    name: &str,
    wanted: &dyn Fn(&ModelIndex) -> bool,
    write: &dyn Fn(&File) -> io::Result<()>,
) -> Result<PathBuf, CacheError> {
    std::fs::create_dir_all(dir).map_err(|error| CacheError::Folder {
        path: dir.to_path_buf(),
        reason: error.to_string(),
    })?;
    remove_stale_temporaries(dir);
    let path = dir.join(name);
    // Without the lock first: the common case is a model checked by an earlier run.
    if let Found::Ready = look(dir, name, wanted) {
        return Ok(path);
    }
    let _lock = EntryLock::acquire(dir, name)?;
    // Another process may have written or checked it while we waited.
    match look(dir, name, wanted) {
        Found::Ready => return Ok(path),
        Found::Unchecked(index) => match verify_data_checksum(&index) {
            Ok(stamp) => {
                record_checked(dir, name, &stamp);
                return Ok(path);
            }
            Err(problem) => {
                // A check cut short by a stop request says nothing about the file.
                crate::signals::check()?;
                tracing::warn!("{}: {problem}; writing it again", path.display());
            }
        },
        Found::Missing => {}
    }
    tracing::info!("writing {} to the cache", path.display());
    let write_error = |error: io::Error| match crate::signals::check() {
        Err(interrupted) => CacheError::Interrupted(interrupted),
        Ok(()) => CacheError::Write {
            path: path.clone(),
            reason: error.to_string(),
        },
    };
    write_atomically(&path, write).map_err(write_error)?;
    // Checked as it was written: the writer hashed the bytes it wrote.
    let stamp = std::fs::metadata(&path)
        .map(|metadata| FileStamp::of(&metadata))
        .map_err(write_error)?;
    record_checked(dir, name, &stamp);
    Ok(path)
}

fn look(dir: &Path, name: &str, wanted: &dyn Fn(&ModelIndex) -> bool) -> Found {
    let Ok(index) = ModelIndex::open(&dir.join(name), None) else {
        return Found::Missing;
    };
    if !wanted(&index) || !index.metadata.contains_key(DATA_CHECKSUM_KEY) {
        return Found::Missing;
    }
    let checked = read_checked(dir, name);
    match (checked, index.files.first().and_then(|file| file.stamp)) {
        (Some(checked), Some(now)) if checked == now => Found::Ready,
        _ => Found::Unchecked(index),
    }
}

fn checked_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!(".{name}.verified"))
}

/// The stamp of the file as it was last checked, if recorded.
fn read_checked(dir: &Path, name: &str) -> Option<FileStamp> {
    let text = std::fs::read_to_string(checked_path(dir, name)).ok()?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [device, inode, bytes, modified_ns, changed_ns] = fields.as_slice() else {
        return None;
    };
    Some(FileStamp {
        device: device.parse().ok()?,
        inode: inode.parse().ok()?,
        bytes: bytes.parse().ok()?,
        modified_ns: modified_ns.parse().ok()?,
        changed_ns: changed_ns.parse().ok()?,
    })
}

/// Records that the file with `stamp` passed its check. Best effort: without the
/// record the next run checks again.
fn record_checked(dir: &Path, name: &str, stamp: &FileStamp) {
    let text = format!(
        "{} {} {} {} {}\n",
        stamp.device, stamp.inode, stamp.bytes, stamp.modified_ns, stamp.changed_ns
    );
    let path = checked_path(dir, name);
    let written = write_atomically(&path, |mut file| {
        io::Write::write_all(&mut file, text.as_bytes())
    });
    if let Err(error) = written {
        tracing::debug!("{}: {error}", path.display());
    }
}

pub use crate::os::{remove_stale_temporaries, write_atomically};

/// An exclusive `flock` on `.<name>.lock`, released when dropped (or when the process
/// dies: the kernel drops it with the descriptor, so a killed writer never leaves the
/// entry locked).
struct EntryLock {
    _file: File,
}

/// How often a waiting process tries the lock again.
const LOCK_POLL: Duration = Duration::from_millis(50);

impl EntryLock {
    fn acquire(dir: &Path, name: &str) -> Result<Self, CacheError> {
        let path = dir.join(format!(".{name}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|error| CacheError::Folder {
                path: path.clone(),
                reason: error.to_string(),
            })?;
        let mut told = false;
        loop {
            // SAFETY: a valid open descriptor; flock has no memory effects.
            let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if locked == 0 {
                return Ok(Self { _file: file });
            }
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
                return Err(CacheError::Folder {
                    path,
                    reason: format!("cannot lock: {error}"),
                });
            }
            if !told {
                tracing::info!("waiting for another stagehand process writing {name} to finish");
                told = true;
            }
            crate::signals::check()?;
            std::thread::sleep(LOCK_POLL);
        }
    }
}
