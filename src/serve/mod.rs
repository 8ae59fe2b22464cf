//! `stagehand serve`: models kept loaded behind an OpenAI-compatible HTTP API
//! (DESIGN §8), on axum over tokio. Each model of the config runs on its own thread
//! as a [`crate::run::loaded`] model — opened, budgeted and streamed by the same
//! machinery as `embed` and `generate` — fed by a bounded job queue (429 when full).
//! Handlers tokenize, render chat templates, queue jobs and turn their answers into
//! OpenAI's bodies or server-sent events.
//!
//! Shutdown: the first SIGINT or SIGTERM makes new requests 503 and gives those in
//! flight `limits.drain_seconds` to finish; then the listener closes, the queues close,
//! every model's session drains and releases both budgets, and [`serve`] returns the
//! final counters of each (the command exits 0).

mod access;
mod access_log;
mod admin;
mod chat;
mod config;
mod errors;
mod form;
#[doc(hidden)]
pub mod fuzzing;
mod generation;
mod handlers;
mod images;
mod load;
mod openai;
mod pipeline_model;
mod residency;
mod state;
mod stop_text;
mod streaming;
mod video_jobs;
mod video_model;
mod video_reference;
mod video_request;
mod videos;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use stagehand_actors::StatsSnapshot;

use crate::run::RunError;
use crate::settings::SettingsArgs;
use crate::telemetry::serving::ServeTelemetry;

pub use access::{keys_match, AccessError};
pub use chat::{ChatTemplate, TemplateMessage};
pub use config::{AdminConfig, Limits, ModelConfig, ServeConfig};
pub use errors::ApiError;
pub use residency::{ModelResidency, ModelState, ResidencyReport};

use state::AppState;

/// Why the server could not start (exit 2) or failed (exit 1).
///
/// Match on the kind: [`Run`](Self::Run) (a model could not be opened or its thread
/// failed: the run's own kind inside), [`Model`](Self::Model) (a model of the config
/// could not be loaded: its run's kind inside), [`BadSetting`](Self::BadSetting) (a key of the
/// server's config), [`Bind`](Self::Bind) (the address to listen on);
/// [`BadInput`](Self::BadInput) and [`Failed`](Self::Failed) are anything else, in
/// words. New kinds may be added, so a `match` needs a `_` arm.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A model could not be opened or its run failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// Model `name` of the config could not be opened or loaded: its run's error,
    /// by kind. Bad input (exit 2, an admin load's 400) whatever the kind.
    #[error("models.{name}: {source}")]
    Model {
        name: String,
        #[source]
        source: RunError,
    },
    /// A setting of the server's config is refused: `key` names it (`models.NAME`,
    /// `budget`).
    #[error("{message}")]
    BadSetting { key: String, message: String },
    /// The server could not listen on `addr`.
    #[error("{message}")]
    Bind {
        addr: SocketAddr,
        message: String,
        #[source]
        source: std::io::Error,
    },
    /// Any other input the operator must change, in words.
    #[error("{0}")]
    BadInput(String),
    /// Any other failure, in words.
    #[error("{0}")]
    Failed(String),
}

impl ServeError {
    /// Model `name`'s entry in the config is refused: `problem` says why.
    pub(crate) fn model_entry(name: &str, problem: String) -> Self {
        ServeError::BadSetting {
            key: format!("models.{name}"),
            message: format!("models.{name}: {problem}"),
        }
    }

    /// Model `name` could not be opened or loaded.
    pub(crate) fn model(name: &str, source: RunError) -> Self {
        ServeError::Model {
            name: name.to_string(),
            source,
        }
    }

    /// Setting `key` is refused: `message` says why.
    pub(crate) fn setting(key: &str, message: String) -> Self {
        ServeError::BadSetting {
            key: key.to_string(),
            message,
        }
    }

    /// Whether the operator can fix this by changing the config or flags: the CLI's
    /// exit 2 (else 1).
    pub fn is_bad_input(&self) -> bool {
        match self {
            ServeError::Run(error) => error.is_bad_input(),
            ServeError::Model { .. }
            | ServeError::BadSetting { .. }
            | ServeError::Bind { .. }
            | ServeError::BadInput(_) => true,
            ServeError::Failed(_) => false,
        }
    }
}

/// What [`serve`] runs: the config and the settings flags every model starts from.
pub struct ServeOptions {
    pub config: ServeConfig,
    pub settings: SettingsArgs,
    /// Told the address once the listener is bound (the CLI prints it).
    pub on_listening: Box<dyn FnOnce(SocketAddr) + Send>,
}

/// How a server ended: each model's final counters (every budget given back).
#[derive(Debug, Clone)]
pub struct ServeReport {
    pub models: Vec<(String, StatsSnapshot)>,
    /// Requests still in flight when the drain time ran out (cancelled).
    pub cancelled_in_flight: usize,
}

/// Loads every model, serves until the first SIGINT/SIGTERM, drains, and returns.
pub fn serve(options: ServeOptions) -> Result<ServeReport, ServeError> {
    let config = options.config;
    config.validate().map_err(ServeError::BadInput)?;
    let addr = config.bind_addr().map_err(ServeError::BadInput)?;
    let admin = config
        .admin
        .as_ref()
        .map(access::AdminAccess::new)
        .transpose()
        .map_err(ServeError::BadInput)?;
    let names: Vec<String> = config
        .models
        .iter()
        .map(|model| model.name.clone())
        .collect();
    let telemetry =
        ServeTelemetry::new(&names).map_err(|error| ServeError::Failed(error.to_string()))?;
    let shared = load::shared_budget(&config, &options.settings)?;
    let mut models = Vec::new();
    let mut workers = Vec::new();
    for model in &config.models {
        let loaded = load::load(
            model,
            &config,
            &options.settings,
            &telemetry,
            shared.as_ref(),
        );
        let (served, worker) = match loaded {
            Ok(loaded) => loaded,
            Err(error) => {
                // The models already loaded give their budgets back before the error.
                drop(models);
                for (_, worker) in workers {
                    let _ = load::join(worker);
                }
                return Err(error);
            }
        };
        workers.push((model.name.clone(), worker));
        models.push(Arc::new(served));
    }
    let app = Arc::new(AppState {
        models: models.into(),
        loader: admin::Loader {
            config: config.clone(),
            settings: options.settings.clone(),
            shared,
            workers: workers.into(),
            busy: Default::default(),
        },
        api_key: config.api_key.clone(),
        admin,
        limits: config.limits,
        videos: std::sync::Mutex::new(video_jobs::VideoJobs::new(
            config.limits.max_video_jobs,
            config.limits.max_video_bytes,
        )),
        telemetry,
        draining: Default::default(),
        in_flight: Default::default(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("stagehand-serve")
        .build()
        .map_err(|error| ServeError::Failed(format!("cannot start the HTTP runtime: {error}")))?;
    let served = runtime.block_on(listen(Arc::clone(&app), addr, options.on_listening));
    let cancelled_in_flight = app.in_flight.load(Ordering::SeqCst);
    // The threads of every model served now (loaded at start or since).
    let workers = app.loader.take_workers();
    // Every handler and stream task goes (their guards cancel their jobs); with the
    // last copy of the state the queues close and each model's loop ends.
    drop(app);
    runtime.shutdown_timeout(Duration::from_secs(2));
    let mut report = ServeReport {
        models: Vec::new(),
        cancelled_in_flight,
    };
    for (name, worker) in workers {
        let stats = load::join(worker)?;
        report.models.push((name, stats));
    }
    served?;
    Ok(report)
}

/// Serves `app` on `addr` until a stop request has drained.
async fn listen(
    app: Arc<AppState>,
    addr: SocketAddr,
    on_listening: Box<dyn FnOnce(SocketAddr) + Send>,
) -> Result<(), ServeError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr,
            message: format!(
                "cannot listen on {addr}: {source}; choose a free HOST:PORT with --bind (or bind in the config)"
            ),
            source,
        })?;
    let bound = listener
        .local_addr()
        .map_err(|error| ServeError::Failed(error.to_string()))?;
    on_listening(bound);
    crate::signals::drain_on_first_signal();
    let (drained, drained_seen) = tokio::sync::watch::channel(false);
    let router = handlers::router(Arc::clone(&app));
    let mut shutdown = drained_seen.clone();
    let server = tokio::spawn(
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|done| *done).await;
        })
        .into_future(),
    );
    drain_on_stop(&app).await;
    let _ = drained.send(true);
    // Open connections get a moment to close; then the listener task is dropped.
    match tokio::time::timeout(Duration::from_secs(2), server).await {
        Ok(Ok(Err(error))) => Err(ServeError::Failed(format!(
            "the HTTP server failed: {error}"
        ))),
        _ => Ok(()),
    }
}

/// Waits for the process's stop request, then refuses new requests and waits for
/// those in flight, at most `limits.drain_seconds`.
async fn drain_on_stop(app: &AppState) {
    // Serving, a signal leaves the work's stop flag down (`drain_on_first_signal`):
    // the requests being drained must not be interrupted by it (a block read for its
    // checksum polls it). One that came before, while the models loaded, raised it:
    // it is lowered here for the same reason.
    while crate::signals::received().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    crate::signals::take_stop_request();
    app.draining.store(true, Ordering::SeqCst);
    tracing::info!(
        "stop requested: draining {} request(s) in flight for at most {} s",
        app.in_flight.load(Ordering::SeqCst),
        app.limits.drain_seconds
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(app.limits.drain_seconds);
    while app.in_flight.load(Ordering::SeqCst) > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
