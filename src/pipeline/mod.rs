//! From a prompt to an image: a Flux pipeline's four models — CLIP and T5 for the
//! prompt, the transformer for the denoising steps, the VAE for the pixels — run one
//! after another under the same budgets, each streamed and checked as any run is.
//!
//! The stages share the settings' VRAM budget and pin ceiling by turns: each opens
//! its model, runs under the whole budget, and gives back every byte before the next
//! opens, so the pipeline's peak is its largest stage's, never their sum. T5 streams
//! through once and is gone before the transformer's first step; the VAE decodes
//! last. (Keeping some models loaded between images in one shared budget is
//! `serve`'s broker, not this.)
//!
//! What diffusers' `FluxPipeline` computes, in the same order: CLIP's pooled vector
//! of the prompt padded to 77 tokens, T5's states of the prompt padded to
//! `max_sequence_length`, the transformer's steps from the starting noise (given, or
//! seeded), the latent un-scaled and decoded, the pixels rounded.

mod check;
mod error;
mod files;
mod folder;
mod image;
mod png_input;
mod vae;
mod video;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

pub use error::PipelineError;
pub use files::PartFiles;
pub use folder::{FluxParts, PipelinePart};
pub use image::Picture;
pub use png_input::{png_rgb, PngInputError, PNG_SIGNATURE};
pub use video::{
    choose_vae_tile, generate_video, HandOver, Video, VideoFiles, VideoRequest, WanParts,
};
#[cfg(feature = "mp4")]
pub use video::{mp4_bytes, write_mp4, Mp4Error};

use crate::families::flux::{CondInput, Conditioning, SampleInput, Start};
use crate::families::{EncoderInput, Extras, Model, PromptLength, WorkloadKind};
use crate::run::loaded::{shared_budgets, SharedMember};
use crate::run::{
    budgets_for, execute, fitting_depth, prepare_with, BudgetAsk, Outcome, Prepared, RunError,
    RunPlan,
};
use crate::settings::{Settings, Verify};
use crate::telemetry::{StageFigures, StageObserver};
use stagehand_actors::Link;

/// What to make.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageRequest {
    pub prompt: String,
    pub width: usize,
    pub height: usize,
    pub steps: usize,
    /// Distilled guidance (dev); `None`: 3.5 on dev, none on schnell.
    pub guidance: Option<f32>,
    /// Seed of each image's starting noise (image `i` takes `seed + i`).
    pub seed: u64,
    /// Images of the prompt.
    pub count: usize,
    /// T5's prompt length (diffusers' `max_sequence_length`).
    pub max_sequence_length: usize,
    /// The starting noise of every image, unpacked `[16, height/8, width/8]`, instead
    /// of seeded noise (diffusers' `latents`).
    pub latents: Option<Vec<f32>>,
    /// Decode in tiles of this many latent positions a side; `None`: whole when the
    /// budget leaves room for it, else the largest tile that fits.
    pub vae_tile: Option<usize>,
    /// Image-to-image: the image to start from and how much of the schedule to run.
    pub init: Option<InitImage>,
}

/// The image image-to-image starts from: `[3, height, width]` in [−1, 1], the
/// request's size, and the strength (0, 1]: the share of the schedule run from it
/// noised (1 ignores the image, as diffusers' `FluxImg2ImgPipeline`).
#[derive(Debug, Clone, PartialEq)]
pub struct InitImage {
    pub pixels: Vec<f32>,
    pub strength: f64,
}

/// One stage's run.
pub struct Stage {
    /// "clip", "t5", "transformer", "vae".
    pub name: &'static str,
    pub model: PipelinePart,
    pub seconds: f64,
    pub outcome: Outcome,
}

impl Stage {
    /// The stage's figures as its metrics count them.
    pub fn figures(&self) -> StageFigures {
        let report = &self.outcome.report;
        let budgets = [
            self.outcome.budgets.vram_budget_bytes,
            self.outcome.budgets.pin_ceiling_bytes,
        ];
        StageFigures {
            stage: self.name,
            seconds: self.seconds,
            transferred_bytes: Link::ALL.map(|link| report.stats.link(link).model_bytes),
            peak_bytes: [
                report.stats.vram.peak_used_bytes,
                report.stats.pinned.peak_used_bytes,
            ],
            budget_bytes: budgets,
        }
    }
}

/// What a pipeline made.
pub struct Generated {
    pub pictures: Vec<Picture>,
    /// Each image's final latent, unpacked (before the VAE).
    pub latents: Vec<Vec<f32>>,
    pub stages: Vec<Stage>,
}

/// Told as each stage starts and steps: (stage, step done, steps).
pub type Progress = Arc<dyn Fn(&'static str, u64, u64) + Send + Sync>;

/// How the stages run: the settings, the metrics observer, progress.
pub struct PipelineRun<'a> {
    pub settings: &'a Settings,
    pub observer: Arc<dyn stagehand_actors::Observer>,
    pub progress: Progress,
    /// Set to stop the pipeline at its next step: that stage fails as
    /// [`RunError::Cancelled`] with every budget given back, and no later stage runs.
    /// A command passes the process's stop flag ([`crate::signals::stop_flag`]);
    /// `serve` a job's own (a deleted video).
    pub stop: Arc<AtomicBool>,
    /// Run each stage inside this shared budget (serve's `[budget]`, beside other
    /// models) as the member `NAME:STAGE`, ranked first while it runs and gone when it
    /// ends; `None`: each stage under the settings' budgets.
    pub shared: Option<(stagehand_actors::SharedBudget, String)>,
    /// Told of each stage's figures (time, bytes per link, peaks against budgets) and
    /// of the images made: the pipeline's Prometheus series.
    pub stages: Option<Arc<dyn StageObserver>>,
}

impl<'a> PipelineRun<'a> {
    /// Stages under `settings`, unobserved and without progress, stopped by the
    /// process's stop flag: an embedder's or a test's run.
    pub fn quiet(settings: &'a Settings) -> Self {
        Self {
            settings,
            observer: crate::run::no_observer(),
            progress: Arc::new(|_, _, _| {}),
            stop: crate::signals::stop_flag(),
            shared: None,
            stages: None,
        }
    }
}

impl PipelineRun<'_> {
    /// Opens one stage's model with `extras`, runs `steps` steps under the settings'
    /// budgets, and gives back its outcome (every budget released at its end).
    fn stage(
        &self,
        (name, kind): (&'static str, WorkloadKind),
        model: &PipelinePart,
        extras: &Extras,
        batch: usize,
        steps: impl Fn(&Prepared) -> u64,
    ) -> Result<(Prepared, Stage), PipelineError> {
        let started = Instant::now();
        let prepared = self.open((name, kind), model, extras, batch)?;
        let steps = steps(&prepared);
        let checked = (steps, self.verify_for(steps));
        let stage = self.run_opened((name, started), model, &prepared, checked)?;
        Ok((prepared, stage))
    }

    /// Opens one stage's model as `run` opens it (the part of its file that is the
    /// model, with its tokenizer).
    fn open(
        &self,
        (name, kind): (&'static str, WorkloadKind),
        model: &PipelinePart,
        extras: &Extras,
        batch: usize,
    ) -> Result<Prepared, PipelineError> {
        let extras = Extras {
            part: model.part.clone(),
            tokenizer: model.tokenizer.clone(),
            ..extras.clone()
        };
        prepare_with(&model.path, kind, batch, self.settings, false, &extras).map_err(|source| {
            PipelineError::Stage {
                stage: name,
                source,
            }
        })
    }

    /// Runs `steps` steps of a stage's opened model (timed from `started`) under the
    /// settings' budgets, or as a member of the shared budget, checked as `verify`
    /// says ([`PipelineRun::verify_for`], or a deferred first step's `weights`).
    fn run_opened(
        &self,
        (name, started): (&'static str, Instant),
        model: &PipelinePart,
        prepared: &Prepared,
        (steps, verify): (u64, Verify),
    ) -> Result<Stage, PipelineError> {
        let failed = |source| PipelineError::Stage {
            stage: name,
            source,
        };
        let ask = BudgetAsk::steps(steps);
        let (budgets, depth, member) = match &self.shared {
            Some((pool, owner)) => {
                let member = SharedMember {
                    pool: pool.clone(),
                    name: format!("{owner}:{name}"),
                };
                let (budgets, depth) =
                    shared_budgets(prepared, self.settings, ask, &member).map_err(failed)?;
                (budgets, depth, Some(member))
            }
            None => {
                let budgets = budgets_for(prepared, self.settings, ask);
                let depth = fitting_depth(prepared, self.settings, budgets, ask);
                (budgets, depth, None)
            }
        };
        let settings = Settings {
            prefetch_depth: depth,
            verify: Some(verify),
            ..self.settings.clone()
        };
        let progress = Arc::clone(&self.progress);
        progress(name, 0, steps);
        let plan = RunPlan {
            keep_outputs: true,
            observer: Arc::clone(&self.observer),
            stop: Arc::clone(&self.stop),
            on_step: Box::new(move |step, _| progress(name, step + 1, steps)),
            shared: member,
            ..RunPlan::new(&settings, budgets, steps)
        };
        let outcome = execute(prepared, plan).map_err(failed)?;
        // A stopped run ends early with the steps it made; the pipeline goes no further.
        if self.stop.load(Ordering::SeqCst) {
            return Err(failed(RunError::Cancelled {
                message: "stopped before its last step".into(),
            }));
        }
        let stage = Stage {
            name,
            model: model.clone(),
            seconds: started.elapsed().as_secs_f64(),
            outcome,
        };
        if let Some(observer) = &self.stages {
            observer.stage_done(&stage.figures());
        }
        Ok(stage)
    }
}

/// The outputs of a stage's steps, in step order.
fn outputs(stage: &Stage) -> Vec<&Vec<f32>> {
    stage.outcome.report.outputs.values().collect()
}

/// Makes `request.count` images of `request.prompt` with the pipeline `parts`.
pub fn generate(
    parts: &FluxParts,
    request: &ImageRequest,
    run: &PipelineRun<'_>,
) -> Result<Generated, PipelineError> {
    check(request)?;
    let prompt = EncoderInput::Texts(vec![request.prompt.clone()]);
    let mut stages = Vec::with_capacity(4);
    let text = Extras::default().with(prompt);
    let (prepared, clip) = run.stage(("clip", WorkloadKind::Auto), &parts.clip, &text, 1, |_| 1)?;
    let pooled = clip_pooled(&prepared, &clip)?;
    stages.push(clip);
    let t5_extras = text.with(PromptLength(request.max_sequence_length));
    let (_, t5) = run.stage(("t5", WorkloadKind::Auto), &parts.t5, &t5_extras, 1, |_| 1)?;
    let context = outputs(&t5)[0].clone();
    stages.push(t5);
    let cond = Conditioning {
        tokens: request.max_sequence_length,
        context,
        pooled,
    };
    let encoded = match &request.init {
        Some(init) => Some(vae::encode(parts, request, run, init, &mut stages)?),
        None => None,
    };
    let latents = denoise(parts, request, run, (cond, encoded), &mut stages)?;
    let (pictures, vae) = vae::decode(parts, request, run, &latents)?;
    stages.push(vae);
    if let Some(observer) = &run.stages {
        observer.images_made(pictures.len() as u64);
    }
    Ok(Generated {
        pictures,
        latents,
        stages,
    })
}

/// The transformer's steps for each image; each image's final latent, unpacked.
fn denoise(
    parts: &FluxParts,
    request: &ImageRequest,
    run: &PipelineRun<'_>,
    (cond, encoded): (Conditioning, Option<Vec<f32>>),
    stages: &mut Vec<Stage>,
) -> Result<Vec<Vec<f32>>, PipelineError> {
    let mut latents = Vec::with_capacity(request.count);
    for image in 0..request.count {
        let seed = request.seed + image as u64;
        let start = match (&encoded, &request.init, &request.latents) {
            (Some(latent), Some(init), _) => Start::Image {
                latent: latent.clone(),
                strength: init.strength,
                seed,
            },
            (_, _, Some(noise)) => Start::Latent(noise.clone()),
            _ => Start::Seed(seed),
        };
        let extras = Extras::default().with(SampleInput {
            cond: CondInput::Given(cond.clone()),
            width: request.width,
            height: request.height,
            steps: request.steps,
            guidance: request.guidance,
            start,
        });
        let steps_of = |prepared: &Prepared| match &prepared.workload.model {
            Model::Flux(flux) => flux.steps_per_sample() as u64,
            _ => 0,
        };
        let (prepared, stage) = run.stage(
            ("transformer", WorkloadKind::Auto),
            &parts.transformer,
            &extras,
            1,
            steps_of,
        )?;
        let Model::Flux(flux) = &prepared.workload.model else {
            return Err(PipelineError::Layout {
                path: parts.transformer.path.clone(),
                problem: "is not a Flux transformer".into(),
            });
        };
        let Some(packed) = outputs(&stage).last().map(|packed| flux.unpack(packed)) else {
            return Err(PipelineError::StageOutput {
                stage: "transformer",
                message: "the transformer computed no step".into(),
            });
        };
        latents.push(packed);
        stages.push(stage);
    }
    Ok(latents)
}

/// CLIP's pooled vector: the first `hidden` values of its output.
fn clip_pooled(prepared: &Prepared, clip: &Stage) -> Result<Vec<f32>, PipelineError> {
    let Model::Clip(encoder) = &prepared.workload.model else {
        return Err(PipelineError::Layout {
            path: clip.model.path.clone(),
            problem: "is not a CLIP text encoder (model_type clip_text_model)".into(),
        });
    };
    let hidden = encoder.config.hidden;
    match outputs(clip).first() {
        Some(values) if values.len() == encoder.output_values() => Ok(values[..hidden].to_vec()),
        _ => Err(PipelineError::StageOutput {
            stage: "clip",
            message: "CLIP computed no pooled vector".into(),
        }),
    }
}

fn check(request: &ImageRequest) -> Result<(), PipelineError> {
    let bad = |field, message: String| Err(PipelineError::field(field, message));
    if request.prompt.trim().is_empty() {
        return bad(
            "prompt",
            "the prompt is empty; say what the image shows".into(),
        );
    }
    if request.width == 0
        || request.height == 0
        || request.width % 16 != 0
        || request.height % 16 != 0
    {
        let field = if request.width == 0 || request.width % 16 != 0 {
            "width"
        } else {
            "height"
        };
        return bad(
            field,
            format!(
                "{}×{}: width and height must be positive multiples of 16",
                request.width, request.height
            ),
        );
    }
    if request.steps == 0 || request.count == 0 || request.max_sequence_length == 0 {
        let field = match (request.steps, request.count) {
            (0, _) => "steps",
            (_, 0) => "count",
            _ => "max_sequence_length",
        };
        let message = "steps, the image count and the sequence length must be at least 1";
        return bad(field, message.into());
    }
    if let Some(init) = &request.init {
        if request.latents.is_some() {
            return bad("latents", "a starting latent and an image to start from both say where the first latent comes from; give one".into());
        }
        if !(init.strength > 0.0 && init.strength <= 1.0) {
            return bad(
                "strength",
                format!(
                    "strength {}: give a value in (0, 1] (1 starts from pure noise)",
                    init.strength
                ),
            );
        }
        if init.pixels.len() != 3 * request.width * request.height {
            return bad(
                "image",
                format!(
                    "the image to start from has {} values; a {}×{} RGB image has {}",
                    init.pixels.len(),
                    request.width,
                    request.height,
                    3 * request.width * request.height
                ),
            );
        }
    }
    Ok(())
}
