//! One `Storage::read` in flight: the destination buffer shared by its requests, the
//! count of requests still running, the first error, and the oneshot that completes it.
//!
//! Workers write disjoint ranges of the buffer through a raw pointer; the buffer itself
//! stays parked here, untouched, until the last request finishes and hands it back.
//! If the last reference goes away before that (the storage closed and dropped queued
//! requests), `Drop` still completes the read with an error and the buffer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use stagehand_actors::{HostBuffer, StorageError};
use tokio::sync::oneshot;

pub(crate) type ReadOutcome = Result<HostBuffer, (StorageError, HostBuffer)>;

/// Start of the destination region. Sent to workers, who write disjoint ranges of it.
struct DestinationPtr(*mut u8);

// SAFETY: the pointer targets memory owned by the `HostBuffer` parked in the same
// `ReadOp`, which outlives every worker's use; workers write disjoint ranges only.
unsafe impl Send for DestinationPtr {}
unsafe impl Sync for DestinationPtr {}

pub(crate) struct ReadOp {
    buffer: Mutex<Option<HostBuffer>>,
    destination: DestinationPtr,
    region_bytes: u64,
    remaining_chunks: AtomicUsize,
    failed: AtomicBool,
    first_error: Mutex<Option<StorageError>>,
    done: Mutex<Option<oneshot::Sender<ReadOutcome>>>,
    /// Run by the last request before the read completes (page-cache advice).
    after_read: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another request panicked; the data is still usable.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn closed_error() -> StorageError {
    StorageError::Io {
        path: "storage".to_string(),
        reason: "storage closed before the read finished".to_string(),
    }
}

impl ReadOp {
    /// Parks `buffer` and returns the op and the receiver its outcome arrives on.
    /// The caller has checked that `into_offset + region_bytes <= buffer.len()` and that
    /// the buffer has memory.
    pub fn new(
        mut buffer: HostBuffer,
        into_offset: u64,
        region_bytes: u64,
        chunks: usize,
        after_read: Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<(Arc<Self>, oneshot::Receiver<ReadOutcome>), (StorageError, HostBuffer)> {
        let fits = into_offset
            .checked_add(region_bytes)
            .is_some_and(|end| end <= buffer.len() as u64);
        let Some(slice) = buffer.as_mut_slice().filter(|_| fits) else {
            let error = StorageError::BufferTooSmall {
                requested_bytes: into_offset.saturating_add(region_bytes),
                buffer_bytes: buffer.len() as u64,
            };
            return Err((error, buffer));
        };
        let destination = DestinationPtr(slice[into_offset as usize..].as_mut_ptr());
        let (sender, receiver) = oneshot::channel();
        let op = Arc::new(Self {
            buffer: Mutex::new(Some(buffer)),
            destination,
            region_bytes,
            remaining_chunks: AtomicUsize::new(chunks),
            failed: AtomicBool::new(false),
            first_error: Mutex::new(None),
            done: Mutex::new(Some(sender)),
            after_read: Mutex::new(after_read),
        });
        Ok((op, receiver))
    }

    /// True once any request failed: the others skip their disk work.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The destination bytes of one request.
    ///
    /// # Safety
    /// The caller must be the only one using `[offset, offset + length)` of this op, and
    /// must drop the slice before calling `finish_chunk` for that request.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn destination(&self, offset: u64, length: u64) -> Result<&mut [u8], StorageError> {
        let in_bounds = offset
            .checked_add(length)
            .is_some_and(|end| end <= self.region_bytes);
        if !in_bounds {
            return Err(StorageError::BufferTooSmall {
                requested_bytes: offset.saturating_add(length),
                buffer_bytes: self.region_bytes,
            });
        }
        // SAFETY: in bounds of the parked buffer, exclusive per the caller's contract.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.destination.0.add(offset as usize), length as usize)
        })
    }

    /// Records one request's result; the last one completes the read.
    pub fn finish_chunk(&self, result: Result<(), StorageError>) {
        if let Err(error) = result {
            let mut first_error = lock(&self.first_error);
            if first_error.is_none() {
                *first_error = Some(error);
            }
            self.failed.store(true, Ordering::Release);
        }
        if self.remaining_chunks.fetch_sub(1, Ordering::AcqRel) == 1 {
            let after_read = lock(&self.after_read).take();
            if let Some(after_read) = after_read {
                after_read();
            }
            self.complete(None);
        }
    }

    fn complete(&self, fallback_error: Option<StorageError>) {
        let Some(sender) = lock(&self.done).take() else {
            return;
        };
        let Some(buffer) = lock(&self.buffer).take() else {
            return;
        };
        let outcome = match lock(&self.first_error).take().or(fallback_error) {
            None => Ok(buffer),
            Some(error) => Err((error, buffer)),
        };
        // The reader may have given up (future dropped): then the buffer just drops.
        let _ = sender.send(outcome);
    }
}

impl Drop for ReadOp {
    fn drop(&mut self) {
        // Reached with requests still counted only when some were dropped unrun.
        if self.remaining_chunks.load(Ordering::Acquire) > 0 {
            self.complete(Some(closed_error()));
        }
    }
}
