//! A video model: a config's model whose folder is a diffusers Wan pipeline. Its own
//! thread takes jobs from a bounded queue (429 when full) and runs
//! [`crate::pipeline::generate_video`] — umT5, the transformer (or Wan 2.2 A14B's two
//! experts), the WAN VAE, each streamed and checked under the model's budgets and every
//! byte given back after it, a failed stage included — then encodes the frames as an
//! H.264 MP4 and sends it back. Beside a shared `[budget]` each stage runs as a member
//! of it (`NAME:STAGE`), as an image model's do.
//!
//! An image-to-video folder (`WanImageToVideoPipeline`) takes each job's first frame
//! (`input_reference`) and encodes it with the VAE before the steps; its queue says so,
//! so a request without the image (or with one, for a text-to-video folder) is a 400
//! before it is queued.
//!
//! A job's progress (0–100) follows the pipeline's steps: umT5 the first 5, the
//! denoising steps of both experts the next 85, the VAE's chunks the last 10.

use std::sync::Arc;

use stagehand_actors::{SharedBudget, StatsSnapshot};

use crate::pipeline::{generate_video, mp4_bytes, PipelineRun, VideoRequest, WanParts};
use crate::run::loaded::Cancel;
use crate::run::RunError;
use crate::settings::Settings;
use crate::telemetry::serving::ServeTelemetry;

use super::config::{ModelConfig, ServeConfig};
use super::errors::ApiError;
use super::load::Worker;
use super::pipeline_model::{pipeline_info, pipeline_serving};
use super::state::ServedModel;
use super::video_jobs::JobProgress;
use super::ServeError;

/// One video to a video model's thread.
pub struct VideoJob {
    pub request: VideoRequest,
    /// The MP4's frames per second.
    pub fps: u32,
    pub progress: Arc<JobProgress>,
    /// The MP4's bytes, or why not.
    pub reply: flume::Sender<Result<Vec<u8>, RunError>>,
    /// Set by `DELETE /v1/videos/{id}` or the server stopping: a queued job is
    /// skipped, a running one stops at its next step (its stage's budgets given back).
    pub cancel: Cancel,
}

/// A video model's queue, and what its pipeline starts from.
pub struct VideoQueue {
    pub jobs: flume::Sender<VideoJob>,
    /// An image-to-video pipeline (`WanImageToVideoPipeline`): every job needs its
    /// first frame; a text-to-video one takes none.
    pub from_image: bool,
    /// TI2V-5B (`expand_timesteps`): text to video, or from a first frame when
    /// the job gives one.
    pub image_optional: bool,
}

impl VideoQueue {
    /// A 400 naming `input_reference` when the request's image (`given`) does not
    /// fit the pipeline of `model`, before the job is queued: the pipeline would
    /// refuse it too, but as a failed job minutes later, in the CLI's words.
    pub fn check_image(&self, model: &str, given: bool) -> Result<(), ApiError> {
        match (self.from_image, given) {
            (true, false) => Err(ApiError::bad_request(
                "input_reference",
                format!("`{model}` makes a video from an image (WanImageToVideoPipeline): the image is required; send its first frame as input_reference, a PNG of the video's size (a file part of a multipart/form-data body)"),
            )),
            (false, true) if !self.image_optional => Err(ApiError::bad_request(
                "input_reference",
                format!("`{model}` makes videos from text (WanPipeline) and takes no input_reference: leave it out, or name an image-to-video model (a WanImageToVideoPipeline folder)"),
            )),
            _ => Ok(()),
        }
    }
}

/// A video model: its pipeline's parts found, its thread started.
pub(super) fn load_videos(
    model: &ModelConfig,
    config: &ServeConfig,
    (settings, shared): (Settings, Option<(SharedBudget, String)>),
    telemetry: &ServeTelemetry,
) -> Result<(ServedModel, Worker), ServeError> {
    let name = &model.name;
    let bad = |problem| ServeError::model_entry(name, problem);
    if !model.lora.is_empty() || !model.adapters.is_empty() || model.parts.is_some() {
        return Err(bad(
            "a Wan pipeline is served from its diffusers folder alone: remove lora, adapters and [models.parts]".into(),
        ));
    }
    let parts = WanParts::folder(&model.folder).map_err(|error| bad(error.to_string()))?;
    let models = [Some(&parts.text_encoder), Some(&parts.transformer)];
    let models = models
        .into_iter()
        .chain([parts.transformer_2.as_ref(), Some(&parts.vae)]);
    let info = pipeline_info(models.flatten(), &settings);
    let model_bytes = info.model_bytes;
    let queue_depth = model.queue_depth.unwrap_or(config.limits.queue_depth);
    let serving = pipeline_serving(telemetry, name, info, queue_depth)?;
    let (videos, queue) = flume::bounded(queue_depth);
    let worker_parts = parts.clone();
    let channels = (serving.observer, serving.stages);
    let worker = std::thread::Builder::new()
        .name(format!("serve-{name}"))
        .spawn(move || serve_videos(&worker_parts, &settings, channels, (queue, shared)))
        .map_err(|error| {
            ServeError::Failed(format!("cannot start the thread of {name}: {error}"))
        })?;
    tracing::info!(
        "serve: {name} loaded (a Wan {} pipeline: umT5, {} transformer(s), VAE, {} in all, each streamed in turn)",
        if parts.image_to_video { "image-to-video" } else { "text-to-video" },
        1 + usize::from(parts.transformer_2.is_some()),
        stagehand_actors::Bytes(model_bytes)
    );
    let served = ServedModel {
        videos: Some(VideoQueue {
            jobs: videos,
            from_image: parts.image_to_video,
            image_optional: parts.expand_timesteps,
        }),
        ..serving.model
    };
    Ok((served, worker))
}

/// A video model's thread: answers jobs until the queue closes. Each video runs the
/// whole pipeline, every stage's budgets given back at its end (or at its failure),
/// so the thread ends holding nothing.
fn serve_videos(
    parts: &WanParts,
    settings: &Settings,
    (observer, stages): (
        Arc<dyn stagehand_actors::Observer>,
        Arc<crate::telemetry::PrometheusObserver>,
    ),
    (jobs, shared): (flume::Receiver<VideoJob>, Option<(SharedBudget, String)>),
) -> Result<StatsSnapshot, RunError> {
    for job in jobs.iter() {
        if job.cancel.is_cancelled() {
            continue;
        }
        job.progress.start();
        let progress = Arc::clone(&job.progress);
        let steps = job.request.steps as u64;
        let run = PipelineRun {
            settings,
            observer: Arc::clone(&observer),
            progress: Arc::new(move |stage: &'static str, done: u64, of: u64| {
                progress.set(percent(stage, (done, of), steps));
            }),
            stop: job.cancel.flag(),
            shared: shared.clone(),
            stages: Some(Arc::clone(&stages) as Arc<dyn crate::telemetry::StageObserver>),
        };
        let answer = generate_video(parts, &job.request, &run)
            .map_err(RunError::from)
            .and_then(|video| {
                // Encoding frames in memory fails only where the encoder is wrong.
                mp4_bytes(&video.frames, job.fps).map_err(|error| RunError::Internal {
                    message: error.to_string(),
                    source: Some(Box::new(error)),
                })
            });
        let _ = job.reply.send(answer);
        // The job's stages freed all they allocated; the allocator keeps it unless asked.
        crate::os::release_freed_memory();
    }
    Ok(StatsSnapshot::default())
}

/// How far a video is when `stage` has done `done` of its `of` steps, of `steps`
/// denoising steps in all: umT5 0–5, the experts 5–90 (the second expert takes the
/// steps the first left), the VAE 90–100.
fn percent(stage: &str, (done, of): (u64, u64), steps: u64) -> u8 {
    let share = |done: u64, of: u64| done.min(of) as f64 / of.max(1) as f64;
    let value = match stage {
        "umt5" => 5.0 * share(done, of),
        "transformer" => 5.0 + 85.0 * share(done, steps),
        "transformer_2" => 5.0 + 85.0 * share(steps.saturating_sub(of) + done, steps),
        "vae" => 90.0 + 10.0 * share(done, of),
        _ => 0.0,
    };
    value as u8
}

#[cfg(test)]
mod tests {
    use super::percent;

    #[test]
    fn progress_follows_the_stages_and_both_experts_steps() {
        // Proves the percent a client polls rises through umT5, the first expert's
        // steps, the second's (after the first's), and the VAE, never past 100.
        assert_eq!(percent("umt5", (0, 1), 4), 0);
        assert_eq!(percent("umt5", (1, 1), 4), 5);
        assert_eq!(percent("transformer", (1, 1), 4), 26);
        assert_eq!(percent("transformer_2", (0, 3), 4), 26);
        assert_eq!(percent("transformer_2", (3, 3), 4), 90);
        assert_eq!(percent("transformer", (4, 4), 4), 90);
        assert_eq!(percent("vae", (1, 2), 4), 95);
        assert_eq!(percent("vae", (9, 2), 4), 100);
    }
}

#[cfg(test)]
mod queue_tests {
    use super::{VideoJob, VideoQueue};

    #[test]
    fn a_ti2v_model_takes_a_first_frame_or_none() {
        // Proves a TI2V (expand_timesteps) model's jobs may carry an input_reference
        // or not, an I2V-A14B model's need one and a text-to-video model's take none.
        let queue = |from_image, image_optional| VideoQueue {
            jobs: flume::bounded::<VideoJob>(1).0,
            from_image,
            image_optional,
        };
        let ti2v = queue(false, true);
        assert!(ti2v.check_image("ti2v", true).is_ok() && ti2v.check_image("ti2v", false).is_ok());
        let i2v = queue(true, false);
        assert!(i2v.check_image("i2v", true).is_ok() && i2v.check_image("i2v", false).is_err());
        let t2v = queue(false, false);
        assert!(t2v.check_image("t2v", false).is_ok() && t2v.check_image("t2v", true).is_err());
    }
}
