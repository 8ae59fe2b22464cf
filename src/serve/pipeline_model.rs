//! Serving a pipeline model (a Flux pipeline makes images, a Wan pipeline videos): the
//! parts its `/v1/models` entry counts, the series and the residency probe it is
//! observed through, and the served model the handlers see — no text side, its own
//! job queue instead. The image model's loading is here; the video model's in
//! `video_model.rs`.

use std::sync::Arc;

use stagehand_actors::SharedBudget;

use crate::families::{Endpoints, WorkloadKind};
use crate::settings;
use crate::telemetry::serving::ServeTelemetry;

use super::config::{ModelConfig, ServeConfig};
use super::load::{now_seconds, observer, Worker};
use super::residency::ResidencyProbe;
use super::state::ServedModel;
use super::ServeError;

/// What `/v1/models` and the logs say of a pipeline model (images or videos): the
/// bytes of its parts, under the settings' budgets.
pub(super) fn pipeline_info<'a>(
    parts: impl IntoIterator<Item = &'a crate::pipeline::PipelinePart>,
    settings: &settings::Settings,
) -> crate::run::loaded::LoadedInfo {
    crate::run::loaded::LoadedInfo {
        kind: WorkloadKind::Diffusion,
        endpoints: Endpoints::None,
        budgets: crate::run::Budgets {
            vram_budget_bytes: settings.vram_budget.map_or(0, |size| size.as_u64()),
            pin_ceiling_bytes: settings.pin_ceiling.map_or(0, |size| size.as_u64()),
        },
        model_bytes: parts
            .into_iter()
            .map(crate::pipeline::PipelinePart::bytes)
            .sum(),
    }
}

/// What a pipeline model (images or videos) is served with: the model as the handlers
/// see it — no text side (text jobs are refused before its queue), neither image nor
/// video queue yet — the run observer (its pipeline series teed into the residency
/// probe, which counts `info.model_bytes`), and the pipeline series its stages report to.
pub(super) struct PipelineServing {
    pub model: ServedModel,
    pub observer: Arc<dyn stagehand_actors::Observer>,
    pub stages: Arc<crate::telemetry::PrometheusObserver>,
}

pub(super) fn pipeline_serving(
    telemetry: &ServeTelemetry,
    name: &str,
    info: crate::run::loaded::LoadedInfo,
    queue_depth: usize,
) -> Result<PipelineServing, ServeError> {
    let series = telemetry
        .model(name)
        .ok_or_else(|| ServeError::Failed(format!("no series for {name}")))?;
    let residency = ResidencyProbe::new();
    residency.set_model_bytes(info.model_bytes);
    let observer = observer(telemetry, name, &residency)?;
    let stages = telemetry
        .observer(name)
        .ok_or_else(|| ServeError::Failed(format!("no pipeline series for {name}")))?;
    let (jobs, _) = flume::bounded(1);
    let model = ServedModel {
        name: name.to_string(),
        info,
        jobs,
        queue_depth,
        max_tokens: 0,
        tokenizer: None,
        chat: None,
        stop_tokens: Vec::new(),
        adapters: Vec::new(),
        series,
        created: now_seconds(),
        images: None,
        videos: None,
        residency,
        in_flight: Default::default(),
    };
    Ok(PipelineServing {
        model,
        observer,
        stages,
    })
}

/// An image model: its pipeline's parts checked, its thread started.
pub(super) fn load_images(
    model: &ModelConfig,
    config: &ServeConfig,
    (settings, shared): (settings::Settings, Option<(SharedBudget, String)>),
    telemetry: &ServeTelemetry,
) -> Result<(ServedModel, Worker), ServeError> {
    let name = &model.name;
    let bad = |problem| ServeError::model_entry(name, problem);
    if !model.lora.is_empty() || !model.adapters.is_empty() {
        return Err(bad(
            "LoRA adapters on an image pipeline are not served yet; remove lora and adapters"
                .into(),
        ));
    }
    let files = model
        .parts
        .as_ref()
        .map(super::config::PartsConfig::files)
        .unwrap_or_default();
    let parts = crate::pipeline::FluxParts::locate(&model.folder, &files)
        .map_err(|error| bad(error.to_string()))?;
    let models = [&parts.clip, &parts.t5, &parts.transformer, &parts.vae];
    let info = pipeline_info(models, &settings);
    let model_bytes = info.model_bytes;
    let queue_depth = model.queue_depth.unwrap_or(config.limits.queue_depth);
    let serving = pipeline_serving(telemetry, name, info, queue_depth)?;
    let (images, queue) = flume::bounded(queue_depth);
    let worker_parts = parts.clone();
    let channels = (serving.observer, serving.stages);
    let worker = std::thread::Builder::new()
        .name(format!("serve-{name}"))
        .spawn(move || {
            super::images::serve_images(worker_parts, settings, channels, (queue, shared))
        })
        .map_err(|error| {
            ServeError::Failed(format!("cannot start the thread of {name}: {error}"))
        })?;
    tracing::info!(
        "serve: {name} loaded (a Flux pipeline: CLIP, T5, transformer, VAE, {} in all, each streamed in turn)",
        stagehand_actors::Bytes(model_bytes)
    );
    let served = ServedModel {
        images: Some(images),
        ..serving.model
    };
    Ok((served, worker))
}
