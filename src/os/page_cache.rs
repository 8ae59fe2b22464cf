//! Page-cache control: dropping a file's cached pages once their bytes live elsewhere
//! (a pinned copy), and measuring how much of a file the cache holds.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use stagehand_actors::StorageError;

/// Advises the kernel to drop the page cache of `path[offset .. offset + len]`
/// (`len == 0`: to the end of the file). Once a block has a pinned copy its file pages
/// are a second copy of the same bytes; dropping them keeps RAM for the pin budget.
/// Dirty pages are not dropped (the kernel writes them back first on its own time), and
/// neither are large folios the range covers only in part: advise whole blocks, not
/// tensor by tensor.
pub fn drop_page_cache(path: &Path, offset: u64, len: u64) -> Result<(), StorageError> {
    let io_error = |what: &str, error: io::Error| StorageError::Io {
        path: path.display().to_string(),
        reason: format!("{what}: {error}"),
    };
    let file = File::open(path).map_err(|error| io_error("cannot open", error))?;
    advise_dont_need(&file, offset, len)
        .map_err(|error| io_error("posix_fadvise(DONTNEED) failed", error))
}

/// `posix_fadvise(DONTNEED)` on a range of an open file: the kernel may drop those
/// pages from the page cache.
pub fn advise_dont_need(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let offset = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let status =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
    // posix_fadvise returns the error number instead of setting errno.
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(status))
    }
}

/// Bytes of `path` currently in the page cache (`mincore` over a mapping that is never
/// touched, so measuring does not fault anything in).
pub fn cached_bytes(path: &Path) -> Result<u64, StorageError> {
    let io_error = |what: &str, error: io::Error| StorageError::Io {
        path: path.display().to_string(),
        reason: format!("{what}: {error}"),
    };
    let file = File::open(path).map_err(|error| io_error("cannot open", error))?;
    let file_bytes = file
        .metadata()
        .map_err(|error| io_error("fstat failed", error))?
        .len();
    if file_bytes == 0 {
        return Ok(0);
    }
    // SAFETY: the mapping is only passed to mincore, never read, so a concurrent
    // truncation cannot fault us.
    let mapping = unsafe { memmap2::Mmap::map(&file) }
        .map_err(|error| io_error("mmap for mincore failed", error))?;
    // SAFETY: sysconf has no preconditions.
    let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    let pages = file_bytes.div_ceil(page_bytes) as usize;
    let mut residency = vec![0u8; pages];
    // SAFETY: the mapping is `file_bytes` long and page-aligned; `residency` has one
    // byte per page of it, as mincore requires.
    let status = unsafe {
        libc::mincore(
            mapping.as_ptr() as *mut libc::c_void,
            mapping.len(),
            residency.as_mut_ptr(),
        )
    };
    if status != 0 {
        return Err(io_error("mincore failed", io::Error::last_os_error()));
    }
    let resident_pages = residency.iter().filter(|&&page| page & 1 == 1).count() as u64;
    Ok((resident_pages * page_bytes).min(file_bytes))
}
