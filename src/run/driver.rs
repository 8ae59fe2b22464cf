//! The one run loop: steps of any model family over a session on any device, each
//! checked against the same family's fully-resident reference on the same device.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stagehand_actors::{
    BlockId, ExpertAcquires, ModelLayout, NoObserver, Observer, Session, SessionError,
    StatsSnapshot,
};

use super::recorded::Recorder;
use super::reference::Reference;
use crate::compute::Compute;
use crate::families::blocks::Streamed;
use crate::families::landing::LandingCheck;
use crate::families::lora_set::LoraSet;
pub use crate::families::Model;
use crate::families::{ExpertStep, Family, FamilyError, Visit};
use crate::model::{BlockReader, KnownChecksums};
use crate::settings::Verify;

pub use super::report::{median, RunReport};

/// What each step computes, and the LoRA sets it applies.
pub struct Workload {
    pub model: Model,
    /// LoRA sets by step; empty: no LoRA.
    pub lora: Vec<LoraPhase>,
}

/// From `from_step` on, the run applies `set` (attached to the session when the phase
/// starts, detached when it ends) and checks every step against the merged reference.
pub struct LoraPhase {
    pub from_step: u64,
    pub set: LoraSet,
}

impl Workload {
    pub fn new(model: Model) -> Self {
        Self {
            model,
            lora: Vec::new(),
        }
    }

    /// The same workload applying `phases` of LoRA sets.
    pub fn with_lora(mut self, phases: Vec<LoraPhase>) -> Self {
        self.lora = phases;
        self
    }

    /// The fully-resident reference output of step `step` on `compute`, from the
    /// files of `index` (with the LoRA phase of that step merged in).
    pub fn reference<C: Compute>(
        &self,
        compute: &C,
        index: &crate::model::ModelIndex,
        step: u64,
    ) -> Result<Vec<f32>, FamilyError> {
        let files = BlockReader::open(index)?;
        self.model.visit(ReferenceOf {
            compute,
            workload: self,
            files: &files,
            step,
        })
    }

    /// The blocks the session streams.
    pub fn layout(&self) -> &ModelLayout {
        self.model.facts().layout()
    }

    pub fn order(&self) -> Vec<BlockId> {
        self.model.facts().order()
    }

    /// The LoRA phase step `step` belongs to.
    pub(super) fn phase_at(&self, step: u64) -> Option<usize> {
        self.lora.iter().rposition(|phase| phase.from_step <= step)
    }
}

pub struct DriverOptions {
    /// Steps to run; 0 runs until `stop` is set.
    pub steps: u64,
    pub stop: Arc<AtomicBool>,
    /// Called after each step with its index and duration.
    pub on_step: Box<dyn FnMut(u64, f64) + Send>,
    /// Keep each reference key's last output in the report (`embed` prints them).
    pub keep_outputs: bool,
    /// Called with each token a decoder picks, as it is picked (`generate`).
    pub on_token: Option<Box<dyn FnMut(u32) + Send>>,
    /// Told what the run loop sees that the actors do not: each MoE step's expert
    /// acquires (the session's own observer reports the rest).
    pub observer: Arc<dyn Observer>,
    /// How the steps are checked (`verify`).
    pub verify: Verify,
}

impl DriverOptions {
    pub fn steps(steps: u64) -> Self {
        Self {
            steps,
            stop: Arc::new(AtomicBool::new(false)),
            on_step: Box::new(|_, _| {}),
            keep_outputs: false,
            on_token: None,
            observer: Arc::new(NoObserver),
            verify: Verify::Full,
        }
    }
}

/// Step times a report keeps: the first step and the latest ones.
pub const REPORT_STEP_HISTORY: usize = 4096;

/// [`drive`] on the CPU backend (`session` must run on a `CpuDevice`), with the
/// references read from `index`'s files.
pub fn drive_cpu(
    session: Session,
    workload: &Workload,
    index: &crate::model::ModelIndex,
    options: DriverOptions,
) -> Result<RunReport, Box<(FamilyError, StatsSnapshot)>> {
    let files = match BlockReader::open(index) {
        Ok(files) => files,
        Err(error) => {
            let stats = session.finish();
            return Err(Box::new((error.into(), stats)));
        }
    };
    drive(
        session,
        &crate::device::CpuCompute::new(),
        workload,
        &files,
        options,
    )
}

/// Runs the steps, then checks every step against the fully-resident reference (a
/// run without a step count, stopped by the user, checks each step as it goes). On
/// any failure the session is still shut down — every budget is released — before
/// the error is returned.
pub fn drive<C: Compute>(
    session: Session,
    compute: &C,
    workload: &Workload,
    files: &BlockReader<'_>,
    options: DriverOptions,
) -> Result<RunReport, Box<(FamilyError, StatsSnapshot)>> {
    drive_traced(session, compute, workload, files, options, None)
}

/// As [`drive`], recording each block's compute into `trace` (`--trace`).
pub fn drive_traced<C: Compute>(
    session: Session,
    compute: &C,
    workload: &Workload,
    files: &BlockReader<'_>,
    options: DriverOptions,
    trace: Option<&crate::telemetry::TraceObserver>,
) -> Result<RunReport, Box<(FamilyError, StatsSnapshot)>> {
    workload.model.visit(Drive {
        session,
        compute,
        workload,
        files,
        options,
        trace,
    })
}

/// [`drive_traced`] over whichever family the workload holds.
struct Drive<'a, C: Compute> {
    session: Session,
    compute: &'a C,
    workload: &'a Workload,
    files: &'a BlockReader<'a>,
    options: DriverOptions,
    trace: Option<&'a crate::telemetry::TraceObserver>,
}

impl<C: Compute> Visit for Drive<'_, C> {
    type Output = Result<RunReport, Box<(FamilyError, StatsSnapshot)>>;

    fn visit<F: Family>(self, family: &F) -> Self::Output {
        drive_family(
            family,
            self.session,
            self.compute,
            self.workload,
            self.files,
            self.options,
            self.trace,
        )
    }
}

/// [`Workload::reference`] over whichever family the workload holds.
struct ReferenceOf<'a, C: Compute> {
    compute: &'a C,
    workload: &'a Workload,
    files: &'a BlockReader<'a>,
    step: u64,
}

impl<C: Compute> Visit for ReferenceOf<'_, C> {
    type Output = Result<Vec<f32>, FamilyError>;

    fn visit<F: Family>(self, family: &F) -> Self::Output {
        let mut reference = Reference::new(family, self.workload, self.files);
        let mut output = Vec::new();
        let first = if family.reference_is_sequential() {
            0
        } else {
            self.step
        };
        for replayed in first..=self.step {
            output = reference.expected(self.compute, replayed)?.to_vec();
        }
        Ok(output)
    }
}

fn drive_family<C: Compute, F: Family>(
    family: &F,
    mut session: Session,
    compute: &C,
    workload: &Workload,
    files: &BlockReader<'_>,
    mut options: DriverOptions,
    trace: Option<&crate::telemetry::TraceObserver>,
) -> Result<RunReport, Box<(FamilyError, StatsSnapshot)>> {
    // A stop request also ends any wait inside a step (a miss, an attach).
    session.stop_on(Arc::clone(&options.stop));
    let mut report = RunReport::new(session.plan().clone());
    let mut reference = Reference::new(family, workload, files);
    let recorded = run_steps(
        family,
        &mut session,
        compute,
        workload,
        &mut reference,
        &mut options,
        trace,
        &mut report,
    );
    if recorded.is_ok() {
        report.lora = session.lora_usage().unwrap_or_default();
    }
    // The session's memory goes back before the reference pass needs its own.
    let stats = session.finish();
    let outcome =
        recorded.and_then(|recorder| recorder.verify(compute, &mut reference, &mut report));
    match outcome {
        Ok(()) => {
            report.stats = stats;
            Ok(report)
        }
        Err(error) => Err(Box::new((error, stats))),
    }
}

#[allow(clippy::too_many_arguments)]
fn run_steps<'a, C: Compute, F: Family>(
    family: &'a F,
    session: &mut Session,
    compute: &C,
    workload: &'a Workload,
    reference: &mut Reference<'a, C, F>,
    options: &mut DriverOptions,
    trace: Option<&crate::telemetry::TraceObserver>,
    report: &mut RunReport,
) -> Result<Recorder, FamilyError> {
    let mut state = family.start(compute)?;
    let mut blocks = Streamed::new(session, compute, trace)?;
    blocks.landing = landing_check(options.verify, reference.files(), family.layout());
    let mut recorder = Recorder::new(options.steps == 0);
    let mut phase_now = None;
    let mut step = 0u64;
    while options.steps == 0 || step < options.steps {
        if options.stop.load(Ordering::Relaxed) {
            break;
        }
        let phase = workload.phase_at(step);
        if phase != phase_now {
            let set = phase.map(|phase| &workload.lora[phase].set);
            blocks.switch_lora(compute, set, phase.unwrap_or(usize::MAX))?;
            phase_now = phase;
        }
        if step + 1 == options.steps {
            // Nothing is prefetched for a step that never comes.
            blocks.session().last_step();
        }
        blocks.begin_step();
        let started = Instant::now();
        let output = match family.step(compute, &mut state, &mut blocks, step) {
            Ok(output) => output,
            Err(error) => {
                // Holds taken before the failure go back before the session drains.
                let _ = blocks.drain(compute);
                // Stopped inside a step: the steps before it stand.
                if matches!(error, FamilyError::Session(SessionError::Interrupted)) {
                    break;
                }
                return Err(error);
            }
        };
        blocks.drain(compute)?;
        let step_seconds = started.elapsed().as_secs_f64();
        let low_rank = blocks.low_rank_used;
        record_step_seconds(report, step_seconds, blocks.compute_seconds);
        blocks.session().step_done();
        report.tolerance_steps += u64::from(low_rank);
        record_experts(report, options.observer.as_ref(), &output.experts);
        report.record_decoder_step(step, &output);
        let token = output.decoded.as_ref().map(|decoded| decoded.token);
        if let (Some(token), Some(on_token)) = (token, options.on_token.as_mut()) {
            on_token(token);
        }
        if step == 0 {
            report.after_first_step = blocks.session().stats();
            if options.verify == Verify::First && report.plan.pins.disk_bytes_per_step == 0 {
                prefetch_for_reference(reference.files(), family.layout());
            }
        }
        (options.on_step)(step, step_seconds);
        let against_reference = match options.verify {
            Verify::Full => true,
            Verify::First => step == 0,
            Verify::Weights | Verify::Off => false,
        };
        if let Some(values) = output.output.clone().filter(|_| !against_reference) {
            if options.keep_outputs {
                report.outputs.insert(family.reference_key(step), values);
            }
        } else if let Some(values) = output.output {
            let checked =
                recorder.check_or_keep(compute, reference, step, &values, low_rank, report)?;
            if checked.is_break() {
                step += 1;
                break;
            }
            if options.keep_outputs {
                report.outputs.insert(family.reference_key(step), values);
            }
        } else {
            // The step checked itself (stream-verify against the file's checksums).
            report.verified_steps += 1;
        }
        step += 1;
    }
    report.steps = step;
    report.verify = options.verify;
    if let Some(landing) = &blocks.landing {
        report.landings_checked = landing.landings;
        report.landed_bytes_checked = landing.bytes;
        report.checksums_read_from_files = landing.read_from_files;
    }
    Ok(recorder)
}

/// The landing check `verify` asks for, with the file checksums earlier runs kept.
fn landing_check<'a>(
    verify: Verify,
    files: &'a BlockReader<'a>,
    layout: &'a ModelLayout,
) -> Option<LandingCheck<'a>> {
    if !verify.checks_weights() {
        return None;
    }
    let known = KnownChecksums::open(&super::default_cache_dir(), files.index());
    Some(LandingCheck::new(files, layout).with_known(known))
}

/// `verify = first` checks its first step against a reference that takes every block
/// from the files after the run; the pin manager dropped the pages of the blocks it
/// pinned, so that would be a read from the disk (MiniLM: 43 MB, 20–40 ms after the
/// last step). Where the steps that follow read nothing from the disk, the kernel reads
/// the blocks in now, in the background, while they compute, and the reference then
/// computes from those cached pages (`BlockReader::cached`) — if the model takes at
/// most half the RAM the host has available (a second copy beside the pins must not
/// push it to swap).
fn prefetch_for_reference(files: &BlockReader<'_>, layout: &ModelLayout) {
    let available = crate::os::available_ram_bytes().unwrap_or(0);
    if layout.total_bytes() > available / 2 {
        return;
    }
    for block in &layout.blocks {
        files.prefetch(&block.extents);
    }
}

/// A step's time and its compute time, kept within [`REPORT_STEP_HISTORY`].
fn record_step_seconds(report: &mut RunReport, step_seconds: f64, compute_seconds: f64) {
    if report.step_seconds.len() == REPORT_STEP_HISTORY {
        // Bounded for runs that never end (`--steps 0`): the cold first step stays,
        // the oldest steady one goes.
        report.step_seconds.remove(1);
        report.compute_seconds.remove(1);
    }
    report.step_seconds.push(step_seconds);
    report.compute_seconds.push(compute_seconds);
}

/// A MoE step's expert acquires, counted in the report and told to the observer.
fn record_experts(report: &mut RunReport, observer: &dyn Observer, experts: &ExpertStep) {
    report.expert_hits += experts.hits;
    report.expert_misses += experts.misses;
    report.expert_late += experts.late;
    report.expert_hints += experts.hints;
    if experts.acquires() > 0 {
        observer.expert_acquires(ExpertAcquires {
            hits: experts.hits,
            late: experts.late,
            misses: experts.misses - experts.late,
        });
    }
}
