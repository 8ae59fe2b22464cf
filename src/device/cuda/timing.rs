//! Fences of the compute stream, and the device time of the work between them.
//!
//! A fence is a timed event recorded on the compute stream. The first operation queued
//! after a fence opens a segment with another timed event; the next fence closes it.
//! A segment's device time runs from when the stream reached its first operation
//! (when the GPU finished what came before, or when it was queued if the GPU was idle)
//! to when the stream passed its fence, so the sum over a step is the time the GPU
//! spent on that step's work, not the time the host spent waiting for copies. The
//! host-side timing of the run loop cannot see this: on CUDA it only queues.
//!
//! Each segment also keeps the host instant it was opened, so a reader can tell a
//! step's own work from work queued after it on the same stream.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use cudarc::driver::CudaStream;

use super::error::CudaError;
use super::events::Event;

/// Closed segments kept before the finished ones at the front are folded into plain
/// figures, so events do not pile up when nobody reads the time for a while.
const SEGMENTS_FOLD_AFTER: usize = 256;
/// Folded figures kept; past this the oldest are merged (their opening instant is the
/// oldest's), so a run that never reads its time stays bounded.
const FOLDED_MAX: usize = 1 << 16;

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

struct Segment {
    opened_at: Instant,
    start: Event,
    end: Arc<Event>,
}

#[derive(Default)]
struct Segments {
    /// The segment being queued, if an operation was queued since the last fence.
    open: Option<(Instant, Event)>,
    closed: Vec<Segment>,
    /// Finished segments already measured: (opened at, device seconds).
    folded: Vec<(Instant, f64)>,
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
            segments.open = Some((Instant::now(), Event::record_timed(stream)?));
        }
        Ok(())
    }

    /// Records a fence, closing the open segment.
    pub(super) fn fence(&self, stream: &CudaStream) -> Result<CudaFence, CudaError> {
        let event = Arc::new(Event::record_timed(stream)?);
        let mut segments = self.lock();
        if let Some((opened_at, start)) = segments.open.take() {
            segments.closed.push(Segment {
                opened_at,
                start,
                end: event.clone(),
            });
        }
        if segments.closed.len() > SEGMENTS_FOLD_AFTER {
            fold_finished(&mut segments)?;
        }
        Ok(CudaFence { event })
    }

    /// Device seconds of every closed segment since the last call, waiting for them
    /// to finish. Work queued after the last fence is left for the next call.
    pub fn take_seconds(&self) -> Result<f64, CudaError> {
        self.take_seconds_opened_until(None)
            .map(|(seconds, _)| seconds)
    }

    /// As [`DeviceTime::take_seconds`], split at `cutoff`: (device seconds of the
    /// segments opened up to it, of those opened after it). Both are taken.
    pub fn take_seconds_split(&self, cutoff: Instant) -> Result<(f64, f64), CudaError> {
        self.take_seconds_opened_until(Some(cutoff))
    }

    fn take_seconds_opened_until(&self, cutoff: Option<Instant>) -> Result<(f64, f64), CudaError> {
        let mut segments = self.lock();
        let mut measured = std::mem::take(&mut segments.folded);
        for segment in segments.closed.drain(..) {
            segment.end.synchronize()?;
            measured.push((
                segment.opened_at,
                segment.end.seconds_since(&segment.start)?,
            ));
        }
        Ok(split_at(&measured, cutoff))
    }
}

/// (seconds of the segments opened up to `cutoff`, of those opened after it); with no
/// cutoff, all of them are before.
fn split_at(measured: &[(Instant, f64)], cutoff: Option<Instant>) -> (f64, f64) {
    let (mut before, mut after) = (0.0, 0.0);
    for &(opened_at, seconds) in measured {
        match cutoff {
            Some(cutoff) if opened_at > cutoff => after += seconds,
            _ => before += seconds,
        }
    }
    (before, after)
}

/// Measures the segments at the front that have finished (never waits).
fn fold_finished(segments: &mut Segments) -> Result<(), CudaError> {
    let mut finished = 0;
    for segment in &segments.closed {
        if !segment.end.query()? {
            break;
        }
        let seconds = segment.end.seconds_since(&segment.start)?;
        segments.folded.push((segment.opened_at, seconds));
        finished += 1;
    }
    segments.closed.drain(..finished);
    if segments.folded.len() > FOLDED_MAX {
        let excess = segments.folded.len() - FOLDED_MAX / 2;
        let oldest = segments.folded[0].0;
        let merged: f64 = segments
            .folded
            .drain(..excess)
            .map(|(_, seconds)| seconds)
            .sum();
        segments.folded.insert(0, (oldest, merged));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn segments_split_by_when_they_opened() {
        // Proves a step's own segments (opened up to the cutoff) are told apart from
        // work queued after it, and that no cutoff takes everything.
        let start = Instant::now();
        let at = |milliseconds| start + Duration::from_millis(milliseconds);
        let measured = [(at(0), 1.0), (at(10), 2.0), (at(11), 4.0), (at(30), 8.0)];
        assert_eq!(split_at(&measured, Some(at(10))), (3.0, 12.0));
        assert_eq!(split_at(&measured, Some(at(40))), (15.0, 0.0));
        assert_eq!(split_at(&measured, None), (15.0, 0.0));
        assert_eq!(split_at(&[], Some(at(0))), (0.0, 0.0));
    }
}
