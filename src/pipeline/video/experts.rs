//! Wan 2.2 A14B's two experts in one budget, the low-noise expert's first blocks
//! loaded during the high-noise expert's last step.
//!
//! Both experts are members of one shared budget of the settings' size (the
//! broker `serve` uses; in `serve` the server's own): never two budgets. When the
//! high-noise expert begins its last step, the low-noise expert's run opens on a
//! thread of its own — its model opened with the share's shape, its lease taken from
//! the first expert's by the broker, its session started, and the session's first
//! scheduling pass loading the first blocks of its order (the look-ahead of
//! `prefetch_depth`, through the pin manager and the allocator, inside its lease).
//! Its first step then waits for the latent and the solver's state the first expert's
//! last step leaves ([`DeferredSample`]), or for the stop flag. Once the first expert
//! has left the budget the second is used again, so it grows into the whole of it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stagehand_actors::{Lease, SharedBudget, Tee};

use super::super::check::FirstStepCheck;
use super::super::{PipelineError, PipelinePart, PipelineRun, Progress, Stage};
use super::both_open::{BothOpen, Pair};
use crate::families::wan::{DeferredSample, SampleStart, WanInput, WanSample};
use crate::families::{Extras, WorkloadKind};
use crate::run::{budgets_for, BudgetAsk, RunError};

/// One expert's run: its stage's name, its model, its share of the schedule.
pub(super) struct Expert<'p> {
    pub name: &'static str,
    pub part: &'p PipelinePart,
    pub share: WanSample,
}

/// A stage and its deferred first-step check.
pub(super) type Ran = (Stage, Option<FirstStepCheck>);

/// What the two runs made.
pub(super) struct Paired {
    pub first: Ran,
    /// The second expert's run; `None` when the two did not fit in the budget side
    /// by side (the caller then runs `second_share` after the first, as before).
    pub second: Option<Ran>,
    /// The second expert's share with the start the first left it.
    pub second_share: WanSample,
    /// What both held together and what the second loaded before its first step,
    /// when it ran beside the first.
    pub both_open: Option<BothOpen>,
}

/// How often a wait for the first expert's last step looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(20);

/// Runs `first`, and `second` (its share's start still the shape's) opened during
/// the first's last step; `replay` turns the first's stage into the second's start.
pub(super) fn run_paired(
    run: &PipelineRun<'_>,
    [first, second]: [Expert<'_>; 2],
    replay: impl FnOnce(&Stage) -> Result<SampleStart, PipelineError>,
) -> Result<Paired, PipelineError> {
    let started = Instant::now();
    let first_extras = Extras::default().with(first.share.clone());
    let prepared = run.open(
        (first.name, WorkloadKind::Auto),
        first.part,
        &first_extras,
        1,
    )?;
    let first_steps = first.share.steps as u64;
    let (pool, owner) = one_budget(run, &prepared, first_steps)?;
    let pair = Arc::new(Pair::default());
    let (go, went) = flume::bounded::<()>(1);
    let second_name = second.name;
    let second_run = member_run(run, (&pool, &owner), &pair, 1, |inner| {
        // Its opening is not its start: the caller says when its steps begin.
        Arc::new(move |stage, done, steps| {
            if (stage, done) != (second_name, 0) {
                inner(stage, done, steps);
            }
        })
    });
    let (sender, deferred) = DeferredSample::channel(Arc::clone(&run.stop));
    let second_steps = second.share.steps as u64;
    let shape = second.share.clone();
    let (verdict, opening) = flume::bounded::<Option<Lease>>(1);
    let first_member = format!("{owner}:{}", first.name);
    std::thread::scope(|scope| {
        let opened = scope.spawn(|| {
            wait_for(&went, &second_run, second_name)?;
            // The experts are the same model: the second's floor is the first's.
            let floor = floor_of(&pool, &first_member);
            let fits = floor.filter(|&floor| fits_beside(&pool, floor));
            let _ = verdict.send(fits);
            if fits.is_none() {
                return Ok(None);
            }
            let extras = (Extras::default().with(shape)).with(deferred);
            let kind = (second_name, WorkloadKind::Auto);
            (second_run.stage_deferred(kind, second.part, &extras, second_steps)).map(Some)
        });
        let (first_name, last_step_begins) = (first.name, first_steps - 1);
        let first_run = member_run(run, (&pool, &owner), &pair, 0, |inner| {
            Arc::new(move |stage, done, steps| {
                if stage == first_name && done == last_step_begins {
                    let _ = go.try_send(());
                }
                inner(stage, done, steps);
            })
        });
        let timed = (first_name, started);
        let ran = first_run.run_deferred(timed, first.part, prepared, first_steps);
        // Its progress (and the signal to open the second) goes with it.
        drop(first_run);
        let ran = ran.and_then(|ran| Ok((replay(&ran.0)?, ran)));
        let (start, first_ran) = match ran {
            Ok(ran) => ran,
            Err(error) => {
                // No start will come: the second's wait ends and its bytes go back.
                drop(sender);
                let _ = opened.join();
                return Err(error);
            }
        };
        let mut paired = Paired {
            first: first_ran,
            second: None,
            second_share: with_start(&second.share, &start),
            both_open: None,
        };
        let Ok(Some(floor)) = opening.recv() else {
            // Not opened (a stop, or both floors do not fit): the caller runs it now.
            drop(sender);
            let _ = opened.join();
            return Ok(paired);
        };
        pair.second_began();
        (run.progress)(second_name, 0, second_steps);
        let _ = sender.send(start);
        // The first expert has left the budget: the second grows into its room.
        let _ = pool.begin_use(&format!("{owner}:{second_name}"));
        let second_ran = opened
            .join()
            .map_err(|_| PipelineError::Failed(format!("{second_name}: its thread panicked")))?;
        paired.second = ended(run, second_name, second_ran)?;
        let total = pool.total();
        let figures = pair.figures([total.vram_bytes, total.pin_bytes], Some(floor));
        paired.both_open = paired.second.is_some().then_some(figures);
        Ok(paired)
    })
}

/// `shape` from `start`: the share the second expert's steps took.
fn with_start(shape: &WanSample, start: &SampleStart) -> WanSample {
    WanSample {
        input: WanInput {
            latent: start.latent.clone(),
            ..shape.input.clone()
        },
        solver: start.solver.clone(),
        steps: shape.steps,
    }
}

/// How the second expert's run opened beside the first ended: its stage; `None`
/// when its lease fell below its floor as it joined (blocks of the first held then),
/// for the caller to run it after the first; a stop ends it Cancelled.
fn ended(
    run: &PipelineRun<'_>,
    name: &'static str,
    result: Result<Option<Ran>, PipelineError>,
) -> Result<Option<Ran>, PipelineError> {
    match result {
        Ok(ran) => Ok(ran),
        Err(error) if run.stop.load(Ordering::SeqCst) => Err(cancelled(name, error)),
        Err(PipelineError::Stage {
            source: RunError::BudgetTooSmall { .. },
            ..
        }) => Ok(None),
        Err(error) => Err(error),
    }
}

/// The floor `member` joined `pool` with (the least its plan runs in).
fn floor_of(pool: &SharedBudget, member: &str) -> Option<Lease> {
    let members = pool.snapshot();
    let found = members.iter().find(|found| found.name == member);
    found.map(|found| found.ask.floor)
}

/// Whether a model of `floor` fits in `pool` beside the floors of its members.
fn fits_beside(pool: &SharedBudget, floor: Lease) -> bool {
    let members = pool.snapshot();
    let floors = (members.iter()).fold(floor, |sum, member| sum.plus(member.ask.floor));
    floors.within(pool.total())
}

/// A stage stopped: whatever ended it, it ends Cancelled.
fn cancelled(stage: &'static str, error: PipelineError) -> PipelineError {
    match error {
        PipelineError::Stage {
            source: source @ RunError::Cancelled { .. },
            stage,
        } => PipelineError::Stage { stage, source },
        other => PipelineError::Stage {
            stage,
            source: RunError::Cancelled {
                message: format!("stopped ({other})"),
            },
        },
    }
}

/// The one budget both experts run in: `serve`'s shared budget, or one of the
/// budgets the settings give the first expert alone (each expert is the same size).
fn one_budget(
    run: &PipelineRun<'_>,
    prepared: &crate::run::Prepared,
    steps: u64,
) -> Result<(SharedBudget, String), PipelineError> {
    if let Some((pool, owner)) = &run.shared {
        return Ok((pool.clone(), owner.clone()));
    }
    let budgets = budgets_for(prepared, run.settings, BudgetAsk::steps(steps));
    let total = Lease {
        vram_bytes: budgets.vram_budget_bytes,
        pin_bytes: budgets.pin_ceiling_bytes,
    };
    let pool = SharedBudget::start(total)
        .map_err(|error| PipelineError::Failed(format!("the experts' budget: {error}")))?;
    Ok((pool, "video".to_string()))
}

/// `run` as a member of the shared budget `pool` (named `owner:STAGE`), its sessions
/// also observed as expert `expert` of `pair`, its progress wrapped by `progress`.
fn member_run<'a>(
    run: &PipelineRun<'a>,
    (pool, owner): (&SharedBudget, &str),
    pair: &Arc<Pair>,
    expert: usize,
    progress: impl FnOnce(Progress) -> Progress,
) -> PipelineRun<'a> {
    PipelineRun {
        settings: run.settings,
        observer: Arc::new(Tee(Arc::clone(&run.observer), pair.expert(expert))),
        progress: progress(Arc::clone(&run.progress)),
        stop: Arc::clone(&run.stop),
        shared: Some((pool.clone(), owner.to_string())),
        stages: run.stages.clone(),
    }
}

/// Waits for the first expert's last step to begin; a stop or the first's end
/// without it ends the second's run before it opens.
fn wait_for(
    went: &flume::Receiver<()>,
    run: &PipelineRun<'_>,
    name: &'static str,
) -> Result<(), PipelineError> {
    loop {
        if run.stop.load(Ordering::SeqCst) {
            break;
        }
        match went.recv_timeout(STOP_POLL) {
            Ok(()) => return Ok(()),
            Err(flume::RecvTimeoutError::Timeout) => continue,
            Err(flume::RecvTimeoutError::Disconnected) => break,
        }
    }
    Err(PipelineError::Stage {
        stage: name,
        source: RunError::Cancelled {
            message: "the expert before it ended first".into(),
        },
    })
}
