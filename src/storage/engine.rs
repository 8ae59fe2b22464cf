//! The part both adapters share: validate a read, plan its requests, hand them to the
//! worker pool, and return a future that completes through a oneshot.
//!
//! `read` never blocks the calling (actor runtime) thread: requests that fit the bounded
//! queue (at most [`QUEUE_BOUND_JOBS`] of them) are queued at once so the disk starts
//! working before the future is polled; the rest are queued by the future with
//! `send_async`, which waits for room without blocking a thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use stagehand_actors::{Extent, FileId, HostBuffer, OpFuture, StorageError};

use super::file_table::FileTable;
use super::read_op::{closed_error, ReadOp};
use super::read_plan::{plan_chunks, Chunk};
use super::worker_pool::{Job, ReaderPool, WorkerMessage, WorkerScratch};
use super::{direct, pread, StorageOptions};
use crate::os::advise_dont_need;

/// Requests queued for the workers at most. Large enough that a staging ring's reads
/// (2 × 64 MiB in flight = 32 requests of 4 MiB) are all queued by `read` itself, so the
/// disk never idles waiting for the actor thread to be scheduled and queue the rest; a
/// queued request is a few dozen bytes.
const QUEUE_BOUND_JOBS: usize = 256;

/// How a worker reads one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadMode {
    Buffered,
    Direct,
}

/// What the workers' jobs need; shared with them, never with another actor.
pub(crate) struct Shared {
    pub files: FileTable,
    pub mode: ReadMode,
    pub drop_page_cache: bool,
    /// Set once an O_DIRECT read was refused at read time, so we warn only once.
    pub direct_refusal_logged: AtomicBool,
    closing: Arc<AtomicBool>,
}

pub(crate) struct ReadEngine {
    shared: Arc<Shared>,
    request_bytes: u64,
    fail_after_reads: Option<u64>,
    reads_started: AtomicU64,
    // Dropped last (fields drop in order): joins the workers after `shared` lets go.
    pool: ReaderPool,
}

impl ReadEngine {
    pub fn start(
        files: FileTable,
        options: &StorageOptions,
        mode: ReadMode,
        request_bytes: u64,
    ) -> Result<Self, StorageError> {
        options.validate()?;
        let pool = ReaderPool::start(options.reader_threads, QUEUE_BOUND_JOBS)?;
        let shared = Arc::new(Shared {
            files,
            mode,
            drop_page_cache: options.drop_page_cache,
            direct_refusal_logged: AtomicBool::new(false),
            closing: pool.closing_flag(),
        });
        Ok(Self {
            shared,
            request_bytes,
            fail_after_reads: options.fail_after_reads,
            reads_started: AtomicU64::new(0),
            pool,
        })
    }

    pub fn files(&self) -> &FileTable {
        &self.shared.files
    }

    pub fn thread_name_prefix(&self) -> &str {
        self.pool.thread_name_prefix()
    }

    pub fn read(
        &self,
        extents: Vec<Extent>,
        into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        let region_bytes = match self.validate(&extents, &into, into_offset) {
            Ok(bytes) => bytes,
            Err(error) => return ready(Err((error, into))),
        };
        if let Some(limit) = self.fail_after_reads {
            let read_number = self.reads_started.fetch_add(1, Ordering::Relaxed);
            if read_number >= limit {
                let error = StorageError::Injected(format!(
                    "read {} failed on purpose (fail_after_reads = {limit})",
                    read_number + 1
                ));
                return ready(Err((error, into)));
            }
        }
        let chunks = plan_chunks(&extents, self.request_bytes);
        if chunks.is_empty() {
            return ready(Ok(into));
        }
        let after_read = self
            .shared
            .drop_page_cache
            .then(|| drop_cache_after_read(Arc::clone(&self.shared), &chunks));
        let (op, receiver) =
            match ReadOp::new(into, into_offset, region_bytes, chunks.len(), after_read) {
                Ok(created) => created,
                Err(failure) => return ready(Err(failure)),
            };

        // At most a queue's worth is queued here, whatever the workers drain meanwhile:
        // the rest always waits for the future, so a read of more requests than the
        // queue holds never completes without being polled (dropping the storage
        // before then fails it, on a loaded machine or an idle one alike).
        let mut waiting: Vec<Job> = Vec::new();
        for (index, chunk) in chunks.into_iter().enumerate() {
            let job = make_job(Arc::clone(&self.shared), Arc::clone(&op), chunk);
            if !waiting.is_empty() || index >= QUEUE_BOUND_JOBS {
                waiting.push(job);
            } else if let Err(job) = self.pool.try_submit(job) {
                waiting.push(job);
            }
        }
        // Only the jobs hold the op now, so it completes (or reports "closed") when they end.
        drop(op);

        let weak_sender = self.pool.weak_sender();
        Box::pin(async move {
            for job in waiting {
                // The strong sender lives only while one job is being queued: a pending
                // read must never keep the pool's channel (and its dropped jobs) alive.
                let Some(sender) = weak_sender.upgrade() else {
                    break;
                };
                if sender.send_async(WorkerMessage::Run(job)).await.is_err() {
                    break;
                }
            }
            match receiver.await {
                Ok(outcome) => outcome,
                // Unreachable: ReadOp's Drop always sends. Kept total rather than panicking.
                Err(_) => Err((closed_error(), HostBuffer::virtual_buffer(0))),
            }
        })
    }

    /// Checks the read against the file table and the buffer; returns its total bytes.
    fn validate(
        &self,
        extents: &[Extent],
        into: &HostBuffer,
        into_offset: u64,
    ) -> Result<u64, StorageError> {
        let mut total_bytes = 0u64;
        for extent in extents {
            let file = self.shared.files.get(extent.file)?;
            let end = extent.offset.checked_add(extent.length);
            if end.is_none_or(|end| end > file.expected_bytes) {
                return Err(StorageError::Io {
                    path: file.display(),
                    reason: format!(
                        "extent at {} of {} bytes lies past the end of the {}-byte file; \
                         the model layout does not match this file",
                        extent.offset, extent.length, file.expected_bytes
                    ),
                });
            }
            total_bytes = total_bytes.saturating_add(extent.length);
        }
        let buffer_bytes = into.len() as u64;
        if into_offset.saturating_add(total_bytes) > buffer_bytes {
            return Err(StorageError::BufferTooSmall {
                requested_bytes: into_offset.saturating_add(total_bytes),
                buffer_bytes,
            });
        }
        if into.is_virtual() && total_bytes > 0 {
            return Err(StorageError::Io {
                path: "host buffer".to_string(),
                reason: "cannot read file bytes into a virtual (simulator) buffer".to_string(),
            });
        }
        Ok(total_bytes)
    }
}

fn ready(
    outcome: Result<HostBuffer, (StorageError, HostBuffer)>,
) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
    Box::pin(std::future::ready(outcome))
}

/// Advice to drop the read's file pages, run once every request is done. Per-request
/// advice would race the kernel's readahead, and it would miss most of the range anyway:
/// the page cache holds large folios (16 KiB and up) and DONTNEED skips every folio its
/// range covers only in part. So the advice goes once per contiguous run of the read.
fn drop_cache_after_read(shared: Arc<Shared>, chunks: &[Chunk]) -> Box<dyn FnOnce() + Send> {
    let mut runs: Vec<(FileId, u64, u64)> = Vec::new();
    for chunk in chunks {
        match runs.last_mut() {
            Some((file, offset, length))
                if *file == chunk.file && *offset + *length == chunk.file_offset =>
            {
                *length += chunk.length;
            }
            _ => runs.push((chunk.file, chunk.file_offset, chunk.length)),
        }
    }
    Box::new(move || {
        for (file_id, offset, length) in runs {
            if let Ok(file) = shared.files.get(file_id) {
                // Advice only: a failure costs RAM, never correctness.
                let _ = advise_dont_need(&file.buffered, offset, length);
            }
        }
    })
}

fn make_job(shared: Arc<Shared>, op: Arc<ReadOp>, chunk: Chunk) -> Job {
    Box::new(move |scratch: &mut WorkerScratch| {
        let result = run_chunk(&shared, &op, &chunk, scratch);
        op.finish_chunk(result);
    })
}

fn run_chunk(
    shared: &Shared,
    op: &ReadOp,
    chunk: &Chunk,
    scratch: &mut WorkerScratch,
) -> Result<(), StorageError> {
    if shared.closing.load(Ordering::Acquire) {
        return Err(closed_error());
    }
    if op.has_failed() {
        // The read already failed; its first error is what the caller gets.
        return Ok(());
    }
    let file = shared.files.get(chunk.file)?;
    // SAFETY: chunks of one read tile its region without overlap and each chunk runs
    // once; the slice is dropped before `finish_chunk` is called by the job.
    let destination = unsafe { op.destination(chunk.buffer_offset, chunk.length)? };
    file.check_unchanged()?;
    match shared.mode {
        ReadMode::Buffered => pread::read_exact(file, chunk.file_offset, destination)?,
        ReadMode::Direct => direct::read_exact(
            file,
            chunk.file_offset,
            destination,
            scratch,
            &shared.direct_refusal_logged,
        )?,
    }
    Ok(())
}
