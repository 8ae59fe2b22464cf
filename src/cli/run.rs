//! `stagehand run`: the main job. With no arguments it writes the demo model to the
//! cache directory if needed, streams it for several steps under a VRAM budget of 40 %
//! of its size and a pin ceiling of 50 %, checks every step's output equals the
//! fully-resident reference bit for bit, and prints the summary. The summary is what
//! `run` is for, so it is its result and goes to stdout (as text, or `--json`); the
//! commands that compute something for the user (`embed`, `generate`, `sample`) print
//! that on stdout and their summary on stderr.

use std::path::PathBuf;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use stagehand_actors::ResidencyPolicy;

pub use super::logging::init_logging;
use super::{CommandResult, Failure};
use stagehand::families::bert::EmbeddingPlacement;
use stagehand::families::moe::HintMode;
use stagehand::lora::LoraSpec;
use stagehand::run::summary::Summary;
use stagehand::run::{
    default_cache_dir, no_observer, prepare_with, Extras, MoeOptions, RunError, RunPlan,
    WorkloadKind,
};
use stagehand::settings::{self, DeviceKind, SettingsArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// Fixed max-scatter resident set + streaming ring (stagehand).
    Planned,
    /// Baseline: LRU over slots (what a generic cache does).
    Lru,
}

impl PolicyArg {
    pub(super) fn residency(self) -> ResidencyPolicy {
        match self {
            PolicyArg::Planned => ResidencyPolicy::Planned,
            PolicyArg::Lru => ResidencyPolicy::Lru,
        }
    }
}

/// `run`'s steps and batch when not given (what `config --model` describes).
pub(super) const DEFAULT_STEPS: u64 = 6;
pub(super) const DEFAULT_BATCH: usize = 64;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Model to run: a linear-stack model from `demo-model`, or any safetensors
    /// checkpoint (file, shard folder or index.json) with stream-verify. Default: the
    /// demo model in the cache directory, created if missing.
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "auto")]
    pub workload: WorkloadKind,
    /// Steps to run; 0 runs until Ctrl-C.
    #[arg(long, default_value_t = DEFAULT_STEPS)]
    pub steps: u64,
    /// Rows per forward pass of the linear-stack workload (compute grows with it).
    #[arg(long, default_value_t = DEFAULT_BATCH)]
    pub batch: usize,
    #[arg(long, value_enum, default_value = "planned")]
    pub policy: PolicyArg,
    /// Where the demo model is cached.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Attach a LoRA adapter (PEFT or kohya safetensors) to the linear-stack model, with
    /// an optional strength (default 1). Repeatable; checked against the merged weights.
    #[arg(long, value_name = "FILE[:STRENGTH]", value_parser = parse_lora_arg)]
    pub lora: Vec<LoraSpec>,
    /// MoE: which experts the expert cache keeps.
    #[arg(long, value_enum, default_value = "lfu-aging")]
    pub expert_policy: ExpertPolicyArg,
    /// MoE: speculative expert prefetch from the next layer's routing.
    #[arg(long, value_enum, default_value = "next-layer")]
    pub moe_hint: HintMode,
    /// MoE: expert cache slots (default: what the VRAM budget leaves after the dense blocks).
    #[arg(long)]
    pub expert_slots: Option<u32>,
    /// Encoders: where the word-embedding table lives (auto: host memory when a
    /// batch's rows are fewer bytes than the table, so only those rows go to the device).
    #[arg(long, value_enum, default_value = "auto")]
    pub embeddings: EmbeddingPlacement,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExpertPolicyArg {
    Lru,
    Lfu,
    /// LFU whose counts halve every 128 expert uses (the default; BENCHMARKS.md).
    LfuAging,
}

impl ExpertPolicyArg {
    pub(super) fn policy(self) -> stagehand_actors::ExpertPolicy {
        match self {
            ExpertPolicyArg::Lru => stagehand_actors::ExpertPolicy::Lru,
            ExpertPolicyArg::Lfu => stagehand_actors::ExpertPolicy::Lfu,
            ExpertPolicyArg::LfuAging => stagehand_actors::ExpertPolicy::default(),
        }
    }
}

pub(super) fn parse_lora_arg(text: &str) -> Result<LoraSpec, String> {
    LoraSpec::parse(text).map_err(|error| error.to_string())
}

pub(super) fn run_error(error: RunError) -> Failure {
    Failure::from_run(error)
}

/// Which backend runs: `cuda` as asked, `auto` → CUDA when a device is present (said
/// once at start), `sim` → pointed at `simulate`.
pub fn use_cuda(device: DeviceKind) -> Result<bool, Failure> {
    match device {
        DeviceKind::Sim => Err(Failure::bad_input(anyhow::anyhow!(
            "device `sim` runs in virtual time: use `stagehand simulate --model PATH --hardware NAME`"
        ))),
        // Refused here, before a command prints anything, when there is no GPU.
        #[cfg(feature = "cuda")]
        DeviceKind::Cuda => match stagehand::device::cuda::device_count() {
            Ok(0) => Err(Failure::bad_input(anyhow::anyhow!(
                "--device cuda: no CUDA device found; run with --device cpu (or auto)"
            ))),
            Ok(_) => Ok(true),
            Err(error) => Err(Failure::bad_input(anyhow::anyhow!("--device cuda: {error}"))),
        },
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Cuda => Ok(true),
        #[cfg(feature = "cuda")]
        DeviceKind::Auto => {
            let choice = stagehand::device::cuda::pick_auto();
            tracing::info!("{}", choice.message);
            Ok(choice.device == DeviceKind::Cuda)
        }
        #[cfg(not(feature = "cuda"))]
        DeviceKind::Auto => {
            tracing::info!("device auto: this build has no CUDA support; using the CPU backend");
            Ok(false)
        }
        DeviceKind::Cpu => Ok(false),
    }
}

/// How `run_prepared` runs a prepared model.
pub(super) struct Launch {
    pub steps: u64,
    pub policy: PolicyArg,
    /// No progress bar.
    pub quiet: bool,
    pub keep_outputs: bool,
    pub use_cuda: bool,
    /// Called with each token a decoder picks (`generate` prints them).
    pub on_token: Option<Box<dyn FnMut(u32) + Send>>,
    /// The command's own `verify` when the settings name none.
    pub verify: settings::Verify,
}

/// Budgets, metrics, progress and the backend for a prepared model; runs it.
pub(super) fn run_prepared(
    prepared: &stagehand::run::Prepared,
    settings: &settings::Settings,
    launch: Launch,
) -> Result<stagehand::run::Outcome, Failure> {
    let ask = stagehand::run::BudgetAsk {
        policy: launch.policy.residency(),
        ..stagehand::run::BudgetAsk::steps(launch.steps)
    };
    let budgets = stagehand::run::budgets_for(prepared, settings, ask);
    let depth = stagehand::run::fitting_depth(prepared, settings, budgets, ask);
    let settings = &settings::Settings {
        prefetch_depth: depth,
        verify: settings.verify.or(Some(launch.verify)),
        ..settings.clone()
    };
    let observer = match settings.metrics_addr {
        Some(addr) => {
            let observer = stagehand::telemetry::install(addr).map_err(Failure::bad_input)?;
            tracing::info!("serving metrics on http://{addr}/metrics");
            Arc::new(observer) as Arc<dyn stagehand_actors::Observer>
        }
        None => no_observer(),
    };
    let progress = if launch.quiet {
        ProgressBar::hidden()
    } else if launch.steps == 0 {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::new(launch.steps)
    };
    progress.set_style(
        ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let bar = progress.clone();
    let plan = RunPlan {
        settings,
        budgets,
        prefetch_depth: settings.prefetch_depth,
        policy: launch.policy.residency(),
        steps: launch.steps,
        stop: stagehand::signals::stop_flag(),
        observer,
        on_step: Box::new(move |step, seconds| {
            if step == 0 {
                tracing::info!(
                    "step 1 ran in {:.1} ms (cold); SIGINT or SIGTERM stops at the next step",
                    seconds * 1e3
                );
            }
            bar.inc(1);
            bar.set_message(format!("{:.1} ms", seconds * 1e3));
        }),
        fail_after_reads: None,
        keep_outputs: launch.keep_outputs,
        on_token: launch.on_token,
        measure_links: false,
        shared: None,
    };
    let outcome = if launch.use_cuda {
        stagehand::run::execute_cuda(prepared, plan)
    } else {
        stagehand::run::execute(prepared, plan)
    };
    progress.finish_and_clear();
    outcome.map_err(run_error)
}

/// The generated demo model the run's workload takes without `--model`, written into
/// the cache once.
fn demo_model(args: &RunArgs) -> Result<PathBuf, Failure> {
    let cache = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
    let write = stagehand::families::demo_writer(args.workload)
        .ok_or_else(|| Failure::run_failed(anyhow::anyhow!("no family writes a demo model")))?;
    write(&cache).map_err(|error| run_error(stagehand::run::cache_error(error)))
}

pub fn execute(args: RunArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    init_logging(&settings.log);
    super::logging::log_setting_notes(&loaded.provenance);
    if let Some(path) = &settings.trace {
        stagehand::telemetry::TraceRecorder::check_writable(path).map_err(Failure::bad_input)?;
    }
    stagehand::run::memory::check_staging_ring(&settings).map_err(run_error)?;
    let use_cuda = use_cuda(settings.device)?;
    let preparing = (args.model.is_none()).then(|| {
        super::progress::Status::start("preparing the demo model (written once, then cached)")
    });
    let (model, is_demo) = match &args.model {
        Some(path) => (path.clone(), false),
        None => (demo_model(&args)?, true),
    };
    drop(preparing);
    let extras = Extras {
        loras: args.lora.clone(),
        moe: MoeOptions {
            policy: args.expert_policy.policy(),
            hint: args.moe_hint,
            slots: args.expert_slots,
        },
        ..Extras::default()
    }
    .with(args.embeddings);
    let prepared = prepare_with(
        &model,
        args.workload,
        args.batch,
        &settings,
        is_demo,
        &extras,
    )
    .map_err(run_error)?;
    let outcome = run_prepared(
        &prepared,
        &settings,
        Launch {
            steps: args.steps,
            policy: args.policy,
            quiet: args.quiet || args.json,
            keep_outputs: false,
            use_cuda,
            on_token: None,
            verify: settings::Verify::Full,
        },
    )?;
    let summary = Summary::new(&outcome);
    if args.json {
        let text = serde_json::to_string_pretty(&summary).map_err(Failure::run_failed)?;
        println!("{text}");
    } else {
        print!("{}", summary.render("run"));
    }
    Ok(())
}
