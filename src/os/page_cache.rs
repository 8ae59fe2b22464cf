//! Page-cache control: dropping a file's cached pages once their bytes live elsewhere
//! (a pinned copy), and measuring how much of a file the cache holds.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::Arc;

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
    fadvise(file, offset, len, libc::POSIX_FADV_DONTNEED)
}

fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) -> io::Result<()> {
    let offset = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: plain syscall on a descriptor we own; no memory is passed.
    let status = unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, advice) };
    // posix_fadvise returns the error number instead of setting errno.
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(status))
    }
}

/// `posix_fadvise(WILLNEED)` on a range of an open file: the kernel starts reading
/// those pages into the page cache and returns without waiting for them.
pub fn advise_will_need(file: &File, offset: u64, len: u64) -> io::Result<()> {
    fadvise(file, offset, len, libc::POSIX_FADV_WILLNEED)
}

/// Bytes of `path` currently in the page cache (`mincore` over a mapping that is never
/// touched, so measuring does not fault anything in).
pub fn cached_bytes(path: &Path) -> Result<u64, StorageError> {
    let residency = page_residency(path)?;
    let uncached: u64 = residency
        .uncached_ranges()
        .iter()
        .map(|(start, end)| end - start)
        .sum();
    Ok(residency.file_bytes - uncached)
}

/// The byte ranges of `path` the page cache does not hold now, `(start, end)` in
/// file order, adjacent pages joined.
pub fn uncached_ranges(path: &Path) -> Result<Vec<(u64, u64)>, StorageError> {
    Ok(page_residency(path)?.uncached_ranges())
}

/// One byte per page of a file: bit 0 set where the page cache holds it.
struct PageResidency {
    pages: Vec<u8>,
    page_bytes: u64,
    file_bytes: u64,
}

impl PageResidency {
    /// The byte ranges of the pages not held, adjacent ones joined, the last page
    /// cut at the file's end.
    fn uncached_ranges(&self) -> Vec<(u64, u64)> {
        uncached_runs(&self.pages, 0, self.page_bytes, self.file_bytes)
    }
}

/// The ranges of the pages whose flag has bit 0 clear, the first page starting at
/// `start`, adjacent ones joined, the last cut at `end`.
fn uncached_runs(pages: &[u8], start: u64, page_bytes: u64, end: u64) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for (page, _) in (0u64..).zip(pages).filter(|(_, &flag)| flag & 1 == 0) {
        let page_start = start + page * page_bytes;
        let page_end = (page_start + page_bytes).min(end);
        match ranges.last_mut() {
            Some(last) if last.1 == page_start => last.1 = page_end,
            _ => ranges.push((page_start, page_end)),
        }
    }
    ranges
}

fn page_residency(path: &Path) -> Result<PageResidency, StorageError> {
    let io_error = |what: &str, error: io::Error| StorageError::Io {
        path: path.display().to_string(),
        reason: format!("{what}: {error}"),
    };
    let file = File::open(path).map_err(|error| io_error("cannot open", error))?;
    let view =
        PageCacheView::of(&file).map_err(|error| io_error("mmap for mincore failed", error))?;
    let file_bytes = view.file_bytes;
    let mut pages = vec![0u8; file_bytes.div_ceil(view.page_bytes) as usize];
    view.residency(0, &mut pages)
        .map_err(|error| io_error("mincore failed", error))?;
    Ok(PageResidency {
        pages,
        page_bytes: view.page_bytes,
        file_bytes,
    })
}

/// A file mapped once, so `mincore` can say which of its pages the page cache holds —
/// and a one-off read can leave the cache as it found it, or compute from cached pages
/// where they are ([`Self::map_range`]).
pub struct PageCacheView {
    /// `None` for an empty file (nothing to map).
    mapping: Option<Arc<memmap2::Mmap>>,
    page_bytes: u64,
    file_bytes: u64,
}

impl PageCacheView {
    pub fn of(file: &File) -> io::Result<Self> {
        let file_bytes = file.metadata()?.len();
        // SAFETY: sysconf has no preconditions.
        let page_bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        // SAFETY: a read-only shared mapping. It is read only where mincore found
        // the pages cached, after a check that the file is the one indexed
        // (`BlockReader::cached`); a file truncated in the milliseconds a reference
        // then computes from it ends the process with SIGBUS, as it does every
        // mmap-based model loader (llama.cpp, safetensors' `safe_open`).
        let mapping = (file_bytes > 0)
            .then(|| unsafe { memmap2::Mmap::map(file) })
            .transpose()?
            .map(Arc::new);
        Ok(Self {
            mapping,
            page_bytes,
            file_bytes,
        })
    }

    /// `offset .. offset + length` of the file, mapped read-only (`None` for an empty
    /// file or a range past its end). Read it only where the page cache holds it.
    pub fn map_range(&self, offset: u64, length: u64) -> Option<MappedRange> {
        let mapping = self.mapping.clone()?;
        let start = usize::try_from(offset).ok()?;
        let length = usize::try_from(length).ok()?;
        (start.checked_add(length)? <= mapping.len()).then_some(MappedRange {
            mapping,
            start,
            length,
            page_bytes: self.page_bytes as usize,
        })
    }

    /// The ranges of `offset .. offset + length` the page cache does not hold now,
    /// whole pages (the first and last may reach past the range), adjacent ones joined.
    pub fn uncached_within(&self, offset: u64, length: u64) -> io::Result<Vec<(u64, u64)>> {
        let end = offset.saturating_add(length).min(self.file_bytes);
        if offset >= end {
            return Ok(Vec::new());
        }
        let first_page = offset / self.page_bytes;
        let pages = end.div_ceil(self.page_bytes) - first_page;
        let mut flags = vec![0u8; pages as usize];
        self.residency(first_page, &mut flags)?;
        let start = first_page * self.page_bytes;
        Ok(uncached_runs(
            &flags,
            start,
            self.page_bytes,
            self.file_bytes,
        ))
    }

    /// One flag per page from page `first_page` into `flags`.
    fn residency(&self, first_page: u64, flags: &mut [u8]) -> io::Result<()> {
        let Some(mapping) = &self.mapping else {
            return Ok(());
        };
        let start = (first_page * self.page_bytes) as usize;
        let length =
            (flags.len() as u64 * self.page_bytes).min(mapping.len() as u64 - start as u64);
        // SAFETY: `start` is page-aligned and inside the mapping, `length` stays inside
        // it, and `flags` has one byte per page of that range, as mincore requires.
        let status = unsafe {
            libc::mincore(
                mapping.as_ptr().add(start) as *mut libc::c_void,
                length as usize,
                flags.as_mut_ptr(),
            )
        };
        if status == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

/// A range of a mapped file, read in place. Dropped, it unmaps its pages from this
/// process (they stay in the page cache): a reference computed from a whole model's
/// cached pages holds one block's worth of them at a time, not the model.
pub struct MappedRange {
    mapping: Arc<memmap2::Mmap>,
    start: usize,
    length: usize,
    page_bytes: usize,
}

impl AsRef<[u8]> for MappedRange {
    fn as_ref(&self) -> &[u8] {
        &self.mapping[self.start..self.start + self.length]
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        let first = self.start / self.page_bytes * self.page_bytes;
        let end = (self.start + self.length)
            .div_ceil(self.page_bytes)
            .saturating_mul(self.page_bytes)
            .min(self.mapping.len());
        if end <= first {
            return;
        }
        // SAFETY: `first .. end` is page-aligned at its start and inside the mapping.
        // On a shared, read-only file mapping MADV_DONTNEED only drops this process's
        // page-table entries: the pages stay in the page cache, and a later read of
        // the range (an adjacent block's shared edge page included) faults the file's
        // bytes back in. Advice only: a failure costs resident memory, never bytes.
        unsafe {
            libc::madvise(
                self.mapping.as_ptr().add(first) as *mut libc::c_void,
                end - first,
                libc::MADV_DONTNEED,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncached_ranges_and_cached_bytes_account_for_the_whole_file() {
        // Proves the two views of one mincore pass agree: the uncached ranges are in
        // order, disjoint, within the file, and with the cached bytes make its size,
        // whatever the filesystem keeps (a page dropped halfway through included).
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages.bin");
        std::fs::write(&path, vec![7u8; (64 << 10) + 100]).unwrap();
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        advise_dont_need(&file, 16 << 10, 16 << 10).unwrap();
        let ranges = uncached_ranges(&path).unwrap();
        let file_bytes = (64 << 10) + 100;
        let mut previous_end = 0;
        for &(start, end) in &ranges {
            assert!(
                previous_end <= start && start < end && end <= file_bytes,
                "{ranges:?}"
            );
            previous_end = end;
        }
        let uncached: u64 = ranges.iter().map(|(start, end)| end - start).sum();
        assert_eq!(uncached + cached_bytes(&path).unwrap(), file_bytes);
    }

    #[test]
    fn a_dropped_range_leaves_the_process_and_its_bytes_stay_readable() {
        // Proves a mapped range reads the file's bytes, and that dropping it takes its
        // pages out of this process (the mapping's resident size goes to 0) while a
        // range mapped again reads the same bytes: a reference holds one block of a
        // model's cached pages at a time, not the model.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pages.bin");
        let bytes: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let view = PageCacheView::of(&file).unwrap();
        let base = view
            .mapping
            .as_ref()
            .map_or(0, |mapping| mapping.as_ptr() as usize);
        let range = view.map_range(4096, 1 << 20).expect("inside the file");
        assert_eq!(range.as_ref(), &bytes[4096..4096 + (1 << 20)]);
        assert!(
            mapping_rss_bytes(base) >= 1 << 20,
            "read, its pages are mapped"
        );
        drop(range);
        assert_eq!(mapping_rss_bytes(base), 0, "dropped, none are");
        let again = view.map_range(4096, 1 << 20).expect("inside the file");
        assert_eq!(again.as_ref(), &bytes[4096..4096 + (1 << 20)]);
        assert!(view.map_range(1 << 21, 1).is_none(), "past the end");
    }

    /// The resident bytes of this process's mapping that starts at `base`
    /// (`/proc/self/smaps`).
    fn mapping_rss_bytes(base: usize) -> u64 {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let start = format!("{base:x}-");
        let mut lines = smaps.lines().skip_while(|line| !line.starts_with(&start));
        lines.next().expect("the mapping is listed");
        let rss = lines
            .find(|line| line.starts_with("Rss:"))
            .expect("its Rss line");
        let kib: u64 = rss.split_whitespace().nth(1).unwrap().parse().unwrap();
        kib * 1024
    }
}
