//! Fences of the compute stream, and the device time of the work between them.
//!
//! A fence is a timed event recorded on the compute stream. The first operation queued
//! after a fence opens a segment with another timed event; the next fence closes it.
//! A segment's device time runs from when the stream reached its first operation
//! (when the GPU finished what came before, or when it was queued if the GPU was idle)
//! to when the stream passed its fence, so the sum over a step is the time the GPU
//! spent on that step's work, not the time the host spent waiting for copies. The
//! host-side timing of the run loop cannot see this: on CUDA it only queues.

use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::CudaStream;

use super::error::CudaError;
use super::events::Event;

/// Closed segments kept before the finished ones at the front are folded into a sum,
/// so a run that never takes its time keeps a bounded list.
const SEGMENTS_FOLD_AFTER: usize = 256;

/// A point in the compute stream (the port's `Fence`).
pub struct CudaFence {
    event: Arc<Event>,
}

impl CudaFence {
    pub fn is_done(&self) -> Result<bool, CudaError> {
        self.event.query()
    }

    pub fn wait(&self) -> Result<(), CudaError> {
        self.event.synchronize()
    }
}

#[derive(Default)]
struct Segments {
    /// The start of the segment being queued, if an operation was queued since the
    /// last fence.
    open: Option<Event>,
    closed: Vec<(Event, Arc<Event>)>,
    /// Device seconds of segments already folded.
    folded_seconds: f64,
}

/// The compute stream's device time, shared with whoever reads it (a step callback).
#[derive(Clone, Default)]
pub struct DeviceTime {
    segments: Arc<Mutex<Segments>>,
}

impl DeviceTime {
    fn lock(&self) -> MutexGuard<'_, Segments> {
        // A panic while holding the lock leaves plain data behind; keep going.
        self.segments
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Opens a segment unless one is open: called before queueing an operation.
    pub(super) fn busy(&self, stream: &CudaStream) -> Result<(), CudaError> {
        let mut segments = self.lock();
        if segments.open.is_none() {
            segments.open = Some(Event::record_timed(stream)?);
        }
        Ok(())
    }

    /// Records a fence, closing the open segment.
    pub(super) fn fence(&self, stream: &CudaStream) -> Result<CudaFence, CudaError> {
        let event = Arc::new(Event::record_timed(stream)?);
        let mut segments = self.lock();
        if let Some(start) = segments.open.take() {
            segments.closed.push((start, event.clone()));
        }
        if segments.closed.len() > SEGMENTS_FOLD_AFTER {
            fold_finished(&mut segments)?;
        }
        Ok(CudaFence { event })
    }

    /// Device seconds of every closed segment since the last call, waiting for them
    /// to finish. Work queued after the last fence is left for the next call.
    pub fn take_seconds(&self) -> Result<f64, CudaError> {
        let mut segments = self.lock();
        let mut seconds = std::mem::take(&mut segments.folded_seconds);
        for (start, end) in segments.closed.drain(..) {
            end.synchronize()?;
            seconds += end.seconds_since(&start)?;
        }
        Ok(seconds)
    }
}

/// Sums the segments at the front that have finished (never waits).
fn fold_finished(segments: &mut Segments) -> Result<(), CudaError> {
    let mut finished = 0;
    for (start, end) in &segments.closed {
        if !end.query()? {
            break;
        }
        segments.folded_seconds += end.seconds_since(start)?;
        finished += 1;
    }
    segments.closed.drain(..finished);
    Ok(())
}
