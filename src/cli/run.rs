//! `stagehand run`: the main job. With no arguments it writes the demo model to the
//! cache directory if needed, streams it for several steps under a VRAM budget of 40 %
//! of its size and a pin ceiling of 50 %, checks every step's output equals the
//! fully-resident reference bit for bit, and prints the summary.

use std::path::PathBuf;
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use stagehand_actors::ResidencyPolicy;

use super::{CommandResult, Failure};
use crate::lora::LoraSpec;
use crate::model::demo::DemoSpec;
use crate::run::summary::Summary;
use crate::run::{
    default_cache_dir, ensure_demo_model, ensure_moe_model, no_observer, prepare_with,
    resolve_budgets, Extras, MoeOptions, RunError, RunPlan, WorkloadKind,
};
use crate::settings::{self, DeviceKind, SettingsArgs};
use crate::workload::moe::HintMode;
use crate::workload::moe_model::MoeSpec;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PolicyArg {
    /// Fixed max-scatter resident set + streaming ring (stagehand).
    Planned,
    /// Baseline: LRU over slots (what a generic cache does).
    Lru,
}

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
    #[arg(long, default_value_t = 6)]
    pub steps: u64,
    /// Rows per forward pass of the linear-stack workload (compute grows with it).
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    #[arg(long, value_enum, default_value = "planned")]
    pub policy: PolicyArg,
    /// Where the demo model is cached.
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Attach a LoRA adapter (PEFT or kohya safetensors) to the linear-stack model, with
    /// an optional strength (default 1). Repeatable; checked against the merged weights.
    #[arg(long, value_name = "FILE[:STRENGTH]", value_parser = parse_lora)]
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
    fn policy(self) -> stagehand_actors::ExpertPolicy {
        match self {
            ExpertPolicyArg::Lru => stagehand_actors::ExpertPolicy::Lru,
            ExpertPolicyArg::Lfu => stagehand_actors::ExpertPolicy::Lfu,
            ExpertPolicyArg::LfuAging => stagehand_actors::ExpertPolicy::default(),
        }
    }
}

fn parse_lora(text: &str) -> Result<LoraSpec, String> {
    LoraSpec::parse(text).map_err(|error| error.to_string())
}

pub fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A full or closed stderr drops log lines; reporting that would panic.
        .log_internal_errors(false)
        .with_target(false)
        .try_init();
}

fn run_error(error: RunError) -> Failure {
    match error {
        RunError::BadInput(message) => Failure::bad_input(anyhow::anyhow!(message)),
        RunError::Failed(message) => Failure::run_failed(anyhow::anyhow!(message)),
    }
}

/// Which backend runs: `cuda` as asked, `auto` → CUDA when a device is present (said
/// once at start), `sim` → pointed at `simulate`.
pub fn use_cuda(device: DeviceKind) -> Result<bool, Failure> {
    match device {
        DeviceKind::Sim => Err(Failure::bad_input(anyhow::anyhow!(
            "device `sim` runs in virtual time: use `stagehand simulate --model PATH --hardware NAME`"
        ))),
        DeviceKind::Cuda => Ok(true),
        DeviceKind::Auto => {
            let choice = crate::device::cuda::pick_auto();
            tracing::info!("{}", choice.message);
            Ok(choice.device == DeviceKind::Cuda)
        }
        DeviceKind::Cpu => Ok(false),
    }
}

pub fn execute(args: RunArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    init_logging(&settings.log);
    if let Some(path) = &settings.trace {
        crate::sim::TraceRecorder::check_writable(path).map_err(Failure::bad_input)?;
    }
    crate::run::memory::check_staging_ring(&settings).map_err(run_error)?;
    let use_cuda = use_cuda(settings.device)?;
    let (model, is_demo) = match &args.model {
        Some(path) => (path.clone(), false),
        None if args.workload == WorkloadKind::Moe => {
            let cache = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
            (
                ensure_moe_model(&cache, &MoeSpec::default()).map_err(run_error)?,
                true,
            )
        }
        None => {
            let cache = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
            (
                ensure_demo_model(&cache, &DemoSpec::default()).map_err(run_error)?,
                true,
            )
        }
    };
    let extras = Extras {
        loras: args.lora.clone(),
        moe: MoeOptions {
            policy: args.expert_policy.policy(),
            hint: args.moe_hint,
            slots: args.expert_slots,
        },
    };
    let prepared = prepare_with(
        &model,
        args.workload,
        args.batch,
        &settings,
        is_demo,
        &extras,
    )
    .map_err(run_error)?;
    let model_bytes = prepared.index.total_bytes();
    let budgets = resolve_budgets(&settings, model_bytes, prepared.is_demo);
    let observer = match settings.metrics_addr {
        Some(addr) => {
            let observer = crate::telemetry::install(addr).map_err(Failure::bad_input)?;
            tracing::info!("serving metrics on http://{addr}/metrics");
            Arc::new(observer) as Arc<dyn stagehand_actors::Observer>
        }
        None => no_observer(),
    };
    let progress = if args.quiet || args.json {
        ProgressBar::hidden()
    } else if args.steps == 0 {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::new(args.steps)
    };
    progress.set_style(
        ProgressStyle::with_template("{spinner} step {pos}/{len} [{bar:30}] {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let bar = progress.clone();
    let plan = RunPlan {
        settings: &settings,
        budgets,
        prefetch_depth: settings.prefetch_depth,
        policy: match args.policy {
            PolicyArg::Planned => ResidencyPolicy::Planned,
            PolicyArg::Lru => ResidencyPolicy::Lru,
        },
        steps: args.steps,
        stop: crate::signals::stop_flag(),
        observer,
        on_step: Box::new(move |_step, seconds| {
            bar.inc(1);
            bar.set_message(format!("{:.1} ms", seconds * 1e3));
        }),
        fail_after_reads: None,
    };
    tracing::info!(
        "streaming {} ({}; SIGINT or SIGTERM stops at the next step)",
        model.display(),
        match args.steps {
            0 => "until stopped".to_string(),
            steps => format!("{steps} steps"),
        }
    );
    let outcome = if use_cuda {
        crate::device::cuda::run::execute_cuda(&prepared, plan)
    } else {
        crate::run::execute(&prepared, plan)
    };
    progress.finish_and_clear();
    let outcome = outcome.map_err(run_error)?;
    let summary = Summary::new(&outcome);
    if args.json {
        let text = serde_json::to_string_pretty(&summary).map_err(Failure::run_failed)?;
        println!("{text}");
    } else {
        print!("{}", summary.render());
    }
    Ok(())
}
