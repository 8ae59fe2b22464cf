//! The routes: `/v1/models`, `/v1/embeddings`, the generation endpoints (in
//! [`super::generation`]), images and videos (in `images` and `videos`), loading and unloading models (`/admin/models`, in
//! [`super::admin`]), `/metrics`, `/residency` (in [`super::residency`]), `/health`,
//! `/ready`; the API-key check; the body limit; errors in OpenAI's shape for every failure, 404s included.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::families::EncoderInput;
use crate::run::loaded::{Cancel, CancelOnDrop, EmbedJob, Embedded, Job};
use crate::run::RunError;

use super::access_log::RequestFacts;
use super::errors::ApiError;
use super::openai::{EmbeddingsRequest, TextInput};
use super::state::AppState;

/// Every route of the server over `app`. The admin routes exist only when the
/// config has an `[admin]` table, behind its own key; without it they answer 404
/// saying how to turn them on.
pub fn router(app: Arc<AppState>) -> Router {
    let limit = app.limits.max_body_bytes;
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/completions", post(super::generation::completions))
        .route("/v1/chat/completions", post(super::generation::chat))
        .route("/v1/images/generations", post(super::images::generations))
        .route(
            "/v1/videos",
            post(super::videos::create)
                // Room for the image of an image-to-video request.
                .layer(DefaultBodyLimit::max(super::video_reference::body_limit(
                    &app.limits,
                )))
                .get(super::videos::list),
        )
        .route(
            "/v1/videos/{id}",
            get(super::videos::retrieve).delete(super::videos::delete),
        )
        .route("/v1/videos/{id}/content", get(super::videos::content))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&app), authorize));
    let admin = if app.admin.is_some() {
        Router::new()
            .route("/admin/models", post(super::admin::load_model))
            .route("/admin/models/{name}", delete(super::admin::unload_model))
            .route_layer(middleware::from_fn_with_state(
                Arc::clone(&app),
                authorize_admin,
            ))
    } else {
        Router::new()
            .route("/admin/models", any(admin_off))
            .route("/admin/models/{name}", any(admin_off))
    };
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/residency", get(super::residency::residency))
        .merge(api)
        .merge(admin)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(limit))
        .layer(middleware::from_fn(super::access_log::log_requests))
        .with_state(app)
}

/// The key of `Authorization: Bearer KEY`, if the request has one.
fn bearer(request: &Request) -> Option<&str> {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
}

/// `Authorization: Bearer KEY` when the server has a key (compared in constant time).
async fn authorize(State(app): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &app.api_key {
        let given = bearer(&request).unwrap_or("");
        if !super::access::keys_match(given.as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// `Authorization: Bearer ADMIN_KEY` on the admin routes (never the API key).
async fn authorize_admin(
    State(app): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = app.admin.as_ref().is_some_and(|admin| {
        let given = bearer(&request).unwrap_or("");
        admin.key_matches(given)
    });
    if !allowed {
        return ApiError::unauthorized_admin().into_response();
    }
    next.run(request).await
}

/// The admin routes of a server without an `[admin]` table.
async fn admin_off() -> Response {
    ApiError::admin_off().into_response()
}

async fn not_found(request: Request) -> Response {
    ApiError::not_found(request.uri().path()).into_response()
}

async fn health() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// 200 while every model is loaded and the server takes requests; 503 while draining.
async fn ready(State(app): State<Arc<AppState>>) -> Response {
    let served = app.served();
    let names: Vec<&str> = served.iter().map(|model| model.name.as_str()).collect();
    if app.draining.load(Ordering::SeqCst) {
        let body = json!({"status": "draining", "models": names});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    }
    Json(json!({"status": "ready", "models": names})).into_response()
}

async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    // The gauges a router reads (queue depth, residency state) are set from the
    // models' own figures at each scrape, not only when a request arrives.
    super::residency::report(&app);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.telemetry.render(),
    )
        .into_response()
}

async fn models(State(app): State<Arc<AppState>>) -> Response {
    let data: Vec<serde_json::Value> = app
        .served()
        .iter()
        .flat_map(|model| model.ids().into_iter().map(|id| model_entry(&id, model)))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// One model of `/v1/models`.
pub(super) fn model_entry(id: &str, model: &super::state::ServedModel) -> serde_json::Value {
    json!({"id": id, "object": "model", "created": model.created, "owned_by": "stagehand"})
}

/// The body as `T`, or a 400 (not JSON, a field missing or of the wrong type) or 413.
pub(super) fn parse<T: DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body_bytes(body, limit)?;
    serde_json::from_slice(&bytes).map_err(|error| {
        ApiError::invalid_body(format!("the body is not a valid request: {error}"))
    })
}

/// The body's bytes, or a 413 (above `limit`) or 400.
pub(super) fn body_bytes(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(limit)
        } else {
            ApiError::invalid_body(rejection.body_text())
        }
    })
}

/// Counts a finished request under its model (when it named a served one) and
/// turns the result into the response.
pub(super) fn finish(
    app: &AppState,
    model: Option<&str>,
    endpoint: &str,
    started: Instant,
    result: Result<Response, ApiError>,
) -> Response {
    let outcome = match &result {
        Ok(_) => "ok",
        Err(error) => error.outcome(),
    };
    // `NAME:ADAPTER` counts under the model.
    let series = model.and_then(|name| {
        app.telemetry.model(name).or_else(|| {
            let (base, _) = name.rsplit_once(':')?;
            app.telemetry.model(base)
        })
    });
    if let Some(series) = series {
        series.request(endpoint, outcome, started.elapsed().as_secs_f64());
    }
    let mut response = match result {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    if let Some(model) = model {
        RequestFacts::of(&mut response).set_model(model);
    }
    response
}

/// The `model` field of a JSON body, for counting a request that failed to parse.
pub(super) fn model_field(body: &Result<Bytes, BytesRejection>) -> Option<String> {
    let bytes = body.as_ref().ok()?;
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    value.get("model")?.as_str().map(str::to_string)
}

async fn embeddings(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let model = model_field(&body);
    let result = embed(&app, body).await;
    finish(&app, model.as_deref(), "embeddings", started, result)
}

async fn embed(
    app: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let request: EmbeddingsRequest = parse(body, app.limits.max_body_bytes)?;
    if request
        .dimensions
        .as_ref()
        .is_some_and(|value| !value.is_null())
    {
        return Err(ApiError::bad_request(
            "dimensions",
            "`dimensions` (shortened embeddings) is not supported; leave it out",
        ));
    }
    let base64 = match request.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_request(
                "encoding_format",
                format!("encoding_format \"{other}\" is not one of float, base64"),
            ))
        }
    };
    let (model, adapter) = app.model(&request.model)?;
    model.refuse_pipelines()?;
    if !model.serves_embeddings() {
        return Err(ApiError::bad_request(
            "model",
            format!(
                "`{}` is a decoder: it generates text; POST /v1/completions or /v1/chat/completions",
                model.name
            ),
        ));
    }
    let input = encoder_input(
        request.input,
        app.limits.max_inputs,
        app.limits.max_prompt_tokens,
    )?;
    let _ticket = app.admit(&model)?;
    let cancel = Cancel::new();
    let mut guard = CancelOnDrop::new(cancel.clone());
    let (reply, replied) = flume::bounded(1);
    model.submit(Job::Embed(EmbedJob {
        input,
        adapter,
        reply,
        cancel,
    }))?;
    let embedded = await_answer(app, &model.name, replied, "input").await?;
    guard.disarm();
    model
        .series
        .prompt_tokens
        .increment(embedded.prompt_tokens as u64);
    let mut response = Json(embeddings_body(&request.model, &embedded, base64)).into_response();
    RequestFacts::of(&mut response).set_tokens(embedded.prompt_tokens, 0);
    Ok(response)
}

/// A queued job's one answer: a timeout is a 504, a stopped model a 500, the
/// caller's mistake a 400 naming `param`, no room in the budget now a 503 with
/// `Retry-After` (as a completion's), a failure a 500.
pub(super) async fn await_answer<T>(
    app: &AppState,
    model: &str,
    replied: flume::Receiver<Result<T, RunError>>,
    param: &str,
) -> Result<T, ApiError> {
    match tokio::time::timeout(app.timeout(), replied.recv_async()).await {
        Err(_) => Err(ApiError::timeout(app.limits.request_timeout_seconds)),
        Ok(Err(_)) => Err(ApiError::failed(format!("the model `{model}` stopped"))),
        Ok(Ok(Err(error))) => Err(ApiError::of_run(&error, param)),
        Ok(Ok(Ok(answer))) => Ok(answer),
    }
}

/// The request's input as texts or token-id lists, within the limits.
fn encoder_input(
    input: TextInput,
    max_inputs: usize,
    max_tokens: usize,
) -> Result<EncoderInput, ApiError> {
    let input = match input {
        TextInput::One(text) => EncoderInput::Texts(vec![text]),
        TextInput::Many(texts) => EncoderInput::Texts(texts),
        TextInput::Ids(ids) => EncoderInput::TokenIds(vec![ids]),
        TextInput::ManyIds(ids) => EncoderInput::TokenIds(ids),
    };
    let (count, longest) = match &input {
        EncoderInput::Texts(texts) => (texts.len(), 0),
        EncoderInput::TokenIds(ids) => (ids.len(), ids.iter().map(Vec::len).max().unwrap_or(0)),
    };
    if count == 0 {
        return Err(ApiError::bad_request(
            "input",
            "`input` is empty: give a string or a list of strings",
        ));
    }
    if count > max_inputs {
        return Err(ApiError::bad_request(
            "input",
            format!("{count} inputs in one request; the limit is {max_inputs} (limits.max_inputs)"),
        ));
    }
    if longest > max_tokens {
        return Err(ApiError::bad_request(
            "input",
            format!("an input of {longest} tokens; the limit is {max_tokens} (limits.max_prompt_tokens)"),
        ));
    }
    Ok(input)
}

/// One embedding as the API returns it: its floats (written as f32, shortest form) or
/// their little-endian bytes in base64.
#[derive(serde::Serialize)]
#[serde(untagged)]
enum EmbeddingValues<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(serde::Serialize)]
struct EmbeddingData<'a> {
    object: &'static str,
    index: usize,
    embedding: EmbeddingValues<'a>,
}

#[derive(serde::Serialize)]
struct EmbeddingsBody<'a> {
    object: &'static str,
    data: Vec<EmbeddingData<'a>>,
    model: &'a str,
    usage: serde_json::Value,
}

/// The body; a struct, not a `Value`, so the floats stay f32 (a `Value` widens them).
fn embeddings_body<'a>(model: &'a str, embedded: &'a Embedded, base64: bool) -> EmbeddingsBody<'a> {
    let data: Vec<EmbeddingData<'_>> = embedded
        .embeddings
        .iter()
        .enumerate()
        .map(|(index, values)| EmbeddingData {
            object: "embedding",
            index,
            embedding: if base64 {
                let bytes: Vec<u8> = values
                    .iter()
                    .flat_map(|value| value.to_le_bytes())
                    .collect();
                EmbeddingValues::Base64(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                EmbeddingValues::Float(values)
            },
        })
        .collect();
    EmbeddingsBody {
        object: "list",
        data,
        model,
        usage: json!({"prompt_tokens": embedded.prompt_tokens, "total_tokens": embedded.prompt_tokens}),
    }
}
