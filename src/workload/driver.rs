//! The one run loop: steps of any model family over a session on any device, each
//! checked against the same family's fully-resident reference on the same device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stagehand_actors::{BlockId, ModelLayout, Session, SessionError, StatsSnapshot};

use super::blocks::{FromFiles, Streamed};
use super::encoder::Encoder;
use super::family::{Family, StepOutput};
use super::linear_stack::{first_difference, first_difference_within, LinearStack};
use super::lora_set::{LoraSet, LORA_TOLERANCE};
use super::moe::MoeRun;
use super::stream_verify::StreamVerify;
use super::WorkloadError;
use crate::compute::Compute;
use crate::model::BlockReader;

pub use super::report::{median, RunReport};

/// Step times a report keeps: the first step and the latest ones.
pub const REPORT_STEP_HISTORY: usize = 4096;

/// Reference outputs a run keeps (see [`References`]): every input of an encoder run
/// of up to this many texts stays computed once.
pub const REFERENCES_KEPT: usize = 256;

/// The model a run computes.
pub enum Model {
    /// The generated demo model: a real GEMM forward pass.
    LinearStack(LinearStack),
    /// The generated mixture-of-experts model.
    Moe(MoeRun),
    /// Any checkpoint: bytes checked against the file, nothing computed.
    StreamVerify(StreamVerify),
    /// A BERT-family encoder from a Hugging Face folder.
    Encoder(Box<Encoder>),
}

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

macro_rules! with_family {
    ($model:expr, $family:ident => $body:expr) => {
        match $model {
            Model::LinearStack($family) => $body,
            Model::Moe($family) => $body,
            Model::StreamVerify($family) => $body,
            Model::Encoder($family) => {
                let $family = &**$family;
                $body
            }
        }
    };
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
    ) -> Result<Vec<f32>, WorkloadError> {
        let files = BlockReader::open(index)?;
        let mut references = References::new(&files);
        with_family!(&self.model, family => {
            references.expected(compute, family, self, step).cloned()
        })
    }

    /// The blocks the session streams.
    pub fn layout(&self) -> &ModelLayout {
        with_family!(&self.model, family => family.layout())
    }

    pub fn order(&self) -> Vec<BlockId> {
        with_family!(&self.model, family => family.order())
    }

    /// The LoRA phase step `step` belongs to.
    fn phase_at(&self, step: u64) -> Option<usize> {
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
}

impl DriverOptions {
    pub fn steps(steps: u64) -> Self {
        Self {
            steps,
            stop: Arc::new(AtomicBool::new(false)),
            on_step: Box::new(|_, _| {}),
            keep_outputs: false,
        }
    }
}

/// The fully-resident reference outputs of a run, by (reference key, LoRA phase),
/// computed by the family itself over blocks read straight from the files. At most
/// [`REFERENCES_KEPT`] are kept, the oldest dropped first: a family whose every step
/// has its own key (MoE: one per token) would otherwise grow without end in a run of
/// `--steps 0` (the soak found 60 KiB a token).
pub struct References<'a, C: Compute> {
    files: &'a BlockReader<'a>,
    outputs: HashMap<(u64, Option<usize>), Vec<f32>>,
    /// Keys in `outputs`, oldest first.
    kept: std::collections::VecDeque<(u64, Option<usize>)>,
    /// Blocks kept loaded between references of the same phase (MoE).
    source: Option<(Option<usize>, FromFiles<'a, C>)>,
}

impl<'a, C: Compute> References<'a, C> {
    pub fn new(files: &'a BlockReader<'a>) -> Self {
        Self {
            files,
            outputs: HashMap::new(),
            kept: std::collections::VecDeque::new(),
            source: None,
        }
    }

    /// Reference outputs kept now (at most [`REFERENCES_KEPT`]).
    pub fn len(&self) -> usize {
        self.outputs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// Computes the reference of step `step` now — before a session starts, so the
    /// reference pass does not compete with the run.
    pub fn prime(
        &mut self,
        compute: &C,
        workload: &'a Workload,
        step: u64,
    ) -> Result<(), WorkloadError> {
        with_family!(&workload.model, family => {
            self.expected(compute, family, workload, step).map(|_| ())
        })
    }

    fn expected<F: Family>(
        &mut self,
        compute: &C,
        family: &'a F,
        workload: &'a Workload,
        step: u64,
    ) -> Result<&Vec<f32>, WorkloadError> {
        let phase = workload.phase_at(step);
        let key = (family.reference_key(step), phase);
        if !self.outputs.contains_key(&key) {
            let reusable = matches!(&self.source, Some((kept, _)) if *kept == phase);
            if !reusable {
                let lora = phase.map(|phase| &workload.lora[phase].set);
                let source = FromFiles::new(
                    self.files,
                    family.layout(),
                    lora,
                    family.reference_keeps_blocks(),
                );
                self.source = Some((phase, source));
            }
            let Some((_, source)) = self.source.as_mut() else {
                unreachable!("the source was set just above");
            };
            let mut state = family.start(compute)?;
            let output = family.step(compute, &mut state, source, step)?.output;
            if self.kept.len() == REFERENCES_KEPT {
                if let Some(oldest) = self.kept.pop_front() {
                    self.outputs.remove(&oldest);
                }
            }
            self.outputs.insert(key, output.unwrap_or_default());
            self.kept.push_back(key);
        }
        Ok(&self.outputs[&key])
    }
}

/// [`drive`] on the CPU backend (`session` must run on a `CpuDevice`), with the
/// references read from `index`'s files.
pub fn drive_cpu(
    session: Session,
    workload: &Workload,
    index: &crate::model::ModelIndex,
    options: DriverOptions,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    let files = match BlockReader::open(index) {
        Ok(files) => files,
        Err(error) => {
            let stats = session.finish();
            return Err(Box::new((error.into(), stats)));
        }
    };
    let compute = crate::device::CpuCompute::new();
    let mut references = References::new(&files);
    drive(session, &compute, workload, &mut references, options)
}

/// Runs the steps. On any failure the session is still shut down — every budget is
/// released — before the error is returned.
pub fn drive<'a, C: Compute>(
    session: Session,
    compute: &C,
    workload: &'a Workload,
    references: &mut References<'a, C>,
    options: DriverOptions,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    drive_traced(session, compute, workload, references, options, None)
}

/// As [`drive`], recording each block's compute into `trace` (`--trace`).
pub fn drive_traced<'a, C: Compute>(
    mut session: Session,
    compute: &C,
    workload: &'a Workload,
    references: &mut References<'a, C>,
    mut options: DriverOptions,
    trace: Option<&crate::sim::TraceObserver>,
) -> Result<RunReport, Box<(WorkloadError, StatsSnapshot)>> {
    // A stop request also ends any wait inside a step (a miss, an attach).
    session.stop_on(Arc::clone(&options.stop));
    let mut report = RunReport::new(session.plan().clone());
    let outcome = with_family!(&workload.model, family => run_steps(
        family,
        &mut session,
        compute,
        workload,
        references,
        &mut options,
        trace,
        &mut report,
    ));
    if outcome.is_ok() {
        report.lora = session.lora_usage().unwrap_or_default();
    }
    let stats = session.finish();
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
    references: &mut References<'a, C>,
    options: &mut DriverOptions,
    trace: Option<&crate::sim::TraceObserver>,
    report: &mut RunReport,
) -> Result<(), WorkloadError> {
    let mut state = family.start(compute)?;
    let mut blocks = Streamed::new(session, compute, trace)?;
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
        blocks.begin_step();
        let started = Instant::now();
        let output = match family.step(compute, &mut state, &mut blocks, step) {
            Ok(output) => output,
            Err(error) => {
                // Holds taken before the failure go back before the session drains.
                let _ = blocks.drain(compute);
                // Stopped inside a step: the steps before it stand.
                if matches!(error, WorkloadError::Session(SessionError::Interrupted)) {
                    break;
                }
                return Err(error);
            }
        };
        blocks.drain(compute)?;
        let step_seconds = started.elapsed().as_secs_f64();
        let low_rank = blocks.low_rank_used;
        let compute_seconds = blocks.compute_seconds;
        blocks.session().step_done();
        check(
            compute, family, workload, references, step, &output, low_rank,
        )?;
        if report.step_seconds.len() == REPORT_STEP_HISTORY {
            // Bounded for runs that never end (`--steps 0`): the cold first step stays,
            // the oldest steady one goes.
            report.step_seconds.remove(1);
            report.compute_seconds.remove(1);
        }
        report.step_seconds.push(step_seconds);
        report.compute_seconds.push(compute_seconds);
        report.verified_steps += 1;
        report.tolerance_steps += u64::from(low_rank);
        report.expert_hits += output.expert_hits;
        report.expert_misses += output.expert_misses;
        report.expert_hints += output.expert_hints;
        if step == 0 {
            report.after_first_step = blocks.session().stats();
        }
        (options.on_step)(step, step_seconds);
        if options.keep_outputs {
            if let Some(values) = output.output {
                report.outputs.insert(family.reference_key(step), values);
            }
        }
        step += 1;
    }
    report.steps = step;
    Ok(())
}

/// Compares a step's output with the reference: bit for bit, or within the LoRA
/// tolerance when a block took the low-rank path.
#[allow(clippy::too_many_arguments)]
fn check<'a, C: Compute, F: Family>(
    compute: &C,
    family: &'a F,
    workload: &'a Workload,
    references: &mut References<'a, C>,
    step: u64,
    output: &StepOutput,
    low_rank: bool,
) -> Result<(), WorkloadError> {
    let Some(got) = &output.output else {
        return Ok(());
    };
    let expected = references.expected(compute, family, workload, step)?;
    let difference = if low_rank {
        first_difference_within(got, expected, LORA_TOLERANCE)
    } else {
        first_difference(got, expected)
    };
    match difference {
        None => Ok(()),
        Some((index, got, expected)) => Err(WorkloadError::Mismatch {
            step,
            index,
            got,
            expected,
        }),
    }
}
