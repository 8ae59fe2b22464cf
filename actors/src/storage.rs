//! The `Storage` port: reading byte ranges of model files into host buffers.
//!
//! Adapters live in the `stagehand` crate: buffered `pread` from a worker pool,
//! O_DIRECT for `--fast-disk`, and the simulator's timed reads. A read takes the
//! destination buffer by value and hands it back, so the buffer stays owned by the
//! read while the kernel writes into it.

use crate::device::OpFuture;
use crate::host_buffer::HostBuffer;
use crate::layout::{Extent, FileId};

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    #[error("{path}: file changed while running: expected {expected_bytes} bytes, found {found_bytes}; re-run `stagehand inspect` and restart")]
    FileChanged {
        path: String,
        expected_bytes: u64,
        found_bytes: u64,
    },
    #[error("unknown file id {0:?}")]
    UnknownFile(FileId),
    #[error("read of {requested_bytes} bytes does not fit a {buffer_bytes}-byte buffer")]
    BufferTooSmall {
        requested_bytes: u64,
        buffer_bytes: u64,
    },
    #[error("injected fault: {0}")]
    Injected(String),
}

pub trait Storage: Send + Sync + 'static {
    /// Short adapter name for logs: "pread", "o_direct", "sim".
    fn name(&self) -> String;

    /// Reads the extents back to back into `into[into_offset..]`.
    fn read(
        &self,
        extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)>;

    /// These bytes now have a pinned copy: the adapter may drop them from the page
    /// cache so the same bytes are not held twice. Advisory; errors are ignored.
    fn forget_cached(&self, _extents: &[Extent]) {}
}
