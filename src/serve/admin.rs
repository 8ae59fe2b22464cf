//! Loading and unloading models while the server runs, beside the models already
//! serving (issue 24: "a model can be loaded and unloaded while others run"):
//!
//! - `POST /admin/models` with a `[[models]]` table of the config as JSON (`name`,
//!   `folder` — absolute, or relative to the server's working directory, and under
//!   one of `admin.model_roots` once resolved (403 otherwise) — and the same optional
//!   keys, their LoRA files under the roots too) loads it exactly as at start: its
//!   own budgets, or its share of the `[budget]` the others share; 201 with its `/v1/models` entry once it takes
//!   requests, 409 for a name already served, 400 for a config that is wrong.
//! - `DELETE /admin/models/{name}` stops new requests for it at once (404), lets those
//!   in flight finish, then drains its session: 200 once every byte of its budgets is
//!   back, with the VRAM and pinned bytes it still held (0).
//!
//! Both exist only when the config has an `[admin]` table (404 otherwise), sit behind
//! its key (not the API key: see `access`), and run one at a time. A model's
//! Prometheus series stay registered after it is unloaded (counters keep their totals
//! if it comes back).

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use stagehand_actors::SharedBudget;

use super::access::AccessError;
use super::config::{validate_model, ModelConfig, ServeConfig};
use super::errors::ApiError;
use super::handlers::{model_entry, parse};
use super::load::{self, Worker};
use super::state::AppState;
use crate::settings::SettingsArgs;

/// What loading a model at run time needs, and every model's thread.
pub struct Loader {
    pub config: ServeConfig,
    pub settings: SettingsArgs,
    pub shared: Option<SharedBudget>,
    /// Each served model's thread, by name: joined when it is unloaded or the server
    /// stops.
    pub workers: Mutex<Vec<(String, Worker)>>,
    /// One load or unload at a time: a name is checked and taken under it.
    pub busy: tokio::sync::Mutex<()>,
}

impl Loader {
    fn lock_workers(&self) -> std::sync::MutexGuard<'_, Vec<(String, Worker)>> {
        self.workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Every model's thread, taken out to be joined at shutdown.
    pub fn take_workers(&self) -> Vec<(String, Worker)> {
        std::mem::take(&mut *self.lock_workers())
    }
}

pub(super) async fn load_model(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match load(&app, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn load(
    app: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    refuse_while_draining(app)?;
    let model: ModelConfig = parse(body, app.limits.max_body_bytes)?;
    let model = confine(app, model)?;
    let _busy = app.loader.busy.lock().await;
    validate_model(&model).map_err(|message| ApiError::bad_request("folder", message))?;
    app.loader
        .config
        .fits_the_budget(&model)
        .map_err(|message| ApiError::bad_request("vram_budget", message))?;
    if app.served().iter().any(|served| served.name == model.name) {
        return Err(ApiError::conflict(format!(
            "a model named `{}` is already served; unload it first (DELETE /admin/models/{})",
            model.name, model.name
        )));
    }
    app.telemetry.add_model(&model.name);
    let loading = Arc::clone(app);
    let loaded = tokio::task::spawn_blocking(move || {
        let loader = &loading.loader;
        load::load(
            &model,
            &loader.config,
            &loader.settings,
            &loading.telemetry,
            loader.shared.as_ref(),
        )
    })
    .await
    .map_err(|_| ApiError::failed("loading the model panicked"))?;
    let (served, worker) = loaded.map_err(|error| {
        if error.is_bad_input() {
            ApiError::bad_request("folder", error.to_string())
        } else {
            ApiError::failed(error.to_string())
        }
    })?;
    let served = Arc::new(served);
    let entry = model_entry(&served.name, &served);
    app.loader
        .lock_workers()
        .push((served.name.clone(), worker));
    app.models
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(served);
    Ok((StatusCode::CREATED, Json(entry)).into_response())
}

pub(super) async fn unload_model(
    State(app): State<Arc<AppState>>,
    Path(name): Path<String>,
) -> Response {
    match unload(&app, name).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn unload(app: &Arc<AppState>, name: String) -> Result<Response, ApiError> {
    refuse_while_draining(app)?;
    let _busy = app.loader.busy.lock().await;
    let removed = {
        let mut models = app
            .models
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let at = models.iter().position(|model| model.name == name);
        at.map(|at| models.remove(at))
    };
    let Some(removed) = removed else {
        let served: Vec<String> = app.served().iter().flat_map(|m| m.ids()).collect();
        return Err(ApiError::model_not_found(&name, &served));
    };
    // Requests in flight hold the model; its queue closes, and its thread drains
    // its session, once the last of them is answered.
    drop(removed);
    let worker = {
        let mut workers = app.loader.lock_workers();
        let at = workers.iter().position(|(worker, _)| *worker == name);
        at.map(|at| workers.remove(at).1)
    };
    let Some(worker) = worker else {
        return Err(ApiError::failed(format!("the thread of `{name}` is gone")));
    };
    let stats = tokio::task::spawn_blocking(move || load::join(worker))
        .await
        .map_err(|_| ApiError::failed("unloading the model panicked"))?
        .map_err(|error| ApiError::failed(error.to_string()))?;
    tracing::info!(
        "serve: {name} unloaded (VRAM {} and pinned {} still held)",
        stagehand_actors::Bytes(stats.vram.used_bytes),
        stagehand_actors::Bytes(stats.pinned.used_bytes)
    );
    Ok(Json(json!({
        "id": name,
        "object": "model",
        "deleted": true,
        "vram_bytes_after": stats.vram.used_bytes,
        "pinned_bytes_after": stats.pinned.used_bytes,
    }))
    .into_response())
}

/// `model` with its folder and LoRA files under the model roots, by their canonical
/// paths: a path outside is a 403 naming the field, one that does not exist a 400.
fn confine(app: &AppState, model: ModelConfig) -> Result<ModelConfig, ApiError> {
    let Some(admin) = &app.admin else {
        return Err(ApiError::admin_off());
    };
    admin.confine_model(model).map_err(|error| match &error {
        AccessError::OutsideRoots { key, .. } => ApiError::forbidden(key, error.to_string()),
        AccessError::Missing { key, .. } => ApiError::bad_request(key, error.to_string()),
    })
}

fn refuse_while_draining(app: &AppState) -> Result<(), ApiError> {
    if app.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(ApiError::unavailable(
            "the server is shutting down and loads or unloads no model",
        ));
    }
    Ok(())
}
