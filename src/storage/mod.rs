//! Storage adapters: how model bytes get from files into host buffers.
//!
//! Two adapters implement the [`Storage`] port:
//! - [`PreadStorage`]: buffered `pread`. Pinned RAM acts as the cache, so once a block
//!   has a pinned copy its file pages can be dropped with [`drop_page_cache`].
//! - [`DirectStorage`]: O_DIRECT for `--fast-disk`, large aligned reads that bypass the
//!   page cache; unaligned tensors go through a per-worker bounce buffer. Files on a
//!   filesystem that refuses O_DIRECT fall back to buffered reads (one warning).
//!
//! Both run every read on a pool of blocking worker threads fed by a bounded channel and
//! complete through a oneshot, so the actor runtime that calls `read` never blocks on a
//! disk. A read is split into `read_request_bytes` requests spread over the workers so
//! several are in flight at once. [`stream_block`] drives a ring of pinned staging
//! buffers for the direct-to-VRAM mode: it fills slot i while the caller copies slot i−1.

mod direct;
mod engine;
mod file_table;
mod pread;
mod read_op;
mod read_plan;
mod staging_ring;
mod worker_pool;

use std::path::PathBuf;
use std::sync::Arc;

pub use crate::os::{advise_dont_need, cached_bytes, drop_page_cache};
pub use direct::DirectStorage;
pub use pread::PreadStorage;
pub use read_plan::slice_extents;
pub use stagehand_actors::{Storage, StorageError};
pub use staging_ring::{stream_block, StagingRing, StreamError};

use crate::settings::Settings;

/// Most reader threads one storage may start; a bound so a typo cannot fork a thousand.
pub const MAX_READER_THREADS: usize = 256;
/// Smallest read request: one page, the O_DIRECT alignment.
pub const MIN_READ_REQUEST_BYTES: u64 = 4096;
/// Largest read request: bigger requests only add latency before the first byte lands.
pub const MAX_READ_REQUEST_BYTES: u64 = 1 << 30;

/// One file the storage serves; its index in the slice given to `open` is its `FileId`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageFile {
    pub path: PathBuf,
    /// Length the model index saw; any other length at open or later is `FileChanged`.
    pub expected_bytes: u64,
}

/// How a storage adapter reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageOptions {
    /// Blocking worker threads issuing reads.
    pub reader_threads: usize,
    /// Size of one read request; larger reads are split so several are in flight.
    pub read_request_bytes: u64,
    /// Advise the kernel to drop each range's file pages right after it is read, so the
    /// bytes are not held twice (page cache and pinned RAM).
    pub drop_page_cache: bool,
    /// Fault injection for tests: after this many successful `read` calls, every later
    /// call fails with `StorageError::Injected`.
    pub fail_after_reads: Option<u64>,
}

impl Default for StorageOptions {
    fn default() -> Self {
        Self {
            reader_threads: 4,
            read_request_bytes: 4 << 20,
            drop_page_cache: false,
            fail_after_reads: None,
        }
    }
}

impl StorageOptions {
    /// The options the deployment settings ask for (`reader_threads`, `read_request_size`).
    pub fn from_settings(settings: &Settings) -> Self {
        Self {
            reader_threads: settings.reader_threads as usize,
            read_request_bytes: settings.read_request_size.as_u64(),
            ..Self::default()
        }
    }

    /// Rejects options no adapter can honour, naming the offending key.
    pub fn validate(&self) -> Result<(), StorageError> {
        if self.reader_threads == 0 || self.reader_threads > MAX_READER_THREADS {
            return Err(StorageError::Io {
                path: "reader_threads".to_string(),
                reason: format!(
                    "must be between 1 and {MAX_READER_THREADS}, got {}",
                    self.reader_threads
                ),
            });
        }
        let request_bytes = self.read_request_bytes;
        if !(MIN_READ_REQUEST_BYTES..=MAX_READ_REQUEST_BYTES).contains(&request_bytes) {
            return Err(StorageError::Io {
                path: "read_request_size".to_string(),
                reason: format!(
                    "must be between 4KiB and 1GiB, got {request_bytes} bytes (try \"4MiB\")"
                ),
            });
        }
        Ok(())
    }
}

/// Opens the adapter a session asks for: O_DIRECT when `fast_disk`, else buffered `pread`.
pub fn open_storage(
    files: &[StorageFile],
    options: &StorageOptions,
    fast_disk: bool,
) -> Result<Arc<dyn Storage>, StorageError> {
    if fast_disk {
        Ok(Arc::new(DirectStorage::open(files, options)?))
    } else {
        Ok(Arc::new(PreadStorage::open(files, options)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_offending_key() {
        let zero_threads = StorageOptions {
            reader_threads: 0,
            ..StorageOptions::default()
        };
        let message = zero_threads.validate().unwrap_err().to_string();
        assert!(message.contains("reader_threads"), "{message}");

        let tiny_requests = StorageOptions {
            read_request_bytes: 100,
            ..StorageOptions::default()
        };
        let message = tiny_requests.validate().unwrap_err().to_string();
        assert!(message.contains("read_request_size"), "{message}");
        assert!(StorageOptions::default().validate().is_ok());
    }
}
