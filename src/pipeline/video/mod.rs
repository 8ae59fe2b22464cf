//! From a prompt to a video: a Wan pipeline's models — umT5 for the prompt and the
//! negative prompt, the transformer (or Wan 2.2 A14B's two experts) for the
//! denoising steps, the WAN VAE for the frames — run one after another under the same
//! budgets, each streamed and checked as any run is.
//!
//! What diffusers' `WanPipeline` computes, in the same order: the prompts' umT5
//! states (padded to `max_sequence_length`, the padding masked and zeroed), the
//! starting noise (given, or seeded), the steps of the folder's scheduler (UniPC or
//! flow-matching Euler) with
//! classifier-free guidance when the guidance is above 1 (the prompt's and the
//! negative prompt's passes under one acquire of each block), the high-noise expert
//! for the timesteps at or above `boundary_ratio × 1000` and the low-noise expert
//! (with `guidance_2`) for the rest, then the latent un-normalised and decoded chunk by
//! chunk. At the switch the second expert opens during the first's last step, both
//! members of one budget, so its first blocks load meanwhile (`experts`); where two
//! experts' floors do not fit in the budget, or `hand_over_prefetch` is off, the first
//! gives back every byte before the second opens. Each expert's first step is checked
//! against its resident pass after both sampled, not at the switch (`check`).
//!
//! From an image (`WanImageToVideoPipeline`, Wan 2.2 I2V-A14B), before the steps: the
//! video of the image then black frames (and the last image last, when given) goes
//! through the VAE's encoder, and its latent behind a mask of the given frames is the
//! condition every step's transformer input carries after the noise.

mod both_open;
mod condition;
mod decode;
mod experts;
mod files;
mod folder;
mod hand_over;
#[cfg(feature = "mp4")]
mod mp4;

pub use both_open::BothOpen;
pub use decode::choose_vae_tile;
pub use files::VideoFiles;
pub use folder::WanParts;
pub use hand_over::HandOver;
#[cfg(feature = "mp4")]
pub use mp4::{mp4_bytes, write_mp4, Mp4Error};

use std::time::Instant;

use super::check::FirstStepCheck;
use super::{outputs, Picture, PipelineError, PipelineRun, Stage};
use crate::families::flux::gaussian;
use crate::families::wan::scheduler::{read_solver, Solver};
use crate::families::wan::{high_noise_steps, Guidance, SampleStart, WanInput, WanSample};
use crate::families::wan_vae::WanTile;
use crate::families::{EncoderInput, Extras, PaddingMasked, PromptLength, WorkloadKind};
use decode::decode;
use experts::Ran;

/// What to make.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoRequest {
    pub prompt: String,
    /// What the video should not show (WanPipeline's default: empty).
    pub negative_prompt: String,
    pub width: usize,
    pub height: usize,
    /// Frames: 4k + 1 (the VAE keeps the first and folds every 4 after it).
    pub frames: usize,
    pub steps: usize,
    /// Classifier-free guidance (WanPipeline's default 5.0; at most 1: none).
    pub guidance: f32,
    /// The low-noise expert's guidance; `None`: `guidance`.
    pub guidance_2: Option<f32>,
    pub seed: u64,
    /// The starting noise `[channels, latent frames, height/8, width/8]` instead of
    /// seeded noise (diffusers' `latents`).
    pub latents: Option<Vec<f32>>,
    pub max_sequence_length: usize,
    /// The first frame, `[3, height, width]` in [−1, 1]: an image-to-video
    /// pipeline's `image` (required there, refused elsewhere).
    pub image: Option<Vec<f32>>,
    /// The last frame the same way (diffusers' `last_image`), with `image`.
    pub last_image: Option<Vec<f32>>,
    /// Decode in tiles of space (diffusers' `enable_tiling`); `None`: the whole frame
    /// when the budget leaves room for it, else the largest tile that fits.
    pub vae_tile: Option<WanTile>,
    /// At the switch between two experts, open the second during the first's last
    /// step, both in one budget, so its first blocks load meanwhile (the default);
    /// off: the second opens once the first has given back every byte.
    pub hand_over_prefetch: bool,
}

impl VideoRequest {
    /// Latent frames, rows and columns under a VAE of `scale` pixels a latent
    /// position (8; Wan 2.2's 48-channel VAE 16).
    pub fn latent_size(&self, scale: usize) -> [usize; 3] {
        let scale = scale.max(1);
        [
            (self.frames - 1) / 4 + 1,
            self.height / scale,
            self.width / scale,
        ]
    }
}

/// What a pipeline made.
pub struct Video {
    /// Each frame, in order.
    pub frames: Vec<Picture>,
    /// The final latent (before the VAE).
    pub latent: Vec<f32>,
    pub stages: Vec<Stage>,
    /// The switch between two experts, when both took steps.
    pub hand_over: Option<HandOver>,
}

/// Makes the video `request` asks for with the pipeline `parts`.
pub fn generate_video(
    parts: &WanParts,
    request: &VideoRequest,
    run: &PipelineRun<'_>,
) -> Result<Video, PipelineError> {
    check(request, parts)?;
    let config = read_solver(&parts.scheduler).map_err(|error| PipelineError::Layout {
        path: error.path,
        problem: error.problem,
    })?;
    let train_timesteps = config.train_timesteps();
    let solver = config.solver(request.steps);
    let mut stages = Vec::with_capacity(4);
    let (context, negative) = encode(parts, request, run, &mut stages)?;
    let (condition, first_frame) = condition::encode(parts, request, run, &mut stages)?;
    let [frames, height, width] = request.latent_size(parts.vae_scale);
    let latent = match &request.latents {
        Some(noise) => noise.clone(),
        None => gaussian(
            parts.latent_channels * frames * height * width,
            request.seed,
        ),
    };
    let high = match (&parts.transformer_2, parts.boundary_ratio) {
        (Some(_), Some(ratio)) => high_noise_steps(&solver.timesteps(), ratio, train_timesteps),
        _ => request.steps,
    };
    let input = WanInput {
        latent,
        frames,
        height,
        width,
        timestep: 0.0,
        context,
        guidance: None,
        condition,
        first_frame,
    };
    let sampling = Sampling {
        input,
        negative,
        solver,
        high,
    };
    let first_frame = sampling.input.first_frame.clone();
    let (mut latent, hand_over) = sample(parts, request, run, sampling, &mut stages)?;
    if let Some(first) = first_frame {
        // The solver moved the first frame too; the video's is the image's, as
        // WanImageToVideoPipeline puts it back after the steps.
        latent = first.replace(&latent, (parts.latent_channels, frames));
    }
    let (pictures, vae) = decode(parts, request, run, &latent)?;
    stages.push(vae);
    Ok(Video {
        hand_over,
        frames: pictures,
        latent,
        stages,
    })
}

/// What the experts sample from: the first step's input (its guidance set per
/// expert), the negative prompt's states when guided, the solver, and the steps the
/// high-noise expert takes.
struct Sampling {
    input: WanInput,
    negative: Option<Vec<f32>>,
    solver: Solver,
    high: usize,
}

/// The experts' steps: the high-noise expert's, then the low-noise expert's from the
/// latent and the solver's state it left; the final latent and the switch measured.
/// With both taking steps and `hand_over_prefetch` on, the second opens during the
/// first's last step, both in one budget (`experts`); else one after the other.
fn sample(
    parts: &WanParts,
    request: &VideoRequest,
    run: &PipelineRun<'_>,
    sampling: Sampling,
    stages: &mut Vec<Stage>,
) -> Result<(Vec<f32>, Option<HandOver>), PipelineError> {
    let Sampling {
        mut input,
        negative,
        solver,
        high,
    } = sampling;
    let low = request.steps - high;
    let latent = std::mem::take(&mut input.latent);
    let share = |latent: Vec<f32>, solver: Solver, steps: usize, scale: f32| WanSample {
        input: WanInput {
            latent,
            guidance: (negative.clone()).map(|negative| Guidance { negative, scale }),
            ..input.clone()
        },
        solver,
        steps,
    };
    let clock = hand_over::SwitchClock::default();
    let timed = clock.timed(run, ["transformer", "transformer_2"]);
    let second_part = parts.transformer_2.as_ref().unwrap_or(&parts.transformer);
    let guidance_2 = request.guidance_2.unwrap_or(request.guidance);
    let mut deferred = Vec::with_capacity(2);
    let mut both_open = None;
    let latent = if high > 0 && low > 0 && request.hand_over_prefetch {
        let first = share(latent, solver.clone(), high, request.guidance);
        let replayed = first.clone();
        // Only its shape counts until its start arrives.
        let shape = share(vec![0.0; first.input.latent.len()], solver, low, guidance_2);
        let experts = [
            experts::Expert {
                name: "transformer",
                part: &parts.transformer,
                share: first,
            },
            experts::Expert {
                name: "transformer_2",
                part: second_part,
                share: shape,
            },
        ];
        let paired = experts::run_paired(&timed, experts, |stage| {
            clock.first_closed();
            let (latent, solver) = replay(&replayed, stage)?;
            Ok(SampleStart { latent, solver })
        })?;
        push(stages, &mut deferred, paired.first);
        both_open = paired.both_open;
        let (second, share) = match paired.second {
            Some(ran) => (ran, paired.second_share),
            None => {
                let kind = ("transformer_2", WorkloadKind::Auto);
                let extras = Extras::default().with(paired.second_share.clone());
                let steps = low as u64;
                let ran = timed.stage_deferred(kind, second_part, &extras, steps)?;
                (ran, paired.second_share)
            }
        };
        let (latent, _) = replay(&share, &second.0)?;
        push(stages, &mut deferred, second);
        latent
    } else {
        let experts = [
            ("transformer", &parts.transformer, high, request.guidance),
            ("transformer_2", second_part, low, guidance_2),
        ];
        let (mut latent, mut solver) = (latent, solver);
        for (name, part, steps, scale) in experts {
            if steps == 0 {
                continue;
            }
            let share = share(latent, solver, steps, scale);
            let extras = Extras::default().with(share.clone());
            let kind = (name, WorkloadKind::Auto);
            let ran = timed.stage_deferred(kind, part, &extras, steps as u64)?;
            if name == "transformer" {
                clock.first_closed();
            }
            (latent, solver) = replay(&share, &ran.0)?;
            push(stages, &mut deferred, ran);
        }
        latent
    };
    let hand_over = checked_hand_over(run, stages, deferred, &clock, both_open)?;
    Ok((latent, hand_over))
}

/// Each expert's first step checked, then the switch as measured. The checks are made
/// here, after both sampled, not at the end of each run: there the high-noise
/// expert's check sat between its last step and the low-noise expert's first (a whole
/// resident step: most of the switch). Here no session holds a byte, and the latent
/// is checked before the VAE decodes it.
fn checked_hand_over(
    run: &PipelineRun<'_>,
    stages: &mut [Stage],
    deferred: Vec<(usize, FirstStepCheck)>,
    clock: &hand_over::SwitchClock,
    both_open: Option<BothOpen>,
) -> Result<Option<HandOver>, PipelineError> {
    let checked = Instant::now();
    let checks = deferred.len();
    for (at, check) in deferred {
        check.check(run, &mut stages[at])?;
    }
    let checks_seconds = (checks > 0).then(|| checked.elapsed().as_secs_f64());
    let Some(at) = stages.iter().position(|stage| stage.name == "transformer") else {
        return Ok(None);
    };
    let next = stages
        .get(at + 1)
        .filter(|next| next.name == "transformer_2");
    let hand_over = next.and_then(|next| clock.hand_over(&stages[at], next, checks_seconds));
    Ok(hand_over.map(|hand_over| HandOver {
        both_open,
        ..hand_over
    }))
}

/// The latent and the solver after `share`'s steps, from its stage's outputs.
fn replay(share: &WanSample, stage: &Stage) -> Result<(Vec<f32>, Solver), PipelineError> {
    (share.replay(outputs(stage).into_iter().map(Vec::as_slice)))
        .map_err(|problem| PipelineError::Failed(format!("{}: {problem}", stage.name)))
}

/// Keeps a stage, and its deferred check with the stage's place.
fn push(stages: &mut Vec<Stage>, deferred: &mut Vec<(usize, FirstStepCheck)>, ran: Ran) {
    let (stage, check) = ran;
    deferred.extend(check.map(|check| (stages.len(), check)));
    stages.push(stage);
}

/// umT5's states of the prompt and, when guided, of the negative prompt: one step
/// of a batch of both, each `[max_sequence_length, dim]` with its padding zeroed.
fn encode(
    parts: &WanParts,
    request: &VideoRequest,
    run: &PipelineRun<'_>,
    stages: &mut Vec<Stage>,
) -> Result<(Vec<f32>, Option<Vec<f32>>), PipelineError> {
    let guided = request.guidance > 1.0;
    let mut texts = vec![clean(&request.prompt)];
    if guided {
        texts.push(clean(&request.negative_prompt));
    }
    let batch = texts.len();
    let extras = Extras::default()
        .with(EncoderInput::Texts(texts))
        .with(PromptLength(request.max_sequence_length))
        .with(PaddingMasked);
    let kind = ("umt5", WorkloadKind::Auto);
    let (_, stage) = run.stage(kind, &parts.text_encoder, &extras, batch, |_| 1)?;
    let states = outputs(&stage).first().map(|states| states.to_vec());
    stages.push(stage);
    let Some(states) = states.filter(|states| states.len() % batch == 0 && !states.is_empty())
    else {
        return Err(PipelineError::StageOutput {
            stage: "umt5",
            message: "umT5 computed no states".into(),
        });
    };
    let each = states.len() / batch;
    let negative = guided.then(|| states[each..].to_vec());
    Ok((states[..each].to_vec(), negative))
}

/// WanPipeline's `prompt_clean` without ftfy: runs of whitespace made one space, the
/// ends trimmed.
fn clean(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn check(request: &VideoRequest, parts: &WanParts) -> Result<(), PipelineError> {
    let bad = |field, message: String| Err(PipelineError::field(field, message));
    if request.prompt.trim().is_empty() {
        return bad(
            "prompt",
            "the prompt is empty; say what the video shows".into(),
        );
    }
    let (width, height) = (request.width, request.height);
    let multiple = 2 * parts.vae_scale;
    if width == 0 || height == 0 || width % multiple != 0 || height % multiple != 0 {
        let field = if width == 0 || width % multiple != 0 {
            "width"
        } else {
            "height"
        };
        return bad(field, format!("{width}×{height}: width and height must be positive multiples of {multiple} (the VAE's {} × the transformer's patch of 2)", parts.vae_scale));
    }
    if request.frames == 0 || request.frames % 4 != 1 {
        let lower = (request.frames.max(1) - 1) / 4 * 4 + 1;
        return bad("frames", format!("--frames {}: WAN makes 4k + 1 frames (the VAE keeps the first and folds every 4 after it); give {lower} or {}", request.frames, lower + 4));
    }
    if request.steps == 0 || request.max_sequence_length == 0 {
        let field = if request.steps == 0 {
            "steps"
        } else {
            "max_sequence_length"
        };
        return bad(
            field,
            "steps and the sequence length must be at least 1".into(),
        );
    }
    let scales = [Some(request.guidance), request.guidance_2];
    if scales.iter().flatten().any(|scale| !scale.is_finite()) {
        return bad("guidance", "the guidance scales must be numbers".into());
    }
    condition::check(request, parts)?;
    if let Some(noise) = &request.latents {
        let [frames, h, w] = request.latent_size(parts.vae_scale);
        let expected = parts.latent_channels * frames * h * w;
        if noise.len() != expected {
            return bad(
                "latents",
                format!(
                    "the starting latent has {} values; [{}, {frames}, {h}, {w}] has {expected}",
                    noise.len(),
                    parts.latent_channels
                ),
            );
        }
    }
    Ok(())
}
