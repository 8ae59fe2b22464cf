//! The reader workers: a fixed pool of blocking threads fed by a bounded channel.
//!
//! Blocking `pread`s run here and never on the actor runtime. The pool is dropped with
//! its storage: it sends one `Stop` per worker and joins them all, so no thread outlives
//! the storage. Jobs queued before the stops still run (they see `closing` and fail
//! fast); jobs that arrive later are dropped unrun, and dropping a job completes its read
//! with an error (see `ReadOp`'s `Drop`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use stagehand_actors::{HostBuffer, StorageError, HOST_BUFFER_ALIGN};

/// One read request, run on a worker with that worker's scratch memory.
pub(crate) type Job = Box<dyn FnOnce(&mut WorkerScratch) + Send>;

pub(crate) enum WorkerMessage {
    Run(Job),
    Stop,
}

/// Per-worker memory reused across jobs: the O_DIRECT bounce buffer, allocated once on
/// first use and grown only if a request needs more.
#[derive(Default)]
pub(crate) struct WorkerScratch {
    bounce: Option<HostBuffer>,
}

impl WorkerScratch {
    /// `bytes` of scratch whose start is a multiple of `align_bytes`.
    pub fn bounce(&mut self, bytes: usize, align_bytes: usize) -> Result<&mut [u8], StorageError> {
        // HostBuffer is page-aligned; a larger alignment needs slack to slide into.
        let slack = if align_bytes > HOST_BUFFER_ALIGN {
            align_bytes
        } else {
            0
        };
        let needed = bytes + slack;
        if self
            .bounce
            .as_ref()
            .is_none_or(|buffer| buffer.len() < needed)
        {
            self.bounce = None;
            let buffer = HostBuffer::allocate(needed).map_err(|error| StorageError::Io {
                path: "bounce buffer".to_string(),
                reason: error.to_string(),
            })?;
            self.bounce = Some(buffer);
        }
        let Some(slice) = self
            .bounce
            .as_mut()
            .and_then(|buffer| buffer.as_mut_slice())
        else {
            return Err(StorageError::Io {
                path: "bounce buffer".to_string(),
                reason: "allocation has no memory".to_string(),
            });
        };
        let misalignment = slice.as_ptr() as usize % align_bytes;
        let skip = if misalignment == 0 {
            0
        } else {
            align_bytes - misalignment
        };
        Ok(&mut slice[skip..skip + bytes])
    }
}

static NEXT_POOL_NUMBER: AtomicU64 = AtomicU64::new(0);

pub(crate) struct ReaderPool {
    sender: flume::Sender<WorkerMessage>,
    workers: Vec<JoinHandle<()>>,
    closing: Arc<AtomicBool>,
    thread_name_prefix: String,
}

impl ReaderPool {
    /// Starts `threads` workers behind a channel holding at most `queue_bound` jobs.
    pub fn start(threads: usize, queue_bound: usize) -> Result<Self, StorageError> {
        let (sender, receiver) = flume::bounded(queue_bound.max(1));
        let pool_number = NEXT_POOL_NUMBER.fetch_add(1, Ordering::Relaxed);
        // Linux thread names hold 15 bytes; "sh-rd<pool>-<worker>" fits and lets tests
        // find exactly this pool's threads in /proc/self/task.
        let thread_name_prefix = format!("sh-rd{pool_number}-");
        let mut pool = Self {
            sender,
            workers: Vec::with_capacity(threads),
            closing: Arc::new(AtomicBool::new(false)),
            thread_name_prefix,
        };
        for worker_index in 0..threads {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}{worker_index}", pool.thread_name_prefix))
                .spawn(move || worker_loop(receiver));
            match spawned {
                Ok(handle) => pool.workers.push(handle),
                // Dropping the partial pool joins the workers already started.
                Err(error) => {
                    return Err(StorageError::Io {
                        path: "reader threads".to_string(),
                        reason: format!("cannot start reader thread {worker_index}: {error}"),
                    })
                }
            }
        }
        Ok(pool)
    }

    /// Queues a job if there is room now; hands it back when the queue is full.
    pub fn try_submit(&self, job: Job) -> Result<(), Job> {
        match self.sender.try_send(WorkerMessage::Run(job)) {
            Ok(()) => Ok(()),
            Err(flume::TrySendError::Full(WorkerMessage::Run(job)))
            | Err(flume::TrySendError::Disconnected(WorkerMessage::Run(job))) => Err(job),
            Err(_) => Ok(()),
        }
    }

    /// A sender that does not keep the pool's channel alive, for futures that submit
    /// the jobs that did not fit the queue at `read` time.
    pub fn weak_sender(&self) -> flume::WeakSender<WorkerMessage> {
        self.sender.downgrade()
    }

    pub fn closing_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.closing)
    }

    pub fn thread_name_prefix(&self) -> &str {
        &self.thread_name_prefix
    }
}

fn worker_loop(receiver: flume::Receiver<WorkerMessage>) {
    let mut scratch = WorkerScratch::default();
    while let Ok(WorkerMessage::Run(job)) = receiver.recv() {
        job(&mut scratch);
    }
}

impl Drop for ReaderPool {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::Release);
        // One stop per worker: a worker that takes a stop exits and takes no other.
        // `send` may wait for queue room, which the draining workers make.
        for _ in 0..self.workers.len() {
            if self.sender.send(WorkerMessage::Stop).is_err() {
                break;
            }
        }
        for worker in self.workers.drain(..) {
            if worker.join().is_err() {
                tracing::error!("a storage reader thread panicked");
            }
        }
    }
}
