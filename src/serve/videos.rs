//! OpenAI's Videos API over a served Wan pipeline: a video is a job, not a request
//! held open. A video takes minutes; no HTTP request should hang that long (clients,
//! proxies and load balancers time out first, and a dropped connection would lose the
//! work), so `POST /v1/videos` answers at once with a video object (`status: "queued"`)
//! and the client polls `GET /v1/videos/{id}` (`queued`, `in_progress` with `progress`
//! 0–100, `completed`, `failed` with `error`) and then downloads
//! `GET /v1/videos/{id}/content` (the MP4). `GET /v1/videos` lists the jobs kept,
//! `DELETE /v1/videos/{id}` cancels one (skipped if queued, stopped at its next step
//! if running) and frees its MP4.
//!
//! An image-to-video model takes the first frame as `input_reference`, OpenAI's file
//! part (see [`super::video_reference`]); the route takes a body that much larger.
//!
//! The jobs live in one bounded table of the server's (see [`super::video_jobs`]);
//! each job waits in its model's bounded queue (429 when full), counts as a request in
//! flight until it finishes (so SIGTERM's drain gives the jobs queued and running
//! `limits.drain_seconds`, then cancels the rest), and its answer is filed by a task
//! of its own.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::run::loaded::{Cancel, CancelOnDrop};
use crate::run::RunError;

use super::errors::ApiError;
use super::handlers::finish;
use super::state::{AppState, Ticket};
use super::video_jobs::{JobError, NewJob, NoContent, VideoJobs};
use super::video_model::VideoJob;
use super::video_reference;
use super::video_request::{asked_video, parse_body};

/// How often the official clients' `poll` asks (`openai-poll-after-ms`).
const POLL_AFTER_MS: &str = "1000";
/// `GET /v1/videos`'s page when the request names none, and the most it may name.
const DEFAULT_PAGE: usize = 20;
const MOST_PAGE: usize = 100;

/// `POST /v1/videos`.
pub(super) async fn create(
    State(app): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok());
    let mut model = None;
    let result = create_job(&app, content_type, body, &mut model).await;
    finish(&app, model.as_deref(), "videos", started, result)
}

async fn create_job(
    app: &Arc<AppState>,
    content_type: Option<&str>,
    body: Result<Bytes, BytesRejection>,
    model_named: &mut Option<String>,
) -> Result<Response, ApiError> {
    let bytes = body.map_err(|rejection| match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => video_reference::body_too_large(&app.limits),
        _ => ApiError::invalid_body(rejection.body_text()),
    })?;
    let body = parse_body(content_type, &bytes, &app.limits)?;
    *model_named = Some(body.model.clone());
    let (model, _) = app.model(&body.model)?;
    let queue = model.video_queue()?;
    queue.check_image(&model.name, body.reference.is_some())?;
    let asked = asked_video(&body, &app.limits)?;
    let ticket = app.admit(&model)?;
    let id = new_id();
    let cancel = Cancel::new();
    let progress = Arc::default();
    let object = jobs(app)
        .insert(NewJob {
            id: id.clone(),
            model: model.name.clone(),
            prompt: body.prompt.clone(),
            size: asked.size,
            seconds: asked.seconds,
            created_at: now_seconds(),
            progress: Arc::clone(&progress),
            cancel: cancel.clone(),
        })
        .map_err(|full| ApiError::video_jobs_full(full.jobs))?;
    let (reply, replied) = flume::bounded(1);
    let submitted = model.submit_video(VideoJob {
        request: asked.request,
        fps: asked.fps,
        progress,
        reply,
        cancel: cancel.clone(),
    });
    if let Err(error) = submitted {
        jobs(app).remove(&id);
        return Err(error);
    }
    let guard = CancelOnDrop::new(cancel);
    tokio::spawn(file_answer(Arc::clone(app), id, replied, (ticket, guard)));
    Ok(with_poll_hint(Json(object).into_response()))
}

/// Waits for a job's answer and files it in the table; the ticket counts the job in
/// flight until then, and the guard cancels it if the server drops this task first.
async fn file_answer(
    app: Arc<AppState>,
    id: String,
    replied: flume::Receiver<Result<Vec<u8>, RunError>>,
    (ticket, mut guard): (Ticket, CancelOnDrop),
) {
    let answer = match replied.recv_async().await {
        Ok(Ok(mp4)) => Ok(Bytes::from(mp4)),
        Ok(Err(error)) => Err(JobError {
            code: if error.is_bad_input() {
                "invalid_request"
            } else {
                "generation_failed"
            },
            message: error.to_string(),
        }),
        Err(_) => Err(JobError {
            code: "model_stopped",
            message: format!(
                "the model `{}` stopped before the video was made",
                ticket.model.name
            ),
        }),
    };
    guard.disarm();
    jobs(&app).finish(&id, answer, now_seconds());
    drop(ticket);
}

/// `GET /v1/videos/{id}`.
pub(super) async fn retrieve(State(app): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match jobs(&app).get(&id) {
        Some(object) => with_poll_hint(Json(object).into_response()),
        None => ApiError::video_not_found(&id).into_response(),
    }
}

/// `GET /v1/videos/{id}/content`: the MP4 of a completed video; 404 for an unknown
/// id, 409 while it is queued or in progress (`video_not_ready`) or when it failed
/// (`video_failed`).
pub(super) async fn content(
    State(app): State<Arc<AppState>>,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Response {
    let variant = match query_fields(query.as_deref(), &["variant"]) {
        Ok(mut fields) => fields.remove("variant"),
        Err(error) => return error.into_response(),
    };
    if let Some(other) = variant.as_deref().filter(|variant| *variant != "video") {
        return ApiError::bad_request(
            "variant",
            format!("variant \"{other}\" is not served (no thumbnail or spritesheet is made); ask for \"video\""),
        )
        .into_response();
    }
    let content = jobs(&app).content(&id);
    match content {
        Ok(mp4) => ([(header::CONTENT_TYPE, "video/mp4")], mp4).into_response(),
        Err(NoContent::Unknown) => ApiError::video_not_found(&id).into_response(),
        Err(NoContent::NotReady(status)) => ApiError::no_video_content(
            "video_not_ready",
            format!(
                "video `{id}` is {status}: poll GET /v1/videos/{id} until its status is completed"
            ),
        )
        .into_response(),
        Err(NoContent::Failed(error)) => ApiError::no_video_content(
            "video_failed",
            format!("video `{id}` failed ({}): {}", error.code, error.message),
        )
        .into_response(),
    }
}

/// `DELETE /v1/videos/{id}`.
pub(super) async fn delete(State(app): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    match jobs(&app).remove(&id) {
        Some(_) => {
            Json(json!({"id": id, "object": "video.deleted", "deleted": true})).into_response()
        }
        None => ApiError::video_not_found(&id).into_response(),
    }
}

/// `GET /v1/videos`: the jobs kept, newest first unless `order=asc`.
pub(super) async fn list(State(app): State<Arc<AppState>>, RawQuery(query): RawQuery) -> Response {
    let mut query = match query_fields(query.as_deref(), &["after", "limit", "order"]) {
        Ok(fields) => fields,
        Err(error) => return error.into_response(),
    };
    let limit = match query.remove("limit").map(|limit| limit.parse::<usize>()) {
        None => DEFAULT_PAGE,
        Some(Ok(limit)) if (1..=MOST_PAGE).contains(&limit) => limit,
        Some(_) => {
            return ApiError::bad_request(
                "limit",
                format!("limit: give a number between 1 and {MOST_PAGE}"),
            )
            .into_response()
        }
    };
    let ascending = match query.remove("order").as_deref() {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return ApiError::bad_request(
                "order",
                format!("order \"{other}\" is not one of asc, desc"),
            )
            .into_response()
        }
    };
    let (data, has_more) = jobs(&app).list(query.remove("after").as_deref(), limit, ascending);
    let first_id = data.first().map(|object| object.id.clone());
    let last_id = data.last().map(|object| object.id.clone());
    let body = json!({"object": "list", "data": data, "first_id": first_id, "last_id": last_id, "has_more": has_more});
    (StatusCode::OK, Json(body)).into_response()
}

/// The `KEY=VALUE` pairs of a query string, each of `known` at most once; another
/// key is a 400 naming it. Values are taken as written (ids, numbers and words need no
/// percent-encoding).
fn query_fields(
    query: Option<&str>,
    known: &[&str],
) -> Result<std::collections::HashMap<String, String>, ApiError> {
    let mut fields = std::collections::HashMap::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if !known.contains(&key) {
            return Err(ApiError::bad_request(
                key,
                format!(
                    "unknown query parameter `{key}`; this endpoint takes {}",
                    known.join(", ")
                ),
            ));
        }
        if fields.insert(key.to_string(), value.to_string()).is_some() {
            return Err(ApiError::bad_request(
                key,
                format!("`{key}` is given twice"),
            ));
        }
    }
    Ok(fields)
}

/// The table, locked for one short, synchronous look (never across an await).
fn jobs(app: &AppState) -> MutexGuard<'_, VideoJobs> {
    app.videos
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Tells the official clients' `poll` how long to wait before asking again.
fn with_poll_hint(mut response: Response) -> Response {
    response.headers_mut().insert(
        "openai-poll-after-ms",
        axum::http::HeaderValue::from_static(POLL_AFTER_MS),
    );
    response
}

/// `video_` and 32 hex digits: a per-process random key hashed with a counter, so ids
/// are unique in the process and not guessable from one another.
fn new_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static KEY: std::sync::OnceLock<RandomState> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(RandomState::new);
    let count = NEXT.fetch_add(1, Ordering::SeqCst);
    let high = key.hash_one((count, "high"));
    let low = key.hash_one((count, "low"));
    format!("video_{high:016x}{low:016x}")
}

fn now_seconds() -> u64 {
    super::load::now_seconds()
}
