//! The series of `stagehand serve` (requests, queue, batches, tokens; each with a
//! `model` label), on the same recorder as the pipeline's [`PrometheusObserver`], so
//! one `/metrics` page shows both. Every series of every served model is registered
//! at start, so it is exported (at zero) from the first scrape.

use std::sync::{Arc, Mutex, MutexGuard};

use metrics::{Counter, Gauge, Histogram, Key, Label, Recorder};
use metrics_exporter_prometheus::{PrometheusHandle, PrometheusRecorder};

use super::catalog::{self, CATALOG};
use super::observer::PrometheusObserver;
use super::TelemetryError;

/// The endpoints a request is counted under (the `endpoint` label).
pub const SERVE_ENDPOINTS: [&str; 5] = [
    "embeddings",
    "completions",
    "chat_completions",
    "images",
    "videos",
];

/// One model's series.
pub struct ModelSeries {
    /// By endpoint ([`SERVE_ENDPOINTS`] order), then outcome (the catalog's order).
    requests: Vec<Vec<Counter>>,
    durations: Vec<Histogram>,
    pub time_to_first_token: Histogram,
    pub queue_depth: Gauge,
    pub in_flight: Gauge,
    pub batch_size: Histogram,
    pub prompt_tokens: Counter,
    pub generated_tokens: Counter,
    pub adapter_switches: Counter,
    /// One gauge per residency state, in the catalog's order of the `state` label.
    states: Vec<Gauge>,
}

impl ModelSeries {
    /// Counts one answered request of `endpoint` with `outcome`, and its duration.
    pub fn request(&self, endpoint: &str, outcome: &str, seconds: f64) {
        let Some(at) = SERVE_ENDPOINTS.iter().position(|known| *known == endpoint) else {
            return;
        };
        if let Some(counter) = outcome_index(outcome).and_then(|index| self.requests[at].get(index))
        {
            counter.increment(1);
        }
        self.durations[at].record(seconds);
    }

    /// Sets the residency gauge of `state` to 1 and the others to 0.
    pub fn set_state(&self, state: &str) {
        let states = catalog::SERVE_RESIDENCY_STATES.values;
        for (value, gauge) in states.iter().zip(&self.states) {
            gauge.set(if *value == state { 1.0 } else { 0.0 });
        }
    }
}

fn outcomes() -> &'static [&'static str] {
    catalog::find(catalog::SERVE_REQUESTS)
        .and_then(|spec| spec.labels.iter().find(|label| label.name == "outcome"))
        .map_or(&[], |label| label.values)
}

fn outcome_index(outcome: &str) -> Option<usize> {
    outcomes().iter().position(|known| *known == outcome)
}

/// One model's name, serving series and pipeline observer.
type Registered = (String, Arc<ModelSeries>, Arc<PrometheusObserver>);

/// The server's metrics: each model's pipeline observer (its tiers, links and steps
/// labelled by `model`) and its serving series.
pub struct ServeTelemetry {
    /// Each model's series, registered once: a model unloaded and loaded again keeps
    /// counting on the same series.
    models: Mutex<Vec<Registered>>,
    recorder: PrometheusRecorder,
    handle: PrometheusHandle,
}

impl ServeTelemetry {
    /// Registers the catalog and the series of every model in `models`.
    pub fn new(models: &[String]) -> Result<Self, TelemetryError> {
        let recorder: PrometheusRecorder = super::server::builder()?.build_recorder();
        let handle = recorder.handle();
        let telemetry = Self {
            models: Mutex::default(),
            recorder,
            handle,
        };
        for model in models {
            telemetry.add_model(model);
        }
        Ok(telemetry)
    }

    /// Registers the series of `model` (a model loaded while the server runs); a name
    /// already registered keeps its series.
    pub fn add_model(&self, model: &str) {
        let mut models = self.lock();
        if models.iter().any(|(name, _, _)| name == model) {
            return;
        }
        let observer = PrometheusObserver::register_labelled(
            &self.recorder,
            self.handle.clone(),
            None,
            Some(model),
        );
        models.push((
            model.to_string(),
            Arc::new(series(&self.recorder, model)),
            Arc::new(observer),
        ));
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Registered>> {
        self.models
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The series of `model`, if it is served.
    pub fn model(&self, model: &str) -> Option<Arc<ModelSeries>> {
        self.lock()
            .iter()
            .find(|(name, _, _)| name == model)
            .map(|(_, series, _)| Arc::clone(series))
    }

    /// The pipeline observer of `model`, if it is served.
    pub fn observer(&self, model: &str) -> Option<Arc<PrometheusObserver>> {
        self.lock()
            .iter()
            .find(|(name, _, _)| name == model)
            .map(|(_, _, observer)| Arc::clone(observer))
    }

    /// The exposition of every series, as `/metrics` serves it.
    pub fn render(&self) -> String {
        self.handle.render()
    }
}

fn key(name: &'static str, labels: &[(&'static str, String)]) -> Key {
    debug_assert!(
        CATALOG.iter().any(|spec| spec.name == name),
        "{name} is not declared"
    );
    let labels: Vec<Label> = labels
        .iter()
        .map(|(key, value)| Label::new(*key, value.clone()))
        .collect();
    Key::from_parts(name, labels)
}

static METADATA: metrics::Metadata<'static> =
    metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

fn series(recorder: &PrometheusRecorder, model: &str) -> ModelSeries {
    let model_label = ("model", model.to_string());
    let with = |extra: &[(&'static str, &str)]| {
        let mut labels = vec![model_label.clone()];
        labels.extend(extra.iter().map(|(key, value)| (*key, value.to_string())));
        labels
    };
    let counter = |name, labels: Vec<(&'static str, String)>| {
        recorder.register_counter(&key(name, &labels), &METADATA)
    };
    let histogram = |name, labels: Vec<(&'static str, String)>| {
        recorder.register_histogram(&key(name, &labels), &METADATA)
    };
    let gauge = |name, labels: Vec<(&'static str, String)>| {
        recorder.register_gauge(&key(name, &labels), &METADATA)
    };
    ModelSeries {
        requests: SERVE_ENDPOINTS
            .iter()
            .map(|endpoint| {
                outcomes()
                    .iter()
                    .map(|outcome| {
                        counter(
                            catalog::SERVE_REQUESTS,
                            with(&[("endpoint", endpoint), ("outcome", outcome)]),
                        )
                    })
                    .collect()
            })
            .collect(),
        durations: SERVE_ENDPOINTS
            .iter()
            .map(|endpoint| {
                histogram(
                    catalog::SERVE_REQUEST_DURATION,
                    with(&[("endpoint", endpoint)]),
                )
            })
            .collect(),
        time_to_first_token: histogram(catalog::SERVE_TIME_TO_FIRST_TOKEN, with(&[])),
        queue_depth: gauge(catalog::SERVE_QUEUE_DEPTH, with(&[])),
        in_flight: gauge(catalog::SERVE_IN_FLIGHT, with(&[])),
        batch_size: histogram(catalog::SERVE_BATCH_SIZE, with(&[])),
        prompt_tokens: counter(catalog::SERVE_TOKENS, with(&[("kind", "prompt")])),
        generated_tokens: counter(catalog::SERVE_TOKENS, with(&[("kind", "generated")])),
        adapter_switches: counter(catalog::SERVE_ADAPTER_SWITCHES, with(&[])),
        states: catalog::SERVE_RESIDENCY_STATES
            .values
            .iter()
            .map(|state| gauge(catalog::SERVE_RESIDENCY, with(&[("state", state)])))
            .collect(),
    }
}
