//! What the handlers share: the served models (each a job queue into its loaded
//! model's thread, its tokenizer and chat template, its limits and series) and the
//! server's own state (draining, requests in flight, the API key).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::families::Endpoints;
use crate::run::loaded::{Job, LoadedInfo};
use crate::telemetry::serving::{ModelSeries, ServeTelemetry};

use super::admin::Loader;
use super::chat::ChatTemplate;
use super::config::Limits;
use super::errors::ApiError;
use super::residency::ResidencyProbe;

/// One model as the handlers see it.
pub struct ServedModel {
    pub name: String,
    pub info: LoadedInfo,
    pub jobs: flume::Sender<Job>,
    pub queue_depth: usize,
    pub max_tokens: u64,
    pub tokenizer: Option<tokenizers::Tokenizer>,
    /// `None`: the folder has no chat template; chat is refused by name.
    pub chat: Option<ChatTemplate>,
    /// The model's end-of-text ids (`eos_token_id` of `config.json`).
    pub stop_tokens: Vec<u32>,
    /// Adapters a request names as `"model": "NAME:ADAPTER"`, in name order.
    pub adapters: Vec<String>,
    pub series: Arc<ModelSeries>,
    /// Seconds since the epoch when it was loaded (`created` of `/v1/models`).
    pub created: u64,
    /// An image model's queue (its folder a pipeline); its `jobs` then take nothing.
    pub images: Option<flume::Sender<super::images::ImageJob>>,
    /// A video model's queue (its folder a Wan pipeline); its `jobs` then take nothing.
    pub videos: Option<super::video_model::VideoQueue>,
    /// Its plan and occupancy as its session reports them (`GET /residency`).
    pub residency: Arc<ResidencyProbe>,
    /// Requests admitted for it and not yet answered.
    pub in_flight: AtomicUsize,
}

impl ServedModel {
    /// The ids clients may ask for: the model's name, then `NAME:ADAPTER` for each
    /// adapter.
    pub fn ids(&self) -> Vec<String> {
        let adapters = self.adapters.iter().map(|a| format!("{}:{a}", self.name));
        std::iter::once(self.name.clone()).chain(adapters).collect()
    }

    /// Requests waiting in its queue now (text, image or video jobs).
    pub fn queued(&self) -> usize {
        match (&self.images, &self.videos) {
            (Some(images), _) => images.len(),
            (None, Some(videos)) => videos.jobs.len(),
            (None, None) => self.jobs.len(),
        }
    }

    /// Whether it answers `/v1/embeddings` (else completions, or images).
    pub fn serves_embeddings(&self) -> bool {
        self.info.endpoints == Endpoints::Embeddings
    }

    /// A 400 for a text endpoint when this model makes images or videos.
    pub fn refuse_pipelines(&self) -> Result<(), ApiError> {
        if self.images.is_some() {
            return Err(ApiError::bad_request(
                "model",
                format!("`{}` makes images: POST /v1/images/generations", self.name),
            ));
        }
        if self.videos.is_some() {
            return Err(ApiError::bad_request(
                "model",
                format!("`{}` makes videos: POST /v1/videos", self.name),
            ));
        }
        Ok(())
    }

    /// Queues `job`; a full queue is a 429, a stopped model a 503.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        self.refuse_pipelines()?;
        self.offer(&self.jobs, job)
    }

    /// Puts `job` on `queue`: a full queue is a 429, a stopped model a 503.
    fn offer<T>(&self, queue: &flume::Sender<T>, job: T) -> Result<(), ApiError> {
        let outcome = queue.try_send(job);
        self.series.queue_depth.set(queue.len() as f64);
        match outcome {
            Ok(()) => Ok(()),
            Err(flume::TrySendError::Full(_)) => {
                Err(ApiError::queue_full(&self.name, self.queue_depth))
            }
            Err(flume::TrySendError::Disconnected(_)) => Err(ApiError::unavailable(format!(
                "the model `{}` has stopped",
                self.name
            ))),
        }
    }
}

impl ServedModel {
    /// Queues an image job; a model that makes no images is a 400, a full queue a
    /// 429, a stopped model a 503.
    pub fn submit_image(&self, job: super::images::ImageJob) -> Result<(), ApiError> {
        let Some(images) = &self.images else {
            if self.videos.is_some() {
                self.refuse_pipelines()?;
            }
            return Err(ApiError::bad_request(
                "model",
                format!(
                    "`{}` makes no images ({}); name a Flux pipeline model",
                    self.name,
                    self.info.kind.with_article()
                ),
            ));
        };
        self.offer(images, job)
    }

    /// Queues a video job; a model that makes no videos is a 400, a full queue a
    /// 429, a stopped model a 503.
    pub fn submit_video(&self, job: super::video_model::VideoJob) -> Result<(), ApiError> {
        self.offer(&self.video_queue()?.jobs, job)
    }

    /// The video queue; a model that makes no videos is a 400.
    pub fn video_queue(&self) -> Result<&super::video_model::VideoQueue, ApiError> {
        self.videos.as_ref().ok_or_else(|| {
            ApiError::bad_request(
                "model",
                format!(
                    "`{}` makes no videos ({}); name a Wan pipeline model",
                    self.name,
                    self.info.kind.with_article()
                ),
            )
        })
    }
}

/// The server's shared state.
pub struct AppState {
    /// The served models; `/admin/models` adds and removes them while the server runs.
    pub models: RwLock<Vec<Arc<ServedModel>>>,
    /// What loading a model at run time needs, and every model's thread.
    pub loader: Loader,
    pub api_key: Option<String>,
    /// The admin endpoints' key and model roots; `None`: those endpoints are off.
    pub admin: Option<super::access::AdminAccess>,
    pub limits: Limits,
    /// The video jobs (`/v1/videos`), bounded by `limits.max_video_jobs` and
    /// `limits.max_video_bytes`; locked only for a short synchronous look.
    pub videos: std::sync::Mutex<super::video_jobs::VideoJobs>,
    pub telemetry: ServeTelemetry,
    /// Set by SIGTERM: new requests get 503 while in-flight ones finish.
    pub draining: AtomicBool,
    pub in_flight: AtomicUsize,
}

impl AppState {
    /// The models served now.
    pub fn served(&self) -> Vec<Arc<ServedModel>> {
        self.models
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The served model `name` names, with its adapter: `NAME` or `NAME:ADAPTER`.
    pub fn model(&self, name: &str) -> Result<(Arc<ServedModel>, Option<String>), ApiError> {
        let models = self.served();
        let not_found = || {
            let served: Vec<String> = models.iter().flat_map(|m| m.ids()).collect();
            ApiError::model_not_found(name, &served)
        };
        if let Some(model) = models.iter().find(|model| model.name == name) {
            return Ok((Arc::clone(model), None));
        }
        let (base, adapter) = name.rsplit_once(':').ok_or_else(not_found)?;
        models
            .iter()
            .find(|model| model.name == base && model.adapters.iter().any(|a| a == adapter))
            .map(|model| (Arc::clone(model), Some(adapter.to_string())))
            .ok_or_else(not_found)
    }

    /// Admits a request (503 while draining); the ticket counts it in flight.
    pub fn admit(self: &Arc<Self>, model: &Arc<ServedModel>) -> Result<Ticket, ApiError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ApiError::unavailable(
                "the server is shutting down and takes no new requests",
            ));
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        model.in_flight.fetch_add(1, Ordering::SeqCst);
        model.residency.requested();
        model.series.in_flight.increment(1.0);
        Ok(Ticket {
            app: Arc::clone(self),
            model: Arc::clone(model),
        })
    }

    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.limits.request_timeout_seconds)
    }
}

/// A request in flight; dropping it (answered, failed or disconnected) counts it out.
pub struct Ticket {
    app: Arc<AppState>,
    pub model: Arc<ServedModel>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.app.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.model.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.model.series.in_flight.decrement(1.0);
    }
}
