//! `stagehand image`: a prompt to a PNG through a Flux pipeline folder — CLIP and T5
//! for the prompt, the transformer's denoising steps, the VAE — each model streamed
//! under the same budgets in turn and checked as every run is. The PNG carries the
//! prompt, seed, steps, guidance and model in text chunks; the summary gives each
//! stage's time, bytes over each link, peaks and budget.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::{CommandResult, Failure};
use stagehand::families::flux::read_tensors;
use stagehand::pipeline::{
    generate, png_rgb, FluxParts, Generated, ImageRequest, InitImage, PartFiles, PipelineError,
    PipelineRun, PngInputError, Stage,
};
use stagehand::run::summary::Summary;
use stagehand::settings::{self, SettingsArgs};

/// The files of a Flux pipeline's parts given one by one (ComfyUI's separate files),
/// for `image` and `simulate`.
#[derive(Debug, clap::Args)]
pub struct PartArgs {
    /// CLIP-L's file, beside the transformer's file or in place of the pipeline's
    /// (ComfyUI's clip_l.safetensors).
    #[arg(long, value_name = "FILE")]
    pub clip: Option<PathBuf>,
    /// T5-XXL's file (t5xxl_fp16.safetensors or t5xxl_fp8_e4m3fn_scaled.safetensors).
    #[arg(long, value_name = "FILE")]
    pub t5: Option<PathBuf>,
    /// The autoencoder's file (ComfyUI's ae.safetensors, in its original names, or
    /// diffusers').
    #[arg(long, value_name = "FILE")]
    pub vae: Option<PathBuf>,
}

impl PartArgs {
    /// Whether any part was given as a file.
    pub fn any(&self) -> bool {
        self.clip.is_some() || self.t5.is_some() || self.vae.is_some()
    }

    /// The parts' files, their tokenizers not given.
    pub fn files(&self) -> PartFiles {
        PartFiles {
            clip: self.clip.clone(),
            t5: self.t5.clone(),
            vae: self.vae.clone(),
            ..PartFiles::default()
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct ImageArgs {
    /// A diffusers Flux pipeline folder (model_index.json, text_encoder/,
    /// text_encoder_2/, tokenizer/, tokenizer_2/, transformer/, vae/), a ComfyUI
    /// all-in-one checkpoint, or the transformer's file (flux1-dev.safetensors) with
    /// the other parts given by --clip, --t5 and --vae.
    #[arg(long, value_name = "PATH")]
    pub model: PathBuf,
    #[command(flatten)]
    pub parts: PartArgs,
    /// CLIP's tokenizer folder, for CLIP given as a file (vocab.json + merges.txt or
    /// tokenizer.json; ComfyUI's comfy/sd1_tokenizer).
    #[arg(long, value_name = "DIR")]
    pub clip_tokenizer: Option<PathBuf>,
    /// T5's tokenizer folder, for T5 given as a file (tokenizer.json; ComfyUI's
    /// comfy/text_encoders/t5_tokenizer).
    #[arg(long, value_name = "DIR")]
    pub t5_tokenizer: Option<PathBuf>,
    /// What the image shows.
    #[arg(long)]
    pub prompt: String,
    /// Width in pixels (a multiple of 16).
    #[arg(long, default_value_t = 1024)]
    pub width: usize,
    /// Height in pixels (a multiple of 16).
    #[arg(long, default_value_t = 1024)]
    pub height: usize,
    /// Denoising steps (diffusers' default for dev: 28; schnell: 4).
    #[arg(long, default_value_t = 28)]
    pub steps: usize,
    /// Distilled guidance (dev only; default 3.5).
    #[arg(long)]
    pub guidance: Option<f32>,
    /// Seed of the starting noise; image i of a batch takes seed + i.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Images of the prompt.
    #[arg(long, default_value_t = 1)]
    pub batch: usize,
    /// T5's prompt length in tokens, padded to it (diffusers' `max_sequence_length`).
    #[arg(long, default_value_t = 512)]
    pub max_sequence_length: usize,
    /// Start from this noise (safetensors `latent` [1, 16, H/8, W/8], as diffusers'
    /// `latents` unpacked) instead of seeded noise.
    #[arg(long, value_name = "FILE")]
    pub latents: Option<PathBuf>,
    /// Decode in tiles of this many latent positions a side (8 pixels each), blended
    /// over a quarter tile as diffusers' tiled decode; default: whole when the VRAM
    /// budget leaves room for its activations, else the largest tile that fits.
    #[arg(long, value_name = "POSITIONS")]
    pub vae_tile: Option<usize>,
    /// Image-to-image: start from this PNG (of --width × --height) noised to
    /// --strength, encoded by the pipeline's VAE.
    #[arg(long, value_name = "FILE.png")]
    pub init_image: Option<PathBuf>,
    /// With --init-image: the share (0, 1] of the schedule run from the noised image
    /// (1 ignores it; diffusers' default 0.6).
    #[arg(long, requires = "init_image", default_value_t = 0.6)]
    pub strength: f64,
    /// The PNG to write (`NAME-1.png`, `NAME-2.png`, … for a batch).
    #[arg(long, value_name = "FILE.png")]
    pub out: PathBuf,
    /// Print the result and each stage's summary as JSON at the end.
    #[arg(long)]
    pub json: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Serialize)]
pub(super) struct StageOutput {
    stage: &'static str,
    model: String,
    seconds: f64,
    summary: Summary,
}

impl StageOutput {
    pub(super) fn of(stage: &Stage) -> Self {
        Self {
            stage: stage.name,
            model: stage.model.path.display().to_string(),
            seconds: stage.seconds,
            summary: Summary::new(&stage.outcome),
        }
    }
}

#[derive(Debug, Serialize)]
struct ImageOutput {
    images: Vec<String>,
    width: usize,
    height: usize,
    seconds: f64,
    stages: Vec<StageOutput>,
}

pub(super) fn bad(message: String) -> Failure {
    Failure::bad_input(anyhow::anyhow!(message))
}

pub(super) fn pipeline_failure(error: PipelineError) -> Failure {
    // The line names the stage and says its run's error in words: the chain of
    // causes behind it is not printed again.
    let message = anyhow::anyhow!(error.to_string());
    // The kind says whose it is: a stage that could not open what it was given is
    // the user's input, a stage that failed or computed nothing is the run's.
    match error.is_bad_input() {
        true => Failure::bad_input(message),
        false => Failure::run_failed(message),
    }
}

/// The starting noise of `--latents`, checked against the size.
fn latents_of(args: &ImageArgs) -> Result<Option<Vec<f32>>, Failure> {
    let Some(path) = &args.latents else {
        return Ok(None);
    };
    let tensors = read_tensors(path).map_err(|error| bad(error.to_string()))?;
    let Some((_, shape, values)) = tensors.into_iter().find(|(name, ..)| name == "latent") else {
        return Err(bad(format!("{}: no tensor `latent`", path.display())));
    };
    let (height, width) = (args.height / 8, args.width / 8);
    if values.len() != 16 * height * width {
        return Err(bad(format!(
            "{}: `latent` is {shape:?}; a {}×{} image starts from [1, 16, {height}, {width}]",
            path.display(),
            args.width,
            args.height
        )));
    }
    Ok(Some(values))
}

/// The image of `--init-image`: an 8-bit PNG of the size asked.
fn init_of(args: &ImageArgs) -> Result<Option<InitImage>, Failure> {
    let Some(path) = &args.init_image else {
        return Ok(None);
    };
    let planar = read_rgb("--init-image", path, [args.width, args.height])?;
    Ok(Some(InitImage {
        pixels: planar,
        strength: args.strength,
    }))
}

/// Where image `index` of `count` goes.
fn out_path(out: &Path, index: usize, count: usize) -> PathBuf {
    if count == 1 {
        return out.to_path_buf();
    }
    let stem = out
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or("image");
    out.with_file_name(format!("{stem}-{}.png", index + 1))
}

/// `--out` names a file in an existing folder (`sample` and `image` write one).
pub(super) fn check_out(out: &Path) -> Result<(), Failure> {
    let folder = out.parent().filter(|dir| !dir.as_os_str().is_empty());
    if folder.is_some_and(|dir| !dir.is_dir()) || out.is_dir() {
        return Err(bad(format!(
            "--out {}: not a file in an existing folder; create the folder or pick another path",
            out.display()
        )));
    }
    Ok(())
}

/// A progress bar that names the stage it counts.
fn progress(quiet: bool) -> (ProgressBar, stagehand::pipeline::Progress) {
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(1)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let shown = bar.clone();
    let report = Arc::new(move |stage: &'static str, done: u64, steps: u64| {
        if done == 0 {
            shown.set_message(stage);
            shown.set_length(steps);
            shown.set_position(0);
        } else {
            shown.set_position(done);
        }
    });
    (bar, report)
}

/// The settings of a pipeline command (`image`, `video`), logging started, the
/// devices a pipeline does not run on refused.
pub(super) fn pipeline_settings(
    args: &SettingsArgs,
    command: &str,
) -> Result<settings::Settings, Failure> {
    let loaded = settings::load(args).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    super::run::init_logging(&settings.log);
    super::logging::log_setting_notes(&loaded.provenance);
    match settings.device {
        settings::DeviceKind::Sim => Err(bad(
            "device `sim` runs in virtual time: use `stagehand simulate --model PATH --hardware NAME`".into(),
        )),
        settings::DeviceKind::Cuda => Err(bad(format!(
            "--device cuda: {command} runs on the CPU backend for now (the CUDA adapter has no convolution or text-encoder kernels yet); pass --device cpu or auto"
        ))),
        settings::DeviceKind::Auto | settings::DeviceKind::Cpu => Ok(settings),
    }
}

/// The Prometheus observer of `--metrics-addr` (every stage's runs and its stage
/// series), or none.
fn pipeline_metrics(
    settings: &settings::Settings,
) -> Result<Option<Arc<stagehand::telemetry::PrometheusObserver>>, Failure> {
    match settings.metrics_addr {
        Some(addr) => Ok(Some(Arc::new(
            stagehand::telemetry::install(addr).map_err(Failure::bad_input)?,
        ))),
        None => Ok(None),
    }
}

/// Runs `make` with the pipeline's run: one observer for every stage (its stage
/// series telling them apart, on `--metrics-addr`), a progress bar naming the stage.
pub(super) fn with_pipeline_run<T>(
    settings: &settings::Settings,
    quiet: bool,
    make: impl FnOnce(&PipelineRun<'_>) -> Result<T, PipelineError>,
) -> Result<T, Failure> {
    let metrics = pipeline_metrics(settings)?;
    let observer = match &metrics {
        Some(metrics) => Arc::clone(metrics) as Arc<dyn stagehand_actors::Observer>,
        None => stagehand::run::no_observer(),
    };
    let (bar, report) = progress(quiet);
    let run = PipelineRun {
        settings,
        observer,
        progress: report,
        stop: stagehand::signals::stop_flag(),
        shared: None,
        stages: metrics.map(|metrics| metrics as Arc<dyn stagehand::telemetry::StageObserver>),
    };
    let made = make(&run);
    bar.finish_and_clear();
    made.map_err(pipeline_failure)
}

pub fn execute(args: ImageArgs) -> CommandResult {
    let settings = pipeline_settings(&args.settings, "image")?;
    check_out(&args.out)?;
    if args.batch == 0 {
        return Err(bad("--batch 0 makes no image; give at least 1".into()));
    }
    if args.vae_tile == Some(0) {
        return Err(bad(
            "--vae-tile 0: a tile is at least one latent position (8 pixels) a side; leave it out to tile only when the budget needs it".into(),
        ));
    }
    let files = PartFiles {
        clip_tokenizer: args.clip_tokenizer.clone(),
        t5_tokenizer: args.t5_tokenizer.clone(),
        ..args.parts.files()
    };
    let parts = FluxParts::locate(&args.model, &files).map_err(pipeline_failure)?;
    let request = ImageRequest {
        prompt: args.prompt.clone(),
        width: args.width,
        height: args.height,
        steps: args.steps,
        guidance: args.guidance,
        seed: args.seed,
        count: args.batch,
        max_sequence_length: args.max_sequence_length,
        latents: latents_of(&args)?,
        vae_tile: args.vae_tile,
        init: init_of(&args)?,
    };
    let started = std::time::Instant::now();
    let quiet = args.quiet || args.json;
    let generated = with_pipeline_run(&settings, quiet, |run| generate(&parts, &request, run))?;
    let written = write_images(&args, &generated)?;
    print_result(&args, &generated, &written, started.elapsed().as_secs_f64())
}

/// Writes every picture with the request's settings in its text chunks.
fn write_images(args: &ImageArgs, generated: &Generated) -> Result<Vec<PathBuf>, Failure> {
    let count = generated.pictures.len();
    let mut written = Vec::with_capacity(count);
    for (index, picture) in generated.pictures.iter().enumerate() {
        let path = out_path(&args.out, index, count);
        let seed = match &args.latents {
            Some(file) => format!("latents from {}", file.display()),
            None => (args.seed + index as u64).to_string(),
        };
        let text = [
            ("prompt", args.prompt.clone()),
            ("seed", seed),
            ("steps", args.steps.to_string()),
            (
                "guidance",
                args.guidance.map_or("default".into(), |g| g.to_string()),
            ),
            ("size", format!("{}x{}", args.width, args.height)),
            ("max_sequence_length", args.max_sequence_length.to_string()),
            ("model", args.model.display().to_string()),
            (
                "software",
                format!("stagehand {}", env!("CARGO_PKG_VERSION")),
            ),
        ]
        .map(|(keyword, value)| (keyword.to_string(), value));
        picture.write_png(&path, &text).map_err(pipeline_failure)?;
        written.push(path);
    }
    Ok(written)
}

pub(super) fn stage_line(stage: &Stage) -> String {
    let summary = Summary::new(&stage.outcome);
    format!(
        "  {:<13} {:>8.2} s  {} steps, {:.1} ms/step; weights {} ({} streamed a step); peak VRAM {} of {}, pinned {} of {}",
        stage.name,
        stage.seconds,
        summary.steps,
        summary.steady_step_seconds * 1e3,
        stagehand_actors::Bytes(summary.model_bytes),
        stagehand_actors::Bytes(summary.streamed_bytes_per_step_planned),
        stagehand_actors::Bytes(summary.peak_vram_bytes),
        stagehand_actors::Bytes(summary.vram_budget_bytes),
        stagehand_actors::Bytes(summary.peak_pinned_bytes),
        stagehand_actors::Bytes(summary.pin_ceiling_bytes),
    )
}

fn print_result(
    args: &ImageArgs,
    generated: &Generated,
    written: &[PathBuf],
    seconds: f64,
) -> CommandResult {
    if args.json {
        let output = ImageOutput {
            images: written
                .iter()
                .map(|path| path.display().to_string())
                .collect(),
            width: args.width,
            height: args.height,
            seconds,
            stages: generated.stages.iter().map(StageOutput::of).collect(),
        };
        let json = serde_json::to_string_pretty(&output).map_err(Failure::run_failed)?;
        println!("{json}");
        return Ok(());
    }
    for path in written {
        println!("{}", path.display());
    }
    if !args.quiet {
        eprintln!(
            "image: {}×{} in {seconds:.2} s, {} steps, every stage checked against its resident pass",
            args.width, args.height, args.steps
        );
        for stage in &generated.stages {
            eprintln!("{}", stage_line(stage));
        }
    }
    Ok(())
}

/// The PNG at `path` (`flag` names it in errors) as [`stagehand::pipeline::png_rgb`]
/// reads it: 8-bit RGB, RGBA or grey of exactly `[width, height]`, as `[3, height,
/// width]` in [−1, 1].
pub(super) fn read_rgb(
    flag: &str,
    path: &std::path::Path,
    [width, height]: [usize; 2],
) -> Result<Vec<f32>, Failure> {
    let fail = |problem: String| bad(format!("{flag} {}: {problem}", path.display()));
    let file = std::fs::File::open(path).map_err(|error| fail(error.to_string()))?;
    png_rgb(std::io::BufReader::new(file), [width, height]).map_err(|error| match error {
        PngInputError::WrongSize { found, .. } => fail(format!(
            "is {}×{}; resize it to --width {width} --height {height} (or give its size)",
            found[0], found[1]
        )),
        other => fail(other.to_string()),
    })
}
