//! A recorder of disk, copy and compute slices, written as a Chrome trace.
//!
//! Used by the simulator (exact virtual times) and by `stagehand run` on real backends
//! (wall-clock times since the run started): both record `(lane, label, start, end)`
//! and the file opens in Perfetto or `chrome://tracing` with one row per lane, so the
//! overlap of reads, copies and compute is visible at a glance.
//!
//! The format is the Trace Event format's "complete" events (`ph: "X"`) with
//! microsecond timestamps, plus `thread_name` metadata naming the lanes.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

/// A row of the trace: one resource that does one thing at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Lane {
    Disk,
    Copy,
    Compute,
}

impl Lane {
    pub const ALL: [Lane; 3] = [Lane::Disk, Lane::Copy, Lane::Compute];

    pub fn label(self) -> &'static str {
        match self {
            Lane::Disk => "disk",
            Lane::Copy => "copy",
            Lane::Compute => "compute",
        }
    }

    /// The Chrome trace thread id of the lane (stable, so traces diff cleanly).
    pub fn thread_id(self) -> u32 {
        match self {
            Lane::Disk => 1,
            Lane::Copy => 2,
            Lane::Compute => 3,
        }
    }
}

/// One operation on one lane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TraceSlice {
    pub lane: Lane,
    /// Sub-lane: real runs overlap transfers on one resource (several reads in
    /// flight), and a trace row must not overlap, so they are packed onto rows
    /// `disk 0`, `disk 1`, ... The simulator's lanes are serial: always row 0.
    pub row: u32,
    pub label: String,
    pub start: Duration,
    pub end: Duration,
    /// Bytes moved, for reads and copies.
    pub bytes: Option<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("could not write the trace to {path}: {reason}")]
    Write { path: String, reason: String },
}

/// Collects slices from any thread. Bounded: past `capacity` slices it counts the
/// dropped ones instead of growing, and says so in the written trace.
#[derive(Debug)]
pub struct TraceRecorder {
    slices: Mutex<Vec<TraceSlice>>,
    capacity: usize,
    dropped: AtomicU64,
}

impl Default for TraceRecorder {
    fn default() -> Self {
        Self::with_capacity(Self::DEFAULT_CAPACITY)
    }
}

impl TraceRecorder {
    /// About 100 MB of JSON: 50 steps of a 1000-block model on three lanes fit 20 times.
    pub const DEFAULT_CAPACITY: usize = 1 << 20;

    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            slices: Mutex::new(Vec::new()),
            capacity,
            dropped: AtomicU64::new(0),
        }
    }

    /// Records one slice on the lane's first row; times are offsets from the run's start.
    pub fn record(
        &self,
        lane: Lane,
        label: impl Into<String>,
        start: Duration,
        end: Duration,
        bytes: Option<u64>,
    ) {
        self.record_on_row(lane, 0, label, start, end, bytes);
    }

    /// Records one slice on a sub-lane (see [`TraceSlice::row`]).
    pub fn record_on_row(
        &self,
        lane: Lane,
        row: u32,
        label: impl Into<String>,
        start: Duration,
        end: Duration,
        bytes: Option<u64>,
    ) {
        let mut slices = self.lock();
        if slices.len() >= self.capacity {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        slices.push(TraceSlice {
            lane,
            row,
            label: label.into(),
            start,
            end: end.max(start),
            bytes,
        });
    }

    /// Renames the most recent slice on `lane` that ended exactly at `end` (the
    /// simulator names copies once the actors say which block they carried).
    /// Returns whether one was found.
    pub fn relabel(&self, lane: Lane, end: Duration, label: &str) -> bool {
        let mut slices = self.lock();
        // Completions are reported promptly: the slice is near the back.
        match slices
            .iter_mut()
            .rev()
            .take(RELABEL_SEARCH_SLICES)
            .find(|slice| slice.lane == lane && slice.end == end)
        {
            Some(slice) => {
                slice.label = label.to_string();
                true
            }
            None => false,
        }
    }

    /// Slices dropped because the recorder was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// All slices, ordered by lane, row, then start time (a stable order, so the same run
    /// gives the same file byte for byte even when threads recorded out of order).
    pub fn slices(&self) -> Vec<TraceSlice> {
        let mut slices = self.lock().clone();
        slices.sort_by(|a, b| {
            (a.lane, a.row, a.start, a.end, &a.label)
                .cmp(&(b.lane, b.row, b.start, b.end, &b.label))
        });
        slices
    }

    /// The Chrome Trace Event JSON of everything recorded so far.
    pub fn chrome_trace_json(&self) -> String {
        let mut events = vec![ChromeEvent::metadata(
            "process_name",
            0,
            "stagehand".to_string(),
        )];
        let slices = self.slices();
        for lane in Lane::ALL {
            let rows = slices
                .iter()
                .filter(|slice| slice.lane == lane)
                .map(|slice| slice.row + 1)
                .max()
                .unwrap_or(1);
            for row in 0..rows {
                // One row keeps the plain lane name; packed rows are numbered.
                let name = if rows == 1 {
                    lane.label().to_string()
                } else {
                    format!("{} {row}", lane.label())
                };
                events.push(ChromeEvent::metadata(
                    "thread_name",
                    thread_id(lane, row),
                    name,
                ));
            }
        }
        events.extend(slices.into_iter().map(ChromeEvent::slice));
        let trace = ChromeTrace {
            trace_events: events,
            display_time_unit: "ms",
            other_data: OtherData {
                dropped_slices: self.dropped(),
            },
        };
        // Serializing plain structs of strings and numbers cannot fail.
        serde_json::to_string(&trace).unwrap_or_default()
    }

    pub fn write_chrome_trace(&self, path: &Path) -> Result<(), TraceError> {
        let write_error = |error: std::io::Error| TraceError::Write {
            path: path.display().to_string(),
            reason: error.to_string(),
        };
        // Never a FIFO: one with no reader would block this write forever.
        let mut file = crate::os::create_regular(path).map_err(write_error)?;
        std::io::Write::write_all(&mut file, self.chrome_trace_json().as_bytes())
            .map_err(write_error)
    }

    /// Checks, before a run, that `path` can take the trace it will write at the end:
    /// an unwritable path is bad input reported at start, not after every step ran.
    pub fn check_writable(path: &Path) -> Result<(), TraceError> {
        crate::os::create_regular(path)
            .map(drop)
            .map_err(|error| TraceError::Write {
                path: path.display().to_string(),
                reason: error.to_string(),
            })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<TraceSlice>> {
        // A push either happened or not: a poisoned vector is still consistent.
        self.slices
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ChromeTrace {
    trace_events: Vec<ChromeEvent>,
    display_time_unit: &'static str,
    other_data: OtherData,
}

#[derive(Serialize)]
struct OtherData {
    dropped_slices: u64,
}

#[derive(Serialize)]
struct ChromeEvent {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cat: Option<&'static str>,
    ph: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    ts: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dur: Option<f64>,
    pid: u32,
    tid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    args: Option<ChromeArgs>,
}

#[derive(Serialize)]
struct ChromeArgs {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bytes: Option<u64>,
}

impl ChromeEvent {
    fn metadata(kind: &str, tid: u32, name: String) -> Self {
        Self {
            name: kind.to_string(),
            cat: None,
            ph: "M",
            ts: None,
            dur: None,
            pid: 1,
            tid,
            args: Some(ChromeArgs {
                name: Some(name),
                bytes: None,
            }),
        }
    }

    fn slice(slice: TraceSlice) -> Self {
        Self {
            name: slice.label,
            cat: Some(slice.lane.label()),
            ph: "X",
            ts: Some(microseconds(slice.start)),
            dur: Some(microseconds(slice.end - slice.start)),
            pid: 1,
            tid: thread_id(slice.lane, slice.row),
            args: slice.bytes.map(|bytes| ChromeArgs {
                name: None,
                bytes: Some(bytes),
            }),
        }
    }
}

/// Row 0 keeps the lane's own id; further rows get ids of their own after it.
fn thread_id(lane: Lane, row: u32) -> u32 {
    if row == 0 {
        lane.thread_id()
    } else {
        lane.thread_id() * 1000 + row
    }
}

/// How far back `relabel` looks.
const RELABEL_SEARCH_SLICES: usize = 4096;

fn microseconds(duration: Duration) -> f64 {
    duration.as_nanos() as f64 / 1_000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chrome_trace_names_lanes_and_orders_slices() {
        let recorder = TraceRecorder::new();
        let ms = Duration::from_millis;
        recorder.record(Lane::Copy, "block 1", ms(2), ms(3), Some(10));
        recorder.record(Lane::Copy, "block 0", ms(0), ms(2), Some(10));
        recorder.record(Lane::Compute, "block 0", ms(2), ms(4), None);
        let json: serde_json::Value = serde_json::from_str(&recorder.chrome_trace_json()).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        let lane_names: Vec<&str> = events
            .iter()
            .filter(|event| event["name"] == "thread_name")
            .map(|event| event["args"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(lane_names, ["disk", "copy", "compute"]);
        let slices: Vec<(&str, f64, f64)> = events
            .iter()
            .filter(|event| event["ph"] == "X")
            .map(|event| {
                (
                    event["name"].as_str().unwrap(),
                    event["ts"].as_f64().unwrap(),
                    event["dur"].as_f64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            slices,
            [
                ("block 0", 0.0, 2000.0),
                ("block 1", 2000.0, 1000.0),
                ("block 0", 2000.0, 2000.0)
            ]
        );
    }

    #[test]
    fn a_full_recorder_counts_what_it_drops() {
        let recorder = TraceRecorder::with_capacity(1);
        recorder.record(Lane::Disk, "a", Duration::ZERO, Duration::ZERO, None);
        recorder.record(Lane::Disk, "b", Duration::ZERO, Duration::ZERO, None);
        assert_eq!(recorder.len(), 1);
        assert_eq!(recorder.dropped(), 1);
        assert!(recorder
            .chrome_trace_json()
            .contains("\"dropped_slices\":1"));
    }
}
