//! A video model: a config's model whose folder is a diffusers Wan pipeline. Its own
//! thread takes jobs from a bounded queue (429 when full) and runs
//! [`crate::pipeline::generate_video`] — umT5, the transformer (or Wan 2.2 A14B's two
//! experts), the WAN VAE, each streamed and checked under the model's budgets and every
//! byte given back after it, a failed stage included — then encodes the frames as an
//! H.264 MP4 and sends it back. Beside a shared `[budget]` each stage runs as a member
//! of it (`NAME:STAGE`), as an image model's do.
//!
//! A job's progress (0–100) follows the pipeline's steps: umT5 the first 5, the
//! denoising steps of both experts the next 85, the VAE's chunks the last 10.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;
use stagehand_actors::{SharedBudget, StatsSnapshot};

use crate::pipeline::{
    generate_video, mp4_bytes, PipelineError, PipelineRun, VideoRequest, WanParts,
};
use crate::run::loaded::{Cancel, LoadedInfo};
use crate::run::RunError;
use crate::settings::Settings;
use crate::telemetry::serving::ServeTelemetry;

use super::config::{ModelConfig, ServeConfig};
use super::load::{observer, Worker};
use super::residency::ResidencyProbe;
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

/// Whether `folder` is a diffusers Wan pipeline (`model_index.json` names a `Wan…`
/// class): served as a video model, its other faults then refused by name.
pub(super) fn is_wan_pipeline(folder: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(folder.join("model_index.json")) else {
        return false;
    };
    serde_json::from_str::<Value>(&text).is_ok_and(|index| {
        index
            .get("_class_name")
            .and_then(Value::as_str)
            .is_some_and(|class| class.starts_with("Wan"))
    })
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
    let series = telemetry
        .model(name)
        .ok_or_else(|| ServeError::Failed(format!("no series for {name}")))?;
    let info = info(&parts, &settings);
    let residency = ResidencyProbe::new();
    residency.set_model_bytes(info.model_bytes);
    let observer = observer(telemetry, name, &residency)?;
    let stages = telemetry
        .observer(name)
        .ok_or_else(|| ServeError::Failed(format!("no pipeline series for {name}")))?;
    let queue_depth = model.queue_depth.unwrap_or(config.limits.queue_depth);
    let (videos, queue) = flume::bounded(queue_depth);
    let worker_parts = parts.clone();
    let worker = std::thread::Builder::new()
        .name(format!("serve-{name}"))
        .spawn(move || {
            serve_videos(
                &worker_parts,
                &settings,
                (observer, stages),
                (queue, shared),
            )
        })
        .map_err(|error| {
            ServeError::Failed(format!("cannot start the thread of {name}: {error}"))
        })?;
    tracing::info!(
        "serve: {name} loaded (a Wan pipeline: umT5, {} transformer(s), VAE, {} in all, each streamed in turn)",
        1 + usize::from(parts.transformer_2.is_some()),
        stagehand_actors::Bytes(info.model_bytes)
    );
    // Text jobs are refused before they reach this queue (the model makes videos).
    let (jobs, _) = flume::bounded(1);
    let served = ServedModel {
        name: name.clone(),
        info,
        jobs,
        queue_depth,
        max_tokens: 0,
        tokenizer: None,
        chat: None,
        stop_tokens: Vec::new(),
        adapters: Vec::new(),
        series,
        created: super::load::now_seconds(),
        images: None,
        videos: Some(videos),
        residency,
        in_flight: Default::default(),
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
            .map_err(|error| match error {
                PipelineError::BadRequest(message) => RunError::BadInput(message),
                other => RunError::Failed(other.to_string()),
            })
            .and_then(|video| {
                mp4_bytes(&video.frames, job.fps)
                    .map_err(|error| RunError::Failed(error.to_string()))
            });
        let _ = job.reply.send(answer);
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

/// What `/v1/models` and the logs say of a video model: the bytes of its parts.
fn info(parts: &WanParts, settings: &Settings) -> LoadedInfo {
    let models = [
        Some(&parts.text_encoder),
        Some(&parts.transformer),
        parts.transformer_2.as_ref(),
        Some(&parts.vae),
    ];
    LoadedInfo {
        kind: crate::families::WorkloadKind::Diffusion,
        endpoints: crate::families::Endpoints::None,
        budgets: crate::run::Budgets {
            vram_budget_bytes: settings.vram_budget.map_or(0, |size| size.as_u64()),
            pin_ceiling_bytes: settings.pin_ceiling.map_or(0, |size| size.as_u64()),
        },
        model_bytes: models
            .into_iter()
            .flatten()
            .map(crate::pipeline::PipelinePart::bytes)
            .sum(),
    }
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
