//! A model kept loaded between requests (what `stagehand serve` runs, one per model):
//! opened once by [`super::prepare_with`], budgeted by the one budget policy
//! ([`super::budgets_for`]), its session started once on the CPU backend, then each
//! job — texts to embed, a prompt to continue — runs the family's own step over the
//! same streamed blocks. Blocks are checked against the file as they land (the
//! cheap check `embed` and `generate` default to); the budgets are released when the
//! job channel closes, and the final counters are returned to show it.
//!
//! Encoders gather the texts of queued jobs into one step, up to a token budget;
//! decoders run up to [`BatchLimits::max_sequences`] sequences together, each with its
//! own KV pages, joining and leaving between steps, in one batched step ([`crate::families::llama::Decoder::step_batch`]).
//!
//! A job may name one of the model's adapters ([`super::Prepared::add_adapter`]):
//! jobs of one adapter share a step, and the session switches its attached LoRA set
//! between steps of different adapters (the LoRA offloader detaches one set and
//! attaches the next; resident blocks that had the last one baked in are reloaded).
//! The base weights are never reloaded for a switch.

mod decode;
mod embed;
mod jobs;
mod shared;

use std::sync::Arc;

use stagehand_actors::{Observer, Session, StatsSnapshot};

use crate::device::{CpuCompute, CpuDevice};
use crate::families::blocks::Streamed;
use crate::families::landing::LandingCheck;
use crate::families::lora_set::LoraSet;
use crate::families::{Endpoints, FamilyError, Model, WorkloadKind};
use crate::model::{BlockReader, KnownChecksums};
use crate::settings::Settings;

use super::{
    budgets_for, execute::session_configs, fitting_depth, open_model_storage, BudgetAsk, Budgets,
    NamedLora, Prepared, RunError, RunPlan,
};

pub use shared::{open_shared_budget, pool_ask, shared_budgets, SharedMember};
pub(crate) use shared::{pool_error, LeaveOnDrop};

pub use jobs::{
    BatchLimits, Cancel, CancelOnDrop, EmbedJob, Embedded, FinishReason, Finished, GenerateJob,
    Job, TokenEvent,
};

/// What a loaded model tells its owner once its session runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedInfo {
    pub kind: WorkloadKind,
    /// What the server answers with it (its family's declaration).
    pub endpoints: Endpoints,
    pub budgets: Budgets,
    /// Bytes the session streams (the layout's).
    pub model_bytes: u64,
}

/// How a batch went, told after each step (for the server's metrics).
pub trait BatchObserver: Send {
    /// A step computed `sequences` sequences (or texts) at once.
    fn batch(&mut self, sequences: usize);
    /// The session attached another adapter's LoRA set for the next step.
    fn adapter_switch(&mut self) {}
}

/// Observes nothing.
pub struct NoBatchObserver;

impl BatchObserver for NoBatchObserver {
    fn batch(&mut self, _sequences: usize) {}
}

/// What a job loop works with: the compute, the session's blocks, the job queue.
pub(super) struct Context<'c, 's> {
    pub compute: &'c CpuCompute,
    pub blocks: &'c mut Streamed<'s, CpuCompute>,
    pub jobs: &'c flume::Receiver<Job>,
    pub limits: BatchLimits,
    pub batches: Box<dyn BatchObserver>,
    /// The model's place in a shared budget, if it has one.
    pub member: Option<&'c SharedMember>,
    pub loras: Loras<'s>,
}

/// The LoRA sets a loaded model switches between per job: its own (`None`, the
/// model's `--lora`, or no LoRA) and its named adapters.
pub(super) struct Loras<'s> {
    pub own: Option<&'s LoraSet>,
    pub adapters: &'s [NamedLora],
    /// Which is attached now: `Some(None)` the model's own, `Some(Some(i))` adapter
    /// `i`, `None` not known (a switch failed halfway: the next one attaches anew).
    pub attached: Option<Option<usize>>,
}

impl Loras<'_> {
    /// The adapter `name` names, or why a job cannot have it.
    fn find(&self, name: Option<&str>) -> Result<Option<usize>, String> {
        let Some(name) = name else {
            return Ok(None);
        };
        match self
            .adapters
            .iter()
            .position(|adapter| adapter.name == name)
        {
            Some(index) => Ok(Some(index)),
            None if self.adapters.is_empty() => {
                Err(format!("the model has no adapters; `{name}` is not one"))
            }
            None => {
                let names: Vec<&str> = self.adapters.iter().map(|a| a.name.as_str()).collect();
                Err(format!(
                    "the model has no adapter `{name}` (its adapters: {})",
                    names.join(", ")
                ))
            }
        }
    }
}

impl Context<'_, '_> {
    /// The next job, waiting for one if none is queued. In a shared budget the model
    /// says it is idle while it waits, and asks for room before the job runs.
    fn next_job(&mut self) -> Result<Job, flume::RecvError> {
        let job = match self.jobs.try_recv() {
            Ok(job) => job,
            Err(_) => {
                if let Some(member) = self.member {
                    member.end_use();
                }
                self.jobs.recv()?
            }
        };
        if let Some(member) = self.member {
            member.begin_use();
        }
        Ok(job)
    }

    /// Attaches `adapter`'s set (`None`: the model's own) unless it is attached.
    fn use_adapter(&mut self, adapter: Option<usize>) -> Result<(), FamilyError> {
        if self.loras.attached == Some(adapter) {
            return Ok(());
        }
        let set = match adapter {
            Some(index) => Some(&self.loras.adapters[index].set),
            None => self.loras.own,
        };
        self.loras.attached = None;
        self.blocks.switch_lora(self.compute, set, 0)?;
        self.loras.attached = Some(adapter);
        self.batches.adapter_switch();
        Ok(())
    }

    /// Ends a step: holds given back, the session told.
    fn end_step(&mut self) -> Result<(), FamilyError> {
        self.blocks.drain(self.compute)?;
        self.blocks.session().step_done();
        Ok(())
    }
}

/// A failure that ends the loaded model (its session stopped, its files changed),
/// rather than one request.
fn is_fatal(error: &FamilyError) -> bool {
    match error {
        // A stop request seen by a read (before a draining server lowered the flag)
        // ends that request, not the model.
        FamilyError::Session(stagehand_actors::SessionError::Interrupted) => false,
        // Room that was not there for this step (its activations, an adapter's
        // regions or pinned set): the step gave back what it held, the next may fit.
        FamilyError::Session(
            stagehand_actors::SessionError::Activations(_)
            | stagehand_actors::SessionError::LoraPinCeiling { .. }
            | stagehand_actors::SessionError::TooManyAdapters { .. },
        ) => false,
        FamilyError::Session(_)
        | FamilyError::Io { .. }
        | FamilyError::Changed { .. }
        | FamilyError::Corrupt { .. } => true,
        _ => false,
    }
}

/// What [`serve_jobs`] runs with beside the model.
pub struct LoadedOptions<'a> {
    pub settings: &'a Settings,
    pub limits: BatchLimits,
    /// The session's observer (transfers, tiers: the existing catalog).
    pub observer: Arc<dyn Observer>,
    pub batches: Box<dyn BatchObserver>,
    /// Share one budget with other models (its lease replaces the budget policy's).
    pub shared: Option<SharedMember>,
}

/// The budgets a loaded model runs under: the one policy, asked for the longest
/// sequence the limits allow, times the sequences decoded together.
pub fn loaded_budgets(prepared: &Prepared, settings: &Settings, limits: BatchLimits) -> Budgets {
    budgets_for(
        prepared,
        settings,
        BudgetAsk::steps(ask_steps(prepared, limits)),
    )
}

/// Steps the budget policy is asked for: a decoder's KV cache for every sequence of a
/// full batch at the longest length, each in whole pages (as one sequence of that
/// many tokens).
fn ask_steps(prepared: &Prepared, limits: BatchLimits) -> u64 {
    let Some(kv) = prepared.facts().kv_cache() else {
        return 1;
    };
    let page = kv.page_tokens.max(1);
    let per_sequence = limits.max_sequence_tokens.div_ceil(page) * page;
    per_sequence * limits.max_sequences.max(1) as u64
}

/// Runs `prepared` kept loaded: starts its session, runs one warm-up step, calls
/// `ready` (with an error instead when it cannot start), then answers jobs until
/// `jobs` closes. Returns the
/// session's final counters: every budget released.
pub fn serve_jobs(
    mut prepared: Prepared,
    options: LoadedOptions<'_>,
    jobs: flume::Receiver<Job>,
    ready: impl FnOnce(Result<LoadedInfo, RunError>),
) -> Result<StatsSnapshot, RunError> {
    let mut ready = Some(ready);
    // Declared before the session, so dropped after it: whatever way this returns,
    // the lease is given back only once the session has released every byte.
    let _leave = LeaveOnDrop(options.shared.clone());
    let started = start_session(&prepared, &options);
    let (mut session, info, compute) = match started {
        Ok(started) => started,
        Err(error) => {
            // The loader reads the ready reply; the thread's own result is the same
            // kind, for whoever joins it.
            if let Some(ready) = ready.take() {
                ready(Err(error.detached()));
            }
            return Err(error);
        }
    };
    let files = BlockReader::open(&prepared.index).map_err(|error| RunError::Io {
        path: error.path.clone(),
        message: format!("cannot read the model's files: {error}"),
        source: Some(Box::new(error)),
    })?;
    let layout = prepared.facts().layout().clone();
    let verify = (options.settings.verify).unwrap_or(crate::settings::Verify::First);
    let outcome = (|| {
        let mut blocks = Streamed::new(&mut session, &compute, None)?;
        if verify != crate::settings::Verify::Off {
            let known = KnownChecksums::open(&crate::run::default_cache_dir(), &prepared.index);
            blocks.landing = Some(LandingCheck::new(&files, &layout).with_known(known));
        }
        let own = prepared.workload.lora.first().map(|phase| &phase.set);
        blocks.switch_lora(&compute, own, 0)?;
        let mut context = Context {
            compute: &compute,
            blocks: &mut blocks,
            jobs: &jobs,
            limits: options.limits,
            batches: options.batches,
            member: options.shared.as_ref(),
            loras: Loras {
                own,
                adapters: &prepared.adapters,
                attached: Some(None),
            },
        };
        let folder = prepared.folder.clone();
        match &mut prepared.workload.model {
            Model::Llama(decoder) => {
                decode::warm_up(decoder, &mut context)?;
                if let Some(ready) = ready.take() {
                    ready(Ok(info));
                }
                decode::run(decoder, &mut context)
            }
            Model::Bert(encoder) => {
                embed::warm_up(encoder, &mut context)?;
                if let Some(ready) = ready.take() {
                    ready(Ok(info));
                }
                embed::run(encoder, folder.as_ref(), &mut context)
            }
            other => Err(FamilyError::unsupported(
                &prepared.index.path,
                other.family_name(),
                format!(
                    "the {} family is not served (serve takes encoders and decoders)",
                    other.family_name()
                ),
            )),
        }
    })();
    // The family's words, before the run's error adds whether the budgets came back.
    let words = outcome.as_ref().err().map(ToString::to_string);
    let stats = session.finish();
    let outcome = outcome.map_err(|error| super::failed_run(error, &stats));
    tell_stopped(ready, jobs, &outcome, words);
    outcome?;
    Ok(stats)
}

/// The model stopped (`outcome`, the family's `words` when it failed): a loader
/// still waiting for `ready` is told why, in the failure's kind; every job still
/// queued is cancelled, saying why (not left to its timeout: the queue's senders
/// outlive this thread, and so would the jobs in it). A queued job is not given the
/// model's kind: a budget refusal that stopped the model is no fault of its request.
fn tell_stopped(
    ready: Option<impl FnOnce(Result<LoadedInfo, RunError>)>,
    jobs: flume::Receiver<Job>,
    outcome: &Result<(), RunError>,
    words: Option<String>,
) {
    if let Some(ready) = ready {
        ready(Err(match (outcome, &words) {
            (Err(error), Some(words)) => error.detached().with_message(words.clone()),
            // Each job loop calls `ready` once its warm-up stepped; it cannot end
            // well before that.
            _ => RunError::internal("the model stopped before it was ready"),
        }));
    }
    let reason = match &words {
        Some(words) => format!("the model stopped: {words}"),
        None => "the model stopped".to_string(),
    };
    for job in jobs.drain() {
        let message = reason.clone();
        refuse(job, RunError::Cancelled { message });
    }
}

/// Answers `job` with `reason` instead of computing it.
fn refuse(job: Job, reason: RunError) {
    match job {
        Job::Embed(job) => {
            let _ = job.reply.send(Err(reason));
        }
        Job::Generate(job) => {
            let _ = job.events.send(TokenEvent::Failed(reason.to_string()));
        }
    }
}

/// The session of a loaded model on the CPU backend, under the one budget policy.
fn start_session(
    prepared: &Prepared,
    options: &LoadedOptions<'_>,
) -> Result<(Session, LoadedInfo, CpuCompute), RunError> {
    if options.settings.device == crate::settings::DeviceKind::Cuda {
        return Err(RunError::setting(
            "device",
            "serve runs on the CPU backend for now; set device = \"cpu\" (or auto)",
        ));
    }
    let settings = options.settings;
    let ask = BudgetAsk::steps(ask_steps(prepared, options.limits));
    let (budgets, depth) = match &options.shared {
        Some(member) => shared_budgets(prepared, settings, ask, member)?,
        None => {
            let budgets = loaded_budgets(prepared, settings, options.limits);
            (budgets, fitting_depth(prepared, settings, budgets, ask))
        }
    };
    let layout = prepared.workload.layout().clone();
    let arena = options
        .shared
        .as_ref()
        .map(|member| member.capacity_bytes());
    let capacity = arena
        .unwrap_or(budgets.vram_budget_bytes)
        .max(layout.largest_block_bytes());
    let device = CpuDevice::new(capacity).map_err(|error| RunError::Device {
        message: error.to_string(),
        source: Some(Box::new(error)),
    })?;
    let streaming = super::execute::streaming(prepared, budgets.vram_budget_bytes);
    let compute = CpuCompute::with_threads(settings.compute_threads_for(streaming))
        .with_compute_dtype(settings.compute_dtype);
    let mut plan = RunPlan::new(settings, budgets, ask.steps);
    plan.prefetch_depth = depth;
    let (config, experts) = session_configs(prepared, &plan)?;
    let storage = open_model_storage(&prepared.index, settings, None)?;
    let order = prepared.workload.order();
    let device: Arc<dyn stagehand_actors::Device> = Arc::new(device);
    let observer = Arc::clone(&options.observer);
    let started = match arena {
        Some(arena) => Session::start_shared(
            config,
            experts,
            arena,
            layout.clone(),
            order,
            device,
            storage,
            observer,
        ),
        None => Session::start_with_experts(
            config,
            experts,
            layout.clone(),
            order,
            device,
            storage,
            observer,
        ),
    };
    let session = match (started, &options.shared) {
        (Ok(session), Some(member)) => {
            let attached = member.pool.attach(&member.name, session.budget_handle());
            attached.map_err(pool_error)?;
            session
        }
        (Ok(session), None) => session,
        (Err(error), shared) => {
            if let Some(member) = shared {
                let _ = member.pool.leave(&member.name);
            }
            return Err(RunError::from_session(error, budgets.vram_budget_bytes));
        }
    };
    let info = LoadedInfo {
        kind: prepared.facts().kind(),
        endpoints: prepared.family.endpoints,
        budgets,
        model_bytes: layout.total_bytes(),
    };
    Ok((session, info, compute))
}
