//! The `Storage` port: reading byte ranges of model files into host buffers.
//!
//! Adapters live in the `stagehand` crate: buffered `pread` from a worker pool,
//! O_DIRECT for `--fast-disk`, and the simulator's timed reads. A read takes the
//! destination buffer by value and hands it back, so the buffer stays owned by the
//! read while the kernel writes into it.

use crate::device::OpFuture;
use crate::host_buffer::HostBuffer;
use crate::layout::{Extent, FileId};

/// Why a read failed. The pin manager turns it into a
/// [`SessionError::ReadFailed`](crate::SessionError::ReadFailed) for the block.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// The operating system refused an open, a read or a check of the file.
    #[error("{path}: {reason}")]
    Io {
        /// The file, as the adapter shows it to a user.
        path: String,
        /// The operating system's error, in its words.
        reason: String,
    },
    /// The file's size is no longer the one the model index recorded, so the
    /// extents may point at other bytes: the run must not go on with them.
    #[error("{path}: file changed while running: expected {expected_bytes} bytes, found {found_bytes}; re-run `stagehand inspect` and restart")]
    FileChanged {
        /// The file, as the adapter shows it to a user.
        path: String,
        /// Its size when the model was indexed.
        expected_bytes: u64,
        /// Its size now (0 when it could not be read at all).
        found_bytes: u64,
    },
    /// An extent named a file the adapter's file table does not have.
    #[error("unknown file id {0:?}")]
    UnknownFile(FileId),
    /// The extents add up to more than the destination buffer holds past its offset.
    #[error("read of {requested_bytes} bytes does not fit a {buffer_bytes}-byte buffer")]
    BufferTooSmall {
        /// The bytes the read needed the buffer to hold.
        requested_bytes: u64,
        /// The bytes the buffer had for it.
        buffer_bytes: u64,
    },
    /// A failure a test or the simulator's fault injection asked for; says which.
    #[error("injected fault: {0}")]
    Injected(String),
}

/// The port a storage adapter implements: reads of model file ranges into host
/// buffers, issued by the disk reader with at most `max_reads_in_flight` at once.
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
