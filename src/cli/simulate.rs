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
use stagehand_actors::Bytes;

use super::{CommandResult, Failure};
use crate::model::ModelIndex;
use crate::settings::{self, LoadOptions, SettingsArgs, Source};
use crate::sim::{
    simulate, FaultPlan, FitSettings, ModelDescription, PolicyFigures, SimRunError,
    SimulateOptions, Simulation, TraceRecorder, AUTO_DEPTH_MAX, SEARCH_STEPS, TIE_RELATIVE,
};

/// The value of `--prefetch-depth` (or `STAGEHAND_PREFETCH_DEPTH`) that asks the
/// simulator to choose the depth.
const AUTO: &str = "auto";
const DEPTH_ENV: &str = "STAGEHAND_PREFETCH_DEPTH";
/// Most tokens one described encoder step may have (a bound on the ids made up to
/// describe it; far above any real batch).
const MAX_ENCODER_TOKENS: u64 = 1 << 20;

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
    /// Skip the naive and LRU baselines.
    #[arg(long)]
    pub no_baselines: bool,
    /// Print the result as JSON (schema in docs/simulator.md).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

pub fn execute(args: SimulateArgs) -> CommandResult {
    if args.steps == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps 0: simulate at least 1 step"
        )));
    }
    if args.steps > crate::sim::MAX_STEPS {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps {}: at most {} steps (a steady state shows after a few; each step is \
             kept for the report)",
            args.steps,
            crate::sim::MAX_STEPS
        )));
    }
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
    let settings = loaded.settings;
    let model = load_model(&args, settings.block_pattern.as_deref())?;
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
        trace
            .write_chrome_trace(path)
            .map_err(Failure::run_failed)?;
        eprintln!(
            "wrote the Chrome trace of the stagehand run to {} (open it in https://ui.perfetto.dev)",
            path.display()
        );
    }
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &simulation)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_text(
            &mut out,
            &simulation,
            &depth_source,
            settings.trace.as_deref(),
        )
    };
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.map_err(Failure::run_failed)?,
    }
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

/// A shipped name or description TOML, else a checkpoint `inspect` can read.
fn load_model(args: &SimulateArgs, pattern: Option<&str>) -> Result<ModelDescription, Failure> {
    let path = Path::new(&args.model);
    let is_description = ModelDescription::builtin_names().contains(&args.model.as_str())
        || path.extension().is_some_and(|ext| ext == "toml")
        || !path.exists();
    if is_description {
        return ModelDescription::load(&args.model).map_err(Failure::bad_input);
    }
    if args.tokens_per_step == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--tokens-per-step 0: a step processes at least 1 token"
        )));
    }
    let family = crate::model::ModelFolder::find(path)
        .ok()
        .flatten()
        .and_then(|folder| folder.model_type());
    if let Some(family) = family {
        if let Some(prepared) = prepare_family(path, &family, args.tokens_per_step)? {
            return ModelDescription::from_prepared(&prepared, args.tokens_per_step)
                .map_err(Failure::bad_input);
        }
    }
    let index = ModelIndex::open(path, pattern).map_err(Failure::bad_input)?;
    ModelDescription::from_model_index(&index, args.tokens_per_step, None)
        .map_err(Failure::bad_input)
}

/// A folder of a family stagehand computes, prepared as `run` prepares it (headers
/// only for a decoder): its own blocks, the kernels it calls, what it reserves.
/// `None` for other folders (described from their checkpoint).
fn prepare_family(
    path: &Path,
    family: &str,
    tokens_per_step: u64,
) -> Result<Option<crate::run::Prepared>, Failure> {
    let settings = crate::settings::Settings::default();
    let (kind, extras, batch) = if crate::workload::decoder::DECODER_FAMILIES.contains(&family) {
        let extras = crate::run::Extras {
            headers_only: true,
            ..crate::run::Extras::default()
        };
        (crate::run::WorkloadKind::Decoder, extras, 1)
    } else if family == "bert" {
        if tokens_per_step > MAX_ENCODER_TOKENS {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--tokens-per-step {tokens_per_step}: an encoder step of at most {MAX_ENCODER_TOKENS} tokens is described (the token ids it embeds are made up to describe it)"
            )));
        }
        // One step embeds `tokens_per_step` tokens: sequences of the model's longest,
        // one batch (the texts' ids do not change the work).
        let max_positions = crate::model::ModelFolder::find(path)
            .ok()
            .flatten()
            .and_then(|folder| {
                crate::workload::encoder::bert_config(&folder.config_path(), &folder.config).ok()
            })
            .map_or(512, |config| config.max_positions as u64)
            .max(1);
        let sequences = tokens_per_step.div_ceil(max_positions);
        let ids: Vec<Vec<u32>> = (0..sequences)
            .map(|sequence| {
                let length = (tokens_per_step - sequence * max_positions).min(max_positions);
                vec![0; length as usize]
            })
            .collect();
        let extras = crate::run::Extras {
            encoder: Some(crate::run::EncoderInput::TokenIds(ids)),
            ..crate::run::Extras::default()
        };
        (
            crate::run::WorkloadKind::Encoder,
            extras,
            sequences as usize,
        )
    } else {
        return Ok(None);
    };
    crate::run::prepare_with(path, kind, batch, &settings, false, &extras)
        .map(Some)
        .map_err(|error| Failure::bad_input(anyhow::anyhow!(error)))
}

fn seconds(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.3} s")
    } else {
        format!("{:.3} ms", value * 1e3)
    }
}

/// The bound in the model's unit; a tokens/s figure is an upper limit, a time a lower.
fn bound_in_unit(simulation: &Simulation) -> String {
    let rate = &simulation.bound_rate;
    if rate.unit == "tokens/s" {
        format!("at most {rate}")
    } else if rate.unit == "s/step" {
        "no [output] in the description: per step only".to_string()
    } else {
        format!("at least {rate}")
    }
}

fn per_step(bytes: f64) -> String {
    Bytes(bytes.round() as u64).to_string()
}

fn write_text(
    out: &mut impl Write,
    simulation: &Simulation,
    depth_source: &Source,
    trace: Option<&Path>,
) -> std::io::Result<()> {
    let fit = &simulation.fit;
    writeln!(
        out,
        "{} ({}) on {} ({}; {} RAM, {} disk, {} link), {} step{}, seed {}",
        simulation.model,
        Bytes(fit.model_bytes),
        simulation.hardware,
        simulation.gpu,
        Bytes(simulation.ram_bytes),
        simulation.disk,
        simulation.link,
        simulation.steps,
        if simulation.steps == 1 { "" } else { "s" },
        simulation.seed
    )?;
    writeln!(
        out,
        "budgets: vram {} (ring {}, resident {}), pin ceiling {} (staging {}, cache {})",
        Bytes(fit.vram_budget_bytes),
        Bytes(fit.ring_bytes),
        Bytes(fit.resident_bytes),
        Bytes(fit.pin_ceiling_bytes),
        Bytes(fit.staging_bytes),
        Bytes(fit.pinned_cache_bytes)
    )?;
    if !simulation.fits {
        writeln!(out, "fits: NO")?;
        for message in &simulation.failure_messages {
            writeln!(out, "  - {message}")?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "fits: yes; per step {} over PCIe, {} from disk",
        Bytes(fit.pcie_bytes_per_step),
        Bytes(fit.disk_bytes_per_step)
    )?;
    writeln!(
        out,
        "bound: {} per step ({}), {:?}-bound (compute {}, pcie {}, disk {}); cold first step ≥ {}",
        seconds(fit.bound_seconds),
        bound_in_unit(simulation),
        fit.bottleneck,
        seconds(fit.compute_seconds),
        seconds(fit.pcie_seconds),
        seconds(fit.disk_seconds),
        seconds(fit.cold_bound_seconds)
    )
    .map(|()| ())?;
    write_depth_search(out, simulation, depth_source)?;
    writeln!(out)?;
    writeln!(
        out,
        "{:<13} {:>5} {:>11} {:>11} {:>11} {:>8} {:>7} {:>12} {:>12} {:>12} {:>21} {:>21}",
        "policy",
        "depth",
        "cold",
        "steady",
        "bound",
        "×bound",
        "×plan",
        "disk→pinned",
        "pinned→vram",
        "disk→vram",
        "peak vram / budget",
        "peak pinned / limit"
    )?;
    let row = |out: &mut dyn Write, name: &str, figures: &PolicyFigures| {
        let run = &figures.run;
        let bytes = &run.steady_bytes_per_step;
        writeln!(
            out,
            "{:<13} {:>5} {:>11} {:>11} {:>11} {:>7.3}× {:>6.3}× {:>12} {:>12} {:>12} {:>21} {:>21}",
            name,
            run.prefetch_depth,
            seconds(run.cold_step_seconds),
            seconds(run.steady_step_seconds),
            seconds(figures.bound_seconds),
            figures.steady_over_bound,
            figures.steady_over_plan_bound,
            per_step(bytes.disk_to_pinned),
            per_step(bytes.pinned_to_vram),
            per_step(bytes.disk_to_vram),
            format!(
                "{} / {}",
                Bytes(run.peak_vram_bytes),
                Bytes(run.vram_budget_bytes)
            ),
            format!(
                "{} / {}",
                Bytes(run.peak_pinned_bytes),
                Bytes(run.pinned_limit_bytes)
            ),
        )
    };
    if let Some(stagehand) = &simulation.stagehand {
        row(out, "stagehand", stagehand)?;
    }
    for baseline in &simulation.baselines {
        match &baseline.figures {
            Some(figures) => row(out, baseline.policy.label(), figures)?,
            None => writeln!(
                out,
                "{:<13} could not run: {}",
                baseline.policy.label(),
                baseline.error.as_deref().unwrap_or("unknown")
            )?,
        }
    }
    writeln!(
        out,
        "(bound: the fit check's at each policy's prefetch depth; ×plan: steady step over the bound of the bytes its plan moves; bytes per steady step)"
    )?;
    if let (Some(stagehand), Some(rate)) = (&simulation.stagehand, &simulation.stagehand_rate) {
        writeln!(
            out,
            "stagehand: {} per steady step = {rate}; {:.1} % of the bound",
            seconds(stagehand.run.steady_step_seconds),
            stagehand.efficiency * 100.0
        )?;
    }
    for baseline in &simulation.baselines {
        let Some(speedup) = baseline.stagehand_speedup else {
            continue;
        };
        if (speedup - 1.0).abs() < 0.005 {
            // At depth 0 stagehand is the naive baseline: "1.00× faster" would mislead.
            writeln!(
                out,
                "stagehand vs {} ({}): the same steady step",
                baseline.policy.label(),
                baseline.description
            )?;
        } else if speedup >= 1.0 {
            writeln!(
                out,
                "stagehand vs {} ({}): {speedup:.2}× faster per steady step",
                baseline.policy.label(),
                baseline.description
            )?;
        } else {
            writeln!(
                out,
                "stagehand vs {} ({}): {:.2}× slower per steady step",
                baseline.policy.label(),
                baseline.description,
                1.0 / speedup
            )?;
        }
    }
    write_depth_advice(out, simulation)?;
    for warning in &simulation.warnings {
        writeln!(out, "warning: {warning}")?;
    }
    if let Some(path) = trace {
        writeln!(out, "trace (stagehand run): {}", path.display())?;
    }
    Ok(())
}

/// Where the depth came from and, with auto, every candidate's figure.
fn write_depth_search(
    out: &mut impl Write,
    simulation: &Simulation,
    depth_source: &Source,
) -> std::io::Result<()> {
    let configured = simulation.prefetch_depth_configured;
    if !simulation.prefetch_depth_auto {
        return writeln!(
            out,
            "prefetch depth: {configured} (set by {depth_source}); --prefetch-depth auto lets the simulator choose"
        );
    }
    let tried: Vec<String> = simulation
        .depth_candidates
        .iter()
        .map(|candidate| match candidate.steady_step_seconds {
            Some(steady) => format!("{} → {}", candidate.depth, seconds(steady)),
            None => format!("{} → could not run", candidate.depth),
        })
        .collect();
    let chosen = match simulation.prefetch_depth_chosen {
        Some(depth) => format!("chose {depth}"),
        None => format!("no depth could run; checked the configured {configured}"),
    };
    writeln!(
        out,
        "prefetch depth: auto, steady step over {SEARCH_STEPS} steps at each of 0..={AUTO_DEPTH_MAX}: {}; {chosen}",
        tried.join(", ")
    )?;
    for candidate in &simulation.depth_candidates {
        if let Some(error) = &candidate.error {
            writeln!(out, "  depth {}: {error}", candidate.depth)?;
        }
    }
    Ok(())
}

/// The depth to put in the config for this model on this machine.
fn write_depth_advice(out: &mut impl Write, simulation: &Simulation) -> std::io::Result<()> {
    let Some(advice) = simulation.depth_advice() else {
        return Ok(());
    };
    let chosen = seconds(advice.steady_step_seconds);
    let configured = advice.configured_depth;
    if simulation.fit.ring_bytes == 0 {
        return writeln!(
            out,
            "the whole model stays resident in VRAM: prefetch_depth makes no difference here ({chosen}/step)"
        );
    }
    if advice.depth == configured {
        return writeln!(
            out,
            "the configured prefetch_depth = {configured} is the fastest for this model on this box: {chosen}/step"
        );
    }
    let versus = match advice.configured_steady_step_seconds {
        Some(steady) if steady <= advice.steady_step_seconds * (1.0 + TIE_RELATIVE) => {
            format!(
                "as fast as the configured {configured}, with fewer buffers in VRAM and pinned RAM"
            )
        }
        Some(steady) => format!("vs {} at the configured {configured}", seconds(steady)),
        None => format!("; the configured {configured} cannot run under these budgets"),
    };
    write!(
        out,
        "recommended prefetch_depth = {} for this model on this box: {chosen}/step {versus}",
        advice.depth
    )?;
    writeln!(out)
}
