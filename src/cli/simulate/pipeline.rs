//! `simulate --model PIPELINE`: a diffusers Flux pipeline folder, prompt to image,
//! stage by stage as `stagehand image` runs it — each model described from its own
//! step (CLIP and T5 on one prompt, T5 at 512 tokens; the transformer's denoising step
//! at 1024² with 512 text tokens; the VAE's decode of a 1024² image, whole), simulated
//! under the same budgets in turn, every byte given back before the next stage. The
//! image's time is each stage's cold step plus its steady steps (`--image-steps`
//! denoising steps, one step for the others); its peaks are the largest stage's.

use std::path::Path;

use serde::Serialize;

use super::super::{CommandResult, Failure};
use super::model_arg::load_part;
use super::SimulateArgs;
use stagehand::pipeline::{FluxParts, PartFiles};
use stagehand::sim::HardwareProfile;
use stagehand::simulate::{simulate, SimRunError, SimulateOptions, Simulation};

/// One stage's prediction.
#[derive(Debug, Serialize)]
struct StagePrediction {
    stage: &'static str,
    model: String,
    fits: bool,
    steps: u64,
    cold_step_seconds: f64,
    steady_step_seconds: f64,
    seconds: f64,
    peak_vram_bytes: u64,
    vram_budget_bytes: u64,
    peak_pinned_bytes: u64,
    activation_bytes: u64,
    failures: Vec<String>,
}

#[derive(Debug, Serialize)]
struct PipelinePrediction {
    pipeline: String,
    hardware: String,
    fits: bool,
    seconds: f64,
    peak_vram_bytes: u64,
    peak_pinned_bytes: u64,
    stages: Vec<StagePrediction>,
}

/// Whether the run simulates a pipeline: `--model` a pipeline folder or all-in-one
/// checkpoint, or a part given beside it (ComfyUI's separate files).
pub(super) fn is_pipeline(args: &SimulateArgs) -> bool {
    args.parts.any() || FluxParts::is_pipeline(Path::new(&args.model))
}

/// The files of the pipeline's parts the run names, read for their weights only (a
/// simulation describes the text encoders from their headers: no tokenizer needed).
fn part_files(args: &SimulateArgs) -> PartFiles {
    PartFiles {
        weights_only: true,
        ..args.parts.files()
    }
}

fn prediction(
    stage: &'static str,
    path: &Path,
    steps: u64,
    simulation: &Simulation,
) -> StagePrediction {
    let run = simulation.stagehand.as_ref().map(|figures| &figures.run);
    let cold = run.map_or(0.0, |run| run.cold_step_seconds);
    let steady = run.map_or(0.0, |run| run.steady_step_seconds);
    StagePrediction {
        stage,
        model: path.display().to_string(),
        fits: simulation.fits,
        steps,
        cold_step_seconds: cold,
        steady_step_seconds: steady,
        seconds: cold + steady * steps.saturating_sub(1) as f64,
        peak_vram_bytes: run.map_or(0, |run| run.peak_vram_bytes),
        vram_budget_bytes: simulation.fit.vram_budget_bytes,
        peak_pinned_bytes: run.map_or(0, |run| run.peak_pinned_bytes),
        activation_bytes: simulation
            .activations
            .as_ref()
            .map_or(0, |a| a.reserved_bytes),
        failures: simulation.failure_messages.clone(),
    }
}

/// Simulates every stage of the pipeline at `args.model`.
pub(super) fn execute(
    args: &SimulateArgs,
    hardware: &HardwareProfile,
    options: &SimulateOptions,
    pattern: Option<&str>,
) -> CommandResult {
    let parts =
        FluxParts::locate(Path::new(&args.model), &part_files(args)).map_err(Failure::bad_input)?;
    if args.image_steps == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--image-steps 0: an image takes at least one denoising step"
        )));
    }
    let stages = [
        ("clip", &parts.clip, 1),
        ("t5", &parts.t5, 1),
        ("transformer", &parts.transformer, args.image_steps),
        ("vae", &parts.vae, 1),
    ];
    let mut predictions = Vec::with_capacity(stages.len());
    for (stage, part, steps) in stages {
        let model = load_part(part, args, pattern)?;
        let path = part.path.as_path();
        let simulation = simulate(&model, hardware, options).map_err(|error| match error {
            SimRunError::Setup(_) | SimRunError::Plan { .. } => {
                Failure::bad_input(anyhow::anyhow!("{stage}: {error}"))
            }
            _ => Failure::run_failed(anyhow::anyhow!("{stage}: {error}")),
        })?;
        predictions.push(prediction(stage, path, steps, &simulation));
    }
    let whole = PipelinePrediction {
        pipeline: args.model.clone(),
        hardware: hardware.name.clone(),
        fits: predictions.iter().all(|stage| stage.fits),
        seconds: predictions.iter().map(|stage| stage.seconds).sum(),
        peak_vram_bytes: predictions
            .iter()
            .map(|stage| stage.peak_vram_bytes)
            .max()
            .unwrap_or(0),
        peak_pinned_bytes: predictions
            .iter()
            .map(|stage| stage.peak_pinned_bytes)
            .max()
            .unwrap_or(0),
        stages: predictions,
    };
    report(args, &whole)?;
    if !whole.fits {
        let failures: Vec<String> = (whole.stages.iter())
            .filter(|stage| !stage.fits)
            .map(|stage| format!("{}: {}", stage.stage, stage.failures.join("; ")))
            .collect();
        return Err(Failure::DoesNotFit(anyhow::anyhow!(
            "{} on {}: {}",
            whole.pipeline,
            whole.hardware,
            failures.join("; ")
        )));
    }
    Ok(())
}

fn report(args: &SimulateArgs, whole: &PipelinePrediction) -> CommandResult {
    if args.json {
        let json = serde_json::to_string_pretty(whole).map_err(Failure::run_failed)?;
        println!("{json}");
        return Ok(());
    }
    let bytes = stagehand_actors::Bytes;
    println!(
        "{} on {}: prompt to image, the stages in turn under one budget",
        whole.pipeline, whole.hardware
    );
    println!(
        "{:<12} {:>5} {:>6} {:>11} {:>12} {:>10}  {:>24}  {:>12}  {:>12}",
        "stage",
        "fits",
        "steps",
        "cold",
        "steady",
        "time",
        "peak vram / budget",
        "activations",
        "peak pinned"
    );
    for stage in &whole.stages {
        println!(
            "{:<12} {:>5} {:>6} {:>9.3} s {:>10.3} s {:>8.3} s  {:>24}  {:>12}  {:>12}",
            stage.stage,
            if stage.fits { "yes" } else { "NO" },
            stage.steps,
            stage.cold_step_seconds,
            stage.steady_step_seconds,
            stage.seconds,
            format!(
                "{} / {}",
                bytes(stage.peak_vram_bytes),
                bytes(stage.vram_budget_bytes)
            ),
            bytes(stage.activation_bytes).to_string(),
            bytes(stage.peak_pinned_bytes).to_string(),
        );
    }
    println!(
        "image: {:.3} s, fits: {}; peaks (the largest stage's): VRAM {}, pinned {}",
        whole.seconds,
        if whole.fits { "yes" } else { "no" },
        bytes(whole.peak_vram_bytes),
        bytes(whole.peak_pinned_bytes)
    );
    Ok(())
}
