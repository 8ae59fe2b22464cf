//! CUDA events and the thread that waits on them, so actors never block.
//!
//! Actors await futures; CUDA completes work asynchronously on a stream. Between the
//! two sits one waiter thread per stream: it takes events in the order they were
//! recorded (which is the order the stream completes them), blocks in
//! `cuEventSynchronize`, and then runs the completion, which resolves a future. One
//! thread hand-off per completion is the cost; no actor thread ever waits on the GPU.

use std::sync::Arc;
use std::thread::JoinHandle;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use super::error::CudaError;

/// Most completions queued on one waiter. Copies and compute steps in flight are bounded
/// far below this by the pinned buffers and slots that feed them; past it, submitting
/// waits for the waiter to drain, which cannot deadlock because the waiter never
/// depends on the submitter.
pub const PENDING_COMPLETIONS_MAX: usize = 4096;

/// One `CUevent`, destroyed on drop.
pub struct Event {
    event: sys::CUevent,
    context: Arc<CudaContext>,
}

// SAFETY: a CUevent handle may be used from any thread once its context is bound
// there; every method binds the context first.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Event {
    /// Creates an event and records it on `stream`: it completes once all work queued
    /// on the stream so far has completed.
    pub fn record(stream: &CudaStream) -> Result<Self, CudaError> {
        // Blocking sync makes the waiter thread sleep in the driver instead of spinning
        // a core for the length of every transfer; timing is not needed.
        Self::record_with_flags(
            stream,
            sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    }

    /// As [`Event::record`], but with timing enabled so [`Event::seconds_since`] can
    /// measure the device time between two such events (the run's compute time).
    pub fn record_timed(stream: &CudaStream) -> Result<Self, CudaError> {
        Self::record_with_flags(stream, sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32)
    }

    fn record_with_flags(stream: &CudaStream, flags: u32) -> Result<Self, CudaError> {
        let context = stream.context().clone();
        context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        let mut event = std::ptr::null_mut();
        // SAFETY: `event` is a valid out-pointer; the context is current.
        unsafe { sys::cuEventCreate(&mut event, flags) }
            .result()
            .map_err(CudaError::driver("cuEventCreate"))?;
        let event = Self { event, context };
        // SAFETY: both handles are live and belong to the current context.
        unsafe { sys::cuEventRecord(event.event, stream.cu_stream()) }
            .result()
            .map_err(CudaError::driver("cuEventRecord"))?;
        Ok(event)
    }

    /// True once the work recorded before the event has completed; never blocks.
    pub fn query(&self) -> Result<bool, CudaError> {
        make_current(&self.context)?;
        // SAFETY: the event is live.
        match unsafe { sys::cuEventQuery(self.event) } {
            sys::cudaError_enum::CUDA_SUCCESS => Ok(true),
            sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            error => Err(CudaError::driver("cuEventQuery")(
                cudarc::driver::DriverError(error),
            )),
        }
    }

    /// Device seconds from `start` to this event; both must come from
    /// [`Event::record_timed`] and have completed.
    pub fn seconds_since(&self, start: &Event) -> Result<f64, CudaError> {
        make_current(&self.context)?;
        let mut milliseconds = 0f32;
        // SAFETY: both events are live, timed and (the caller guarantees) complete.
        unsafe { sys::cuEventElapsedTime_v2(&mut milliseconds, start.event, self.event) }
            .result()
            .map_err(CudaError::driver("cuEventElapsedTime"))?;
        Ok(f64::from(milliseconds) / 1e3)
    }

    pub fn raw(&self) -> sys::CUevent {
        self.event
    }

    /// Blocks the calling thread until the event completes. Only the waiter thread,
    /// tests and benchmarks call this.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        // SAFETY: the event is live.
        unsafe { sys::cuEventSynchronize(self.event) }
            .result()
            .map_err(CudaError::driver("cuEventSynchronize"))
    }

    /// Makes `stream` wait on the device (not the host) until this event completes.
    pub fn make_wait(&self, stream: &CudaStream) -> Result<(), CudaError> {
        self.context
            .bind_to_thread()
            .map_err(CudaError::driver("cuCtxSetCurrent"))?;
        // SAFETY: both handles are live.
        unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), self.event, 0) }
            .result()
            .map_err(CudaError::driver("cuStreamWaitEvent"))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if make_current(&self.context).is_err() {
            return;
        }
        // SAFETY: destroyed exactly once; the driver defers the release until the
        // recorded work is done if it is still pending.
        let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
    }
}

/// Makes `context` current on this thread. Unlike `CudaContext::bind_to_thread` it
/// ignores errors cudarc recorded earlier, so cleanup (unregister, unmap, destroy)
/// still runs after a failure elsewhere instead of leaking driver resources.
pub(crate) fn make_current(context: &CudaContext) -> Result<(), CudaError> {
    // SAFETY: the context handle is live for as long as `context` is.
    unsafe { cudarc::driver::result::ctx::set_current(context.cu_ctx()) }
        .map_err(CudaError::driver("cuCtxSetCurrent"))
}

type Completion = Box<dyn FnOnce(Result<(), CudaError>) + Send>;

struct Pending {
    event: Event,
    completion: Completion,
}

/// A thread that waits on events in submission order and runs their completions.
pub struct EventWaiter {
    sender: Option<flume::Sender<Pending>>,
    thread: Option<JoinHandle<()>>,
}

impl EventWaiter {
    pub fn spawn(name: &str) -> Result<Self, CudaError> {
        let (sender, receiver) = flume::bounded::<Pending>(PENDING_COMPLETIONS_MAX);
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                for pending in receiver.iter() {
                    let result = pending.event.synchronize();
                    (pending.completion)(result);
                }
            })
            .map_err(|error| {
                CudaError::InvalidArgument(format!("could not start the {name} thread: {error}"))
            })?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
        })
    }

    /// Runs `completion` on the waiter thread once `event` has completed. The
    /// completion owns whatever must stay alive until then (a source buffer).
    pub fn submit(
        &self,
        event: Event,
        completion: impl FnOnce(Result<(), CudaError>) + Send + 'static,
    ) {
        let pending = Pending {
            event,
            completion: Box::new(completion),
        };
        let Some(sender) = &self.sender else {
            return;
        };
        if let Err(flume::SendError(pending)) = sender.send(pending) {
            // The thread is gone (it only stops when this waiter is dropped, or if a
            // completion panicked). Wait here so the completion still runs after its
            // event and never while a copy reads its buffer.
            let result = pending.event.synchronize();
            (pending.completion)(result);
        }
    }
}

impl Drop for EventWaiter {
    fn drop(&mut self) {
        // Closing the channel lets the thread finish the queued events and exit; joining
        // means nothing that a completion keeps alive outlives the device.
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
