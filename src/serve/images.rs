//! `POST /v1/images/generations`: OpenAI's images API over a served Flux pipeline
//! folder. A model of the config whose folder is a diffusers pipeline
//! (`model_index.json`) is an image model: its own thread takes jobs from a bounded
//! queue (429 when full) and runs [`crate::pipeline::generate`] — CLIP, T5, the
//! transformer, the VAE, each streamed and checked under the model's budgets and
//! every byte given back after it — then answers PNG bytes, base64 in the body.
//! Beside a shared `[budget]` each stage runs as a member of it (`NAME:STAGE`):
//! ranked first while it runs, the idle models giving way, gone when it ends.
//!
//! The body: `prompt`, `n`, `size` (`"WIDTHxHEIGHT"`), `response_format`
//! (`"b64_json"`; `"url"` is refused by name: the server keeps no files); stagehand's
//! documented extensions `seed`, `num_inference_steps`, `guidance_scale`,
//! `max_sequence_length`. Each has a limit (`limits.max_images`,
//! `limits.max_image_pixels`, `limits.max_image_steps`) answered with a 400 naming it.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde::Deserialize;
use serde_json::json;
use stagehand_actors::{SharedBudget, StatsSnapshot};

use crate::pipeline::{generate, FluxParts, ImageRequest, PipelineRun};
use crate::run::loaded::{Cancel, CancelOnDrop};
use crate::run::RunError;
use crate::settings::Settings;

use super::config::Limits;
use super::errors::ApiError;
use super::handlers::{await_answer, finish, model_field, parse};
use super::state::AppState;

/// One image request to an image model's thread.
pub struct ImageJob {
    pub request: ImageRequest,
    /// The PNG files, or why not.
    pub reply: flume::Sender<Result<Vec<Vec<u8>>, RunError>>,
    pub cancel: Cancel,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ImagesRequest {
    model: String,
    prompt: String,
    #[serde(default)]
    n: Option<usize>,
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    response_format: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    num_inference_steps: Option<usize>,
    #[serde(default)]
    guidance_scale: Option<f32>,
    #[serde(default)]
    max_sequence_length: Option<usize>,
    /// Accepted and ignored, as OpenAI's other fields that change nothing here.
    #[serde(default)]
    user: Option<String>,
}

/// FluxPipeline's defaults for what a request leaves out.
const DEFAULT_SIZE: usize = 1024;
const DEFAULT_STEPS: usize = 28;
const DEFAULT_SEQUENCE_LENGTH: usize = 512;

pub(super) async fn generations(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let model = model_field(&body);
    let result = images(&app, body).await;
    finish(&app, model.as_deref(), "images", started, result)
}

async fn images(
    app: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: ImagesRequest = parse(body, app.limits.max_body_bytes)?;
    let _ = &request.user;
    let (model, _) = app.model(&request.model)?;
    let asked = image_request(&request, &app.limits)?;
    let _ticket = app.admit(&model)?;
    let cancel = Cancel::new();
    let mut guard = CancelOnDrop::new(cancel.clone());
    let (reply, replied) = flume::bounded(1);
    model.submit_image(ImageJob {
        request: asked,
        reply,
        cancel,
    })?;
    let files = await_answer(app, &model.name, replied, "prompt").await?;
    guard.disarm();
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let engine = base64::engine::general_purpose::STANDARD;
    let data: Vec<_> = files
        .iter()
        .map(|png| json!({"b64_json": engine.encode(png), "revised_prompt": request.prompt}))
        .collect();
    Ok(Json(json!({"created": created, "data": data})).into_response())
}

/// The request as the pipeline takes it, within the server's limits.
pub(super) fn image_request(
    request: &ImagesRequest,
    limits: &Limits,
) -> Result<ImageRequest, ApiError> {
    match request.response_format.as_deref() {
        None | Some("b64_json") => {}
        Some("url") => {
            return Err(ApiError::bad_request(
                "response_format",
                "response_format \"url\" is not served (the server keeps no files); ask for \"b64_json\"",
            ))
        }
        Some(other) => {
            return Err(ApiError::bad_request(
                "response_format",
                format!("response_format \"{other}\" is not one of b64_json, url"),
            ))
        }
    }
    let count = request.n.unwrap_or(1);
    if count == 0 || count > limits.max_images {
        return Err(ApiError::bad_request(
            "n",
            format!(
                "n = {count}: between 1 and limits.max_images = {}",
                limits.max_images
            ),
        ));
    }
    let (width, height) = match request.size.as_deref() {
        None | Some("auto") => (DEFAULT_SIZE, DEFAULT_SIZE),
        Some(size) => parse_size(size)?,
    };
    if !pixels_within((width, height), limits.max_image_pixels) {
        return Err(ApiError::bad_request(
            "size",
            format!(
                "size {width}x{height} is {} pixels, above limits.max_image_pixels = {}",
                width as u128 * height as u128,
                limits.max_image_pixels
            ),
        ));
    }
    let steps = request.num_inference_steps.unwrap_or(DEFAULT_STEPS);
    if steps == 0 || steps > limits.max_image_steps {
        return Err(ApiError::bad_request(
            "num_inference_steps",
            format!(
                "num_inference_steps = {steps}: between 1 and limits.max_image_steps = {}",
                limits.max_image_steps
            ),
        ));
    }
    let length = request
        .max_sequence_length
        .unwrap_or(DEFAULT_SEQUENCE_LENGTH);
    if length == 0 || length > limits.max_prompt_tokens {
        return Err(ApiError::bad_request(
            "max_sequence_length",
            format!(
                "max_sequence_length = {length}: between 1 and limits.max_prompt_tokens = {}",
                limits.max_prompt_tokens
            ),
        ));
    }
    Ok(ImageRequest {
        prompt: request.prompt.clone(),
        width,
        height,
        steps,
        guidance: request.guidance_scale,
        seed: request.seed.unwrap_or(0),
        count,
        max_sequence_length: length,
        latents: None,
        vae_tile: None,
        init: None,
    })
}

/// `"WIDTHxHEIGHT"`, each a positive multiple of 16.
pub(super) fn parse_size(size: &str) -> Result<(usize, usize), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "size",
            format!("size \"{size}\" is not WIDTHxHEIGHT with both positive multiples of 16 (for example \"1024x1024\")"),
        )
    };
    let (width, height) = size.split_once('x').ok_or_else(bad)?;
    let width: usize = width.trim().parse().map_err(|_| bad())?;
    let height: usize = height.trim().parse().map_err(|_| bad())?;
    if width == 0 || height == 0 || width % 16 != 0 || height % 16 != 0 {
        return Err(bad());
    }
    Ok((width, height))
}

/// Whether a picture of `width` × `height` has at most `most` pixels; a product
/// past `usize` (a size such as `"4294967296x4294967296"`) is above any limit, not
/// wrapped around to a small one.
pub(super) fn pixels_within((width, height): (usize, usize), most: usize) -> bool {
    width
        .checked_mul(height)
        .is_some_and(|pixels| pixels <= most)
}

/// An image model's thread: answers jobs until the queue closes. Each image runs the
/// whole pipeline, every stage's budgets given back at its end, so the thread ends
/// holding nothing.
pub(super) fn serve_images(
    parts: FluxParts,
    settings: Settings,
    (observer, stages): (
        Arc<dyn stagehand_actors::Observer>,
        Arc<crate::telemetry::PrometheusObserver>,
    ),
    (jobs, shared): (flume::Receiver<ImageJob>, Option<(SharedBudget, String)>),
) -> Result<StatsSnapshot, RunError> {
    for job in jobs.iter() {
        if job.cancel.is_cancelled() {
            continue;
        }
        // The job's own flag, as a video's: raised when its request goes away (the
        // client left, or the drain's time ran out), never by the server's first
        // signal, whose drain lets the job finish.
        let run = PipelineRun {
            settings: &settings,
            observer: Arc::clone(&observer),
            progress: Arc::new(|_, _, _| {}),
            stop: job.cancel.flag(),
            shared: shared.clone(),
            stages: Some(Arc::clone(&stages) as Arc<dyn crate::telemetry::StageObserver>),
        };
        let answer = generate(&parts, &job.request, &run)
            .map_err(RunError::from)
            .and_then(|generated| pngs(&job.request, &parts.dir, &generated.pictures));
        let _ = job.reply.send(answer);
        // The job's stages freed all they allocated; the allocator keeps it unless asked.
        crate::os::release_freed_memory();
    }
    Ok(StatsSnapshot::default())
}

/// The pictures as PNG files with the request in their text chunks.
fn pngs(
    request: &ImageRequest,
    model: &std::path::Path,
    pictures: &[crate::pipeline::Picture],
) -> Result<Vec<Vec<u8>>, RunError> {
    (pictures.iter().enumerate())
        .map(|(index, picture)| {
            let text = [
                ("prompt", request.prompt.clone()),
                ("seed", (request.seed + index as u64).to_string()),
                ("steps", request.steps.to_string()),
                ("model", model.display().to_string()),
            ]
            .map(|(keyword, value)| (keyword.to_string(), value));
            picture
                .png_bytes(&text)
                // Encoding pictures in memory fails only where the encoder is wrong.
                .map_err(|error| RunError::Internal {
                    message: error.to_string(),
                    source: Some(Box::new(error)),
                })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_whose_pixels_overflow_is_refused_not_wrapped() {
        // Proves the regression found writing the fuzz target serve_json_bodies: 2^32 x 2^32
        // pixels overflowed usize (a panic with overflow checks, a product of 0 that
        // passed the limit without them); it is above any limit, a 400 naming size.
        let body = br#"{"model":"flux","prompt":"x","size":"4294967296x4294967296"}"#;
        let request: ImagesRequest = serde_json::from_slice(body).expect("a body");
        let error = image_request(&request, &Limits::default()).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("size"));
        assert!(pixels_within((1024, 1024), 1024 * 1024));
        assert!(!pixels_within((usize::MAX, 2), usize::MAX));
    }
}
