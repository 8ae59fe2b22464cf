//! `stagehand simulate --model M --hardware H`: will the model run on that box, and
//! how fast? Runs stagehand and two baselines through the real actors on simulated
//! hardware in virtual time (see docs/simulator.md; `--json` is documented there).
//!
//! Unless a layer the user wrote sets `prefetch_depth` (a `--config` file, the
//! environment, the flag), the simulator chooses it (`--prefetch-depth auto`) and says
//! which depth to put in the config.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use bytesize::ByteSize;

use super::{CommandResult, Failure};
use stagehand::settings::{self, LoadOptions, Settings, SettingsArgs, Source};
use stagehand::sim::{FaultPlan, HardwareProfile};
use stagehand::simulate::{
    simulate, FitSettings, SimRunError, SimulateOptions, Simulation, AUTO_DEPTH_MAX,
};
use stagehand::telemetry::TraceRecorder;

mod mix;
mod model_arg;
mod pipeline;
mod text;

use model_arg::{load_model, load_model_named};
use text::write_text;

/// The value of `--prefetch-depth` (or `STAGEHAND_PREFETCH_DEPTH`) that asks the
/// simulator to choose the depth.
const AUTO: &str = "auto";
const DEPTH_ENV: &str = "STAGEHAND_PREFETCH_DEPTH";

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// A shipped model (flux1-dev, llama3-8b, ...), a description TOML, or a checkpoint.
    #[arg(long, value_name = "MODEL")]
    pub model: String,
    /// A shipped hardware profile (rtx3060-12gb, rtx4090, ...), a profile TOML, or
    /// `local`: this machine, calibrated now or from a recent cached calibration.
    #[arg(long, value_name = "PROFILE")]
    pub hardware: String,
    /// Host RAM instead of the profile's, e.g. 32GiB.
    #[arg(long, value_name = "SIZE")]
    pub ram: Option<String>,
    /// A shipped disk instead of the profile's: hdd, sata, nvme3, nvme4, nvme5.
    #[arg(long, value_name = "DISK")]
    pub disk: Option<String>,
    /// Steps to simulate (the first is the cold one).
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub steps: u64,
    /// Seed of the jitter and fault injection.
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
    /// Each read and copy takes its time × uniform [1 − J, 1 + J] (0 = exact).
    #[arg(long, default_value_t = 0.0, value_name = "J")]
    pub jitter: f64,
    /// Tokens per step, for a checkpoint (a description TOML says its own).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub tokens_per_step: u64,
    /// A Flux pipeline's parts as files (`--model` the transformer's file).
    #[command(flatten)]
    pub parts: super::image::PartArgs,
    /// For a pipeline folder (`--model` a diffusers Flux pipeline): the image's
    /// denoising steps.
    #[arg(long, default_value_t = 28, value_name = "N")]
    pub image_steps: u64,
    /// Skip the naive and LRU baselines.
    #[arg(long)]
    pub no_baselines: bool,
    /// Print the result as JSON (schema in docs/simulator.md).
    #[arg(long)]
    pub json: bool,
    /// A second model used in turn with --model under one shared budget (what
    /// `serve`'s `[budget]` does): --vram-budget and --pin-ceiling are then the
    /// shared ones (default: the profile's VRAM less reserve_vram and vram_headroom, and
    /// the RAM it can pin).
    #[arg(long, value_name = "MODEL")]
    pub with: Option<String>,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

pub fn execute(args: SimulateArgs) -> CommandResult {
    check_steps(args.steps)?;
    let DepthSettings {
        settings,
        depth_source,
        auto_prefetch_depth,
    } = load_settings(&args)?;
    let hardware = load_hardware(&args, &settings)?;
    if pipeline::is_pipeline(&args) {
        let options = SimulateOptions {
            steps: args.steps,
            settings: FitSettings::from_settings(&settings),
            faults: FaultPlan::default(),
            trace: None,
            max_reads_in_flight: settings.reader_threads as usize,
            baselines: false,
            auto_prefetch_depth,
        };
        return pipeline::execute(
            &args,
            &hardware,
            &options,
            settings.block_pattern.as_deref(),
        );
    }
    let model = load_model(&args, settings.block_pattern.as_deref())?;
    if let Some(with) = &args.with {
        let other = load_model_named(with, &args, settings.block_pattern.as_deref())?;
        return mix::execute(&args, [&model, &other], &hardware, &settings);
    }
    let faults = FaultPlan {
        seed: args.seed,
        jitter: args.jitter,
        ..FaultPlan::default()
    };
    faults.validate().map_err(Failure::bad_input)?;
    if let Some(path) = &settings.trace {
        TraceRecorder::check_writable(path).map_err(Failure::bad_input)?;
    }
    let trace = settings
        .trace
        .as_ref()
        .map(|_| Arc::new(TraceRecorder::new()));
    let options = SimulateOptions {
        steps: args.steps,
        settings: FitSettings::from_settings(&settings),
        faults,
        trace: trace.clone(),
        max_reads_in_flight: settings.reader_threads as usize,
        baselines: !args.no_baselines,
        auto_prefetch_depth,
    };
    let status = super::progress::Status::start(format!(
        "simulating {} on {}{}",
        model.name,
        hardware.name,
        if auto_prefetch_depth {
            format!(" (choosing prefetch_depth among 0..={AUTO_DEPTH_MAX}, then 3 policies)")
        } else {
            String::new()
        }
    ));
    let simulation = simulate(&model, &hardware, &options);
    drop(status);
    let simulation = simulation.map_err(|error| match error {
        SimRunError::Setup(_) | SimRunError::Plan { .. } => Failure::bad_input(error),
        SimRunError::Failed { .. } | SimRunError::Stalled { .. } => Failure::run_failed(error),
    })?;
    if let (Some(path), Some(trace)) = (&settings.trace, &trace) {
        write_trace(path, trace)?;
    }
    write_report(&args, &simulation, &depth_source, settings.trace.as_deref())?;
    if !simulation.fits {
        // After the report (stdout), one line on stderr and exit 3 for scripts.
        return Err(Failure::DoesNotFit(anyhow::anyhow!(
            "{} on {}: {}",
            simulation.model,
            simulation.hardware,
            simulation.failure_messages.join("; ")
        )));
    }
    Ok(())
}

fn check_steps(steps: u64) -> Result<(), Failure> {
    if steps == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps 0: simulate at least 1 step"
        )));
    }
    if steps > stagehand::simulate::MAX_STEPS {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps {}: at most {} steps (a steady state shows after a few; each step is \
             kept for the report)",
            steps,
            stagehand::simulate::MAX_STEPS
        )));
    }
    Ok(())
}

/// The settings, and whether the simulator chooses the prefetch depth.
struct DepthSettings {
    settings: Settings,
    /// The layer that set `prefetch_depth` (the report says where to change it).
    depth_source: Source,
    auto_prefetch_depth: bool,
}

fn load_settings(args: &SimulateArgs) -> Result<DepthSettings, Failure> {
    // `auto` is the simulator's own value, not a setting: take it out before the
    // settings are parsed, then decide from the layer that set the depth.
    let mut settings_args = args.settings.clone();
    let mut asked_auto = false;
    if settings_args
        .prefetch_depth
        .as_deref()
        .is_some_and(|value| value.eq_ignore_ascii_case(AUTO))
    {
        settings_args.prefetch_depth = None;
        asked_auto = true;
    }
    let mut load_options = LoadOptions::from_process();
    let env_auto = load_options.env.iter().find_map(|(name, value)| {
        (name.eq_ignore_ascii_case(DEPTH_ENV) && value.trim().eq_ignore_ascii_case(AUTO))
            .then(|| name.clone())
    });
    if let Some(name) = env_auto {
        load_options.env.remove(&name);
        asked_auto |= settings_args.prefetch_depth.is_none();
    }
    let loaded = settings::load_with(&settings_args, &load_options).map_err(Failure::bad_input)?;
    let depth_source = loaded
        .provenance
        .get("prefetch_depth")
        .map_or(Source::Default, |origin| origin.source.clone());
    // The shipped defaults (built in, or config/default.toml) are not a choice the
    // user made for this machine.
    let auto_prefetch_depth =
        asked_auto || matches!(depth_source, Source::Default | Source::DefaultFile(_));
    Ok(DepthSettings {
        settings: loaded.settings,
        depth_source,
        auto_prefetch_depth,
    })
}

/// The profile `--hardware` names, with `--ram` and `--disk` put in.
fn load_hardware(args: &SimulateArgs, settings: &Settings) -> Result<HardwareProfile, Failure> {
    let mut hardware =
        super::hardware_arg::for_model(&args.hardware, &args.model, settings.fast_disk)?;
    if let Some(ram) = &args.ram {
        let ram: ByteSize = ram.parse().map_err(|error| {
            Failure::bad_input(anyhow::anyhow!(
                "--ram {ram}: {error}; give a size like 32GiB"
            ))
        })?;
        hardware = hardware.with_ram(ram);
    }
    if let Some(disk) = &args.disk {
        hardware = hardware.with_disk(disk).map_err(Failure::bad_input)?;
    }
    Ok(hardware)
}

fn write_trace(path: &Path, trace: &TraceRecorder) -> Result<(), Failure> {
    trace
        .write_chrome_trace(path)
        .map_err(Failure::run_failed)?;
    eprintln!(
        "wrote the Chrome trace of the stagehand run to {} (open it in https://ui.perfetto.dev)",
        path.display()
    );
    Ok(())
}

/// The report on stdout, as JSON or text; a closed pipe (`| head`) is not an error.
fn write_report(
    args: &SimulateArgs,
    simulation: &Simulation,
    depth_source: &Source,
    trace: Option<&Path>,
) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, simulation)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_text(&mut out, simulation, depth_source, trace)
    };
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.map_err(Failure::run_failed)?,
    }
    Ok(())
}
