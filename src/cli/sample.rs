//! `stagehand sample`: a Flux transformer's denoising steps from a conditioning file
//! (T5 hidden states and the pooled CLIP vector), streamed under the same budgets,
//! flags, metrics, trace and summary as `run`; the final latent, unpacked to its 16
//! channels, is written as safetensors. Each denoising step is a run step: progress
//! shows per step, and the summary's figures are per denoising step.

use std::path::PathBuf;

use serde::Serialize;

use super::run::{run_error, run_prepared, use_cuda, Launch, PolicyArg};
use super::{CommandResult, Failure};
use stagehand::families::flux::{write_latent, SampleInput, Start};
use stagehand::families::Activations;
use stagehand::lora::LoraSpec;
use stagehand::run::driver::Model;
use stagehand::run::summary::Summary;
use stagehand::run::{prepare_with, Extras, WorkloadKind};
use stagehand::settings::{self, SettingsArgs};

#[derive(Debug, clap::Args)]
pub struct SampleArgs {
    /// A Flux transformer: diffusers' `transformer/` folder, or an original or ComfyUI
    /// `.safetensors` file.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    /// The conditioning (safetensors): `encoder_hidden_states` [1, L, D] (T5) and
    /// `pooled_projections` [1, P] (CLIP).
    #[arg(long, value_name = "FILE")]
    pub cond: PathBuf,
    /// Image width in pixels (a multiple of 16).
    #[arg(long, default_value_t = 1024)]
    pub width: usize,
    /// Image height in pixels (a multiple of 16).
    #[arg(long, default_value_t = 1024)]
    pub height: usize,
    /// Denoising steps of the schedule (dev: 28–50; schnell: 4).
    #[arg(long)]
    pub steps: usize,
    /// Distilled guidance (dev only; default 3.5).
    #[arg(long)]
    pub guidance: Option<f32>,
    /// Seed of the initial Gaussian latent (and of the noise added to --init with --strength).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Start from this latent (safetensors `latent` [1, 16, H/8, W/8]) instead of seeded noise.
    #[arg(long, value_name = "FILE")]
    pub init: Option<PathBuf>,
    /// Image-to-image: noise --init to this strength (0–1] and run that share of the steps.
    #[arg(long, requires = "init")]
    pub strength: Option<f64>,
    /// Where to write the final latent (safetensors `latent` [1, 16, H/8, W/8], F32).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Attach a LoRA adapter (kohya or diffusers/PEFT names) with an optional strength; repeatable.
    #[arg(long, value_name = "FILE[:STRENGTH]", value_parser = super::run::parse_lora_arg)]
    pub lora: Vec<LoraSpec>,
    /// Print the result and the run summary as JSON at the end.
    #[arg(long)]
    pub json: bool,
    /// No progress output and no run summary (the line naming the written latent stays).
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Serialize)]
struct Sampled<'a> {
    out: String,
    width: usize,
    height: usize,
    steps: usize,
    image_tokens: usize,
    text_tokens: usize,
    sigmas: &'a [f32],
    seconds_per_step: f64,
    activation_bytes: u64,
    /// What a step reserves and each kind of block's working set, computed from the
    /// shapes each uses (as `simulate --model` reports them).
    activations: Activations,
    summary: &'a Summary,
}

fn bad(message: String) -> Failure {
    Failure::bad_input(anyhow::anyhow!(message))
}

/// The sampling inputs, checked.
fn input_of(args: &SampleArgs) -> Result<SampleInput, Failure> {
    if args.steps == 0 {
        return Err(bad("--steps 0 samples nothing; give at least 1".into()));
    }
    let start = match (&args.init, args.strength) {
        (Some(_), None) if args.seed.is_some() => {
            return Err(bad(
                "--seed and --init both say where the first latent comes from; give one (or --strength to noise --init with --seed)".into(),
            ))
        }
        (Some(path), strength) => Start::Init {
            path: path.clone(),
            strength,
            seed: args.seed.unwrap_or(0),
        },
        (None, _) => Start::Seed(args.seed.unwrap_or(0)),
    };
    Ok(SampleInput {
        cond: args.cond.clone().into(),
        width: args.width,
        height: args.height,
        steps: args.steps,
        guidance: args.guidance,
        start,
    })
}

pub fn execute(args: SampleArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    super::run::init_logging(&settings.log);
    super::logging::log_setting_notes(&loaded.provenance);
    let use_cuda = use_cuda(settings.device)?;
    let extras = Extras {
        loras: args.lora.clone(),
        ..Extras::default()
    }
    .with(input_of(&args)?);
    super::image::check_out(&args.out)?;
    let prepared = prepare_with(
        &args.model,
        WorkloadKind::Diffusion,
        1,
        &settings,
        false,
        &extras,
    )
    .map_err(run_error)?;
    let Model::Flux(flux) = &prepared.workload.model else {
        return Err(bad(format!(
            "{} is not a Flux transformer",
            args.model.display()
        )));
    };
    let steps = flux.steps_per_sample();
    if !args.quiet && !args.json {
        eprintln!(
            "sample: {} {} layout, {}×{} ({} image + {} text tokens), {steps} steps, σ {:.3} → 0",
            prepared.describe(),
            flux.layout.describe(),
            args.width,
            args.height,
            flux.image_tokens(),
            flux.text_tokens(),
            flux.sigmas[flux.first]
        );
    }
    let outcome = run_prepared(
        &prepared,
        &settings,
        Launch {
            steps: steps as u64,
            policy: PolicyArg::Planned,
            quiet: args.quiet || args.json,
            keep_outputs: true,
            use_cuda,
            on_token: None,
            verify: settings::Verify::First,
        },
    )?;
    let Some(packed) = outcome.report.outputs.values().last() else {
        return Err(Failure::run_failed(anyhow::anyhow!(
            "the run computed no step"
        )));
    };
    let channels = flux.config.in_channels / 4;
    let (height, width) = (args.height / 8, args.width / 8);
    write_latent(&args.out, &flux.unpack(packed), channels, height, width)
        .map_err(|error| Failure::run_failed(anyhow::anyhow!(error)))?;
    print_result(&args, flux, &outcome, (channels, height, width))
}

/// The result as JSON, or the written latent's line and the run summary.
fn print_result(
    args: &SampleArgs,
    flux: &stagehand::families::flux::Flux,
    outcome: &stagehand::run::Outcome,
    (channels, height, width): (usize, usize, usize),
) -> CommandResult {
    let steps = flux.steps_per_sample();
    let summary = Summary::new(outcome);
    let seconds_per_step = outcome.report.steady_step_seconds();
    if args.json {
        let sampled = Sampled {
            out: args.out.display().to_string(),
            width: args.width,
            height: args.height,
            steps,
            image_tokens: flux.image_tokens(),
            text_tokens: flux.text_tokens(),
            sigmas: &flux.sigmas[flux.first..],
            seconds_per_step,
            activation_bytes: flux.working_set_bytes(),
            activations: flux.activations(),
            summary: &summary,
        };
        let json = serde_json::to_string_pretty(&sampled).map_err(Failure::run_failed)?;
        println!("{json}");
        return Ok(());
    }
    println!(
        "sample: wrote {} (latent [1, {channels}, {height}, {width}]) after {steps} denoising steps",
        args.out.display(),
    );
    if args.quiet {
        return Ok(());
    }
    if outcome.report.steps >= 2 {
        eprintln!(
            "  {:.1} ms per denoising step (steady: {})",
            seconds_per_step * 1e3,
            match outcome.report.steps - 1 {
                1 => "the second step".to_string(),
                later => format!("median of {later} steps"),
            }
        );
    }
    let activations = flux.activations();
    eprintln!(
        "  activations: {} per denoising step (every tensor of the step over {} tokens, allocated once), reserved through the activation path before the first block; working set per block (computed from the shapes each kind holds live): {}",
        stagehand_actors::Bytes(activations.reserved_bytes),
        flux.image_tokens() + flux.text_tokens(),
        activations.describe_peaks()
    );
    eprint!("{}", summary.render("sample"));
    Ok(())
}
