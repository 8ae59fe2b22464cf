//! Chrome traces of real runs: an [`Observer`] that turns the actors' block transfers
//! into trace slices on wall-clock offsets.
//!
//! A real machine overlaps transfers on one resource (several reads in flight, a copy
//! queued behind another: the actors time a transfer from issue to completion), and a
//! trace row must not overlap, so each lane's slices are packed onto numbered rows
//! (`disk 0`, `disk 1`, ...): a slice goes on the first row whose slices all ended
//! before it started.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use stagehand_actors::{BlockId, Link, Observer};

use super::trace::{Lane, TraceRecorder};

/// Records block transfers (and, through [`TraceObserver::compute`], the compute of
/// each block) into a [`TraceRecorder`]. Install it with `stagehand_actors::Tee`
/// beside the run's other observer.
pub struct TraceObserver {
    recorder: Arc<TraceRecorder>,
    origin: Instant,
    names: Vec<String>,
    /// Per lane, the latest end on each row.
    rows: Mutex<[Vec<Duration>; 3]>,
}

impl TraceObserver {
    /// `names` are the blocks' names, by block index; times are offsets from now.
    pub fn new(recorder: Arc<TraceRecorder>, names: Vec<String>) -> Self {
        Self::with_origin(recorder, names, Instant::now())
    }

    pub fn with_origin(recorder: Arc<TraceRecorder>, names: Vec<String>, origin: Instant) -> Self {
        Self {
            recorder,
            origin,
            names,
            rows: Mutex::new([Vec::new(), Vec::new(), Vec::new()]),
        }
    }

    pub fn recorder(&self) -> &Arc<TraceRecorder> {
        &self.recorder
    }

    /// Records the compute of one block, from `started` to `ended`.
    pub fn compute(&self, block: BlockId, started: Instant, ended: Instant) {
        let start = started.saturating_duration_since(self.origin);
        let end = ended.saturating_duration_since(self.origin);
        let label = self.name(block);
        self.place(Lane::Compute, label, start, end, None);
    }

    fn name(&self, block: BlockId) -> String {
        self.names
            .get(block.index())
            .cloned()
            .unwrap_or_else(|| block.to_string())
    }

    /// Puts the slice on the lane's first row that is free from `start`.
    fn place(&self, lane: Lane, label: String, start: Duration, end: Duration, bytes: Option<u64>) {
        let row = {
            // Each update is one push or one store: a poisoned lock is still consistent.
            let mut rows = self
                .rows
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let lane_rows = &mut rows[lane_index(lane)];
            match lane_rows.iter().position(|&busy_until| busy_until <= start) {
                Some(row) => {
                    lane_rows[row] = end;
                    row
                }
                None => {
                    lane_rows.push(end);
                    lane_rows.len() - 1
                }
            }
        };
        self.recorder
            .record_on_row(lane, row as u32, label, start, end, bytes);
    }
}

fn lane_index(lane: Lane) -> usize {
    match lane {
        Lane::Disk => 0,
        Lane::Copy => 1,
        Lane::Compute => 2,
    }
}

impl Observer for TraceObserver {
    fn block_transfer(&self, link: Link, block: BlockId, bytes: u64, seconds: f64) {
        let end = self.origin.elapsed();
        let start = end.saturating_sub(Duration::try_from_secs_f64(seconds).unwrap_or_default());
        let (lane, label) = match link {
            Link::DiskToPinned => (Lane::Disk, self.name(block)),
            Link::PinnedToVram => (Lane::Copy, self.name(block)),
            // A fast-disk chunk: read and copied in one go, shown where it lands.
            Link::DiskToVram => (Lane::Copy, format!("{} (disk→vram)", self.name(block))),
        };
        self.place(lane, label, start, end, Some(bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_transfers_are_packed_onto_rows_that_never_overlap() {
        let recorder = Arc::new(TraceRecorder::new());
        let observer = TraceObserver::new(Arc::clone(&recorder), vec!["a".into(), "b".into()]);
        let ms = Duration::from_millis;
        observer.place(Lane::Disk, "a".into(), ms(0), ms(10), None);
        observer.place(Lane::Disk, "b".into(), ms(5), ms(15), None);
        observer.place(Lane::Disk, "c".into(), ms(10), ms(20), None);
        observer.place(Lane::Copy, "a".into(), ms(5), ms(15), None);
        let rows: Vec<(String, u32)> = recorder
            .slices()
            .into_iter()
            .map(|slice| (slice.label, slice.row))
            .collect();
        assert_eq!(
            rows,
            [
                ("a".to_string(), 0),
                ("c".to_string(), 0),
                ("b".to_string(), 1),
                ("a".to_string(), 0)
            ]
        );
        let json = recorder.chrome_trace_json();
        assert!(
            json.contains("\"disk 0\"") && json.contains("\"disk 1\""),
            "{json}"
        );
        assert!(json.contains("\"copy\""), "{json}");
    }
}
