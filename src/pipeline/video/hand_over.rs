//! The switch between Wan 2.2 A14B's two experts, measured: from the high-noise
//! expert's last step to the low-noise expert's first, what the time went to and what
//! the first step of the second expert moved. The switch costs the first run's close
//! (its session shut down), the second's open and its first blocks' waits — the last
//! two taken off it when the second opens during the first's last step (`experts`,
//! measured in [`super::BothOpen`]); the figure says whether that stall is small
//! beside one step's compute, the yardstick issue 41 sets. The experts' first-step checks are not part
//! of it: the pipeline makes them after sampling (`super::super::check`), and their
//! time is given apart.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use stagehand_actors::Link;

use super::super::{PipelineRun, Progress, Stage};

/// The switch, as measured.
#[derive(Debug, Clone, PartialEq)]
pub struct HandOver {
    /// From the first expert's last step done to its run closed: its session shut
    /// down (with `verify = full` set, every step's check too; the default check of
    /// the first step is deferred, see `first_step_checks_seconds`).
    pub close_seconds: f64,
    /// From there to the second expert's first step done, less that step's compute:
    /// the second expert opened, its session started, its first blocks waited for.
    pub open_stall_seconds: f64,
    /// The second expert's first step's compute.
    pub first_compute_seconds: f64,
    /// Bytes the second expert's first step moved over each link ([`Link::ALL`]'s
    /// order: disk → pinned, pinned → VRAM, disk → VRAM).
    pub first_step_bytes: [u64; 3],
    /// The first expert's compute per step (its mean): the yardstick.
    pub step_compute_seconds: f64,
    /// Both experts' first steps checked against their resident passes after
    /// sampling, off the switch; `None` when no check was deferred (`verify` set to
    /// something other than `first`). Not part of [`HandOver::stall_seconds`].
    pub first_step_checks_seconds: Option<f64>,
    /// When the second expert opened during the first's last step (both in one
    /// budget): what it loaded before its first step and what both held at once.
    /// `None`: it opened after the first had given back every byte.
    pub both_open: Option<super::BothOpen>,
}

impl HandOver {
    /// The time the switch spent not computing.
    pub fn stall_seconds(&self) -> f64 {
        self.close_seconds + self.open_stall_seconds
    }
}

/// When each expert's steps ended and when the first expert's run closed.
#[derive(Clone, Default)]
pub(super) struct SwitchClock {
    marks: Arc<Mutex<Marks>>,
}

#[derive(Default)]
struct Marks {
    first_last_step: Option<Instant>,
    first_closed: Option<Instant>,
    second_first_step: Option<Instant>,
}

impl SwitchClock {
    /// `run`, its progress also marking the experts' steps (`first` and `second`
    /// name their stages).
    pub(super) fn timed<'a>(
        &self,
        run: &PipelineRun<'a>,
        [first, second]: [&'static str; 2],
    ) -> PipelineRun<'a> {
        let (marks, inner) = (Arc::clone(&self.marks), Arc::clone(&run.progress));
        let progress: Progress = Arc::new(move |stage, done, steps| {
            let now = Instant::now();
            let mut marks = marks.lock().unwrap_or_else(PoisonError::into_inner);
            if stage == first && done == steps && done > 0 {
                marks.first_last_step = Some(now);
            }
            if stage == second && done == 1 {
                marks.second_first_step = Some(now);
            }
            drop(marks);
            inner(stage, done, steps);
        });
        PipelineRun {
            settings: run.settings,
            observer: Arc::clone(&run.observer),
            progress,
            stop: Arc::clone(&run.stop),
            shared: run.shared.clone(),
            stages: run.stages.clone(),
        }
    }

    /// The first expert's run has closed.
    pub(super) fn first_closed(&self) {
        let mut marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        marks.first_closed = Some(Instant::now());
    }

    /// The switch between the two experts' stages, when both ran; their deferred
    /// first-step checks took `checks_seconds`.
    pub(super) fn hand_over(
        &self,
        first: &Stage,
        second: &Stage,
        checks_seconds: Option<f64>,
    ) -> Option<HandOver> {
        let marks = self.marks.lock().unwrap_or_else(PoisonError::into_inner);
        let (last, closed, next) = (
            marks.first_last_step?,
            marks.first_closed?,
            marks.second_first_step?,
        );
        let report = &second.outcome.report;
        let first_compute_seconds = *report.compute_seconds.first()?;
        let computed = &first.outcome.report.compute_seconds;
        let step_compute_seconds = computed.iter().sum::<f64>() / computed.len().max(1) as f64;
        let opened = next.saturating_duration_since(closed).as_secs_f64();
        Some(HandOver {
            close_seconds: closed.saturating_duration_since(last).as_secs_f64(),
            open_stall_seconds: (opened - first_compute_seconds).max(0.0),
            first_compute_seconds,
            first_step_bytes: Link::ALL.map(|link| report.after_first_step.link(link).model_bytes),
            step_compute_seconds,
            first_step_checks_seconds: checks_seconds,
            both_open: None,
        })
    }
}
