//! The catalog's entries for `stagehand serve` (listed in [`super::catalog::CATALOG`]
//! with the rest): requests, latencies, queue, batches and tokens, each by `model`.

use super::catalog::{LabelSpec, MetricKind, MetricSpec};

/// `stagehand serve`'s model label: the names of the served config (an open set,
/// but one the operator fixes: a few models per server).
const SERVED_MODEL: LabelSpec = LabelSpec {
    name: "model",
    values: &[],
};
const SERVE_ENDPOINT: LabelSpec = LabelSpec {
    name: "endpoint",
    values: &[
        "embeddings",
        "completions",
        "chat_completions",
        "images",
        "videos",
    ],
};
const SERVE_OUTCOME: LabelSpec = LabelSpec {
    name: "outcome",
    values: &[
        "ok",
        "bad_request",
        "unauthorized",
        "not_found",
        "rejected",
        "unavailable",
        "timeout",
        "cancelled",
        "failed",
    ],
};
/// Where a served model's weights are (`stagehand::serve::ModelState`).
pub const SERVE_RESIDENCY_STATES: LabelSpec = LabelSpec {
    name: "state",
    values: &["resident", "streamed", "cold"],
};
const SERVE_TOKEN_KIND: LabelSpec = LabelSpec {
    name: "kind",
    values: &["prompt", "generated"],
};
/// A served request: a few milliseconds (a small embedding) to minutes (a long generation).
const REQUEST_BUCKETS_SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];
/// Sequences (or texts) computed in one step.
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

pub const SERVE_REQUESTS: &str = "stagehand_serve_requests_total";
pub const SERVE_REQUEST_DURATION: &str = "stagehand_serve_request_duration_seconds";
pub const SERVE_TIME_TO_FIRST_TOKEN: &str = "stagehand_serve_time_to_first_token_seconds";
pub const SERVE_QUEUE_DEPTH: &str = "stagehand_serve_queue_depth_requests";
pub const SERVE_IN_FLIGHT: &str = "stagehand_serve_in_flight_requests";
pub const SERVE_BATCH_SIZE: &str = "stagehand_serve_batch_size_sequences";
pub const SERVE_TOKENS: &str = "stagehand_serve_tokens_total";
pub const SERVE_ADAPTER_SWITCHES: &str = "stagehand_serve_adapter_switches_total";
pub const SERVE_RESIDENCY: &str = "stagehand_serve_residency_models";

pub(super) const REQUESTS: MetricSpec = MetricSpec {
    name: SERVE_REQUESTS,
    kind: MetricKind::Counter,
    unit: "requests",
    labels: &[SERVED_MODEL, SERVE_ENDPOINT, SERVE_OUTCOME],
    description: "`stagehand serve`: requests answered, by model, endpoint and outcome (rejected: the queue was full, 429; unavailable: draining, 503).",
    buckets: &[],
};

pub(super) const REQUEST_DURATION: MetricSpec = MetricSpec {
    name: SERVE_REQUEST_DURATION,
    kind: MetricKind::Histogram,
    unit: "seconds",
    labels: &[SERVED_MODEL, SERVE_ENDPOINT],
    description:
        "`stagehand serve`: time from a request's arrival to its last byte, queueing included.",
    buckets: REQUEST_BUCKETS_SECONDS,
};

pub(super) const TIME_TO_FIRST_TOKEN: MetricSpec = MetricSpec {
    name: SERVE_TIME_TO_FIRST_TOKEN,
    kind: MetricKind::Histogram,
    unit: "seconds",
    labels: &[SERVED_MODEL],
    description: "`stagehand serve`: time from a generation request's arrival to its first token (queueing and prefill).",
    buckets: REQUEST_BUCKETS_SECONDS,
};

pub(super) const QUEUE_DEPTH: MetricSpec = MetricSpec {
    name: SERVE_QUEUE_DEPTH,
    kind: MetricKind::Gauge,
    unit: "requests",
    labels: &[SERVED_MODEL],
    description: "`stagehand serve`: requests waiting in a model's bounded queue; at the configured depth new ones get 429.",
    buckets: &[],
};

pub(super) const IN_FLIGHT: MetricSpec = MetricSpec {
    name: SERVE_IN_FLIGHT,
    kind: MetricKind::Gauge,
    unit: "requests",
    labels: &[SERVED_MODEL],
    description: "`stagehand serve`: requests accepted and not yet answered (queued or computing).",
    buckets: &[],
};

pub(super) const BATCH_SIZE: MetricSpec = MetricSpec {
    name: SERVE_BATCH_SIZE,
    kind: MetricKind::Histogram,
    unit: "sequences",
    labels: &[SERVED_MODEL],
    description:
        "`stagehand serve`: sequences (decoders) or texts (encoders) computed together in one step.",
    buckets: BATCH_BUCKETS,
};

pub(super) const TOKENS: MetricSpec = MetricSpec {
    name: SERVE_TOKENS,
    kind: MetricKind::Counter,
    unit: "tokens",
    labels: &[SERVED_MODEL, SERVE_TOKEN_KIND],
    description:
        "`stagehand serve`: tokens of the prompts read and of the text generated, by model.",
    buckets: &[],
};

pub(super) const ADAPTER_SWITCHES: MetricSpec = MetricSpec {
    name: SERVE_ADAPTER_SWITCHES,
    kind: MetricKind::Counter,
    unit: "switches",
    labels: &[SERVED_MODEL],
    description: "`stagehand serve`: times a model attached another LoRA adapter between steps (requests naming `MODEL:ADAPTER`); each reloads the resident blocks the last one was baked into.",
    buckets: &[],
};

pub(super) const RESIDENCY: MetricSpec = MetricSpec {
    name: SERVE_RESIDENCY,
    kind: MetricKind::Gauge,
    unit: "models",
    labels: &[SERVED_MODEL, SERVE_RESIDENCY_STATES],
    description: "`stagehand serve`: 1 for the state a model is in, 0 for the others (resident: its plan keeps every weight block in VRAM; streamed: some blocks stream in each step; cold: none stays). Summed by state, the models in each; `GET /residency` has the same with the bytes. Set at each scrape.",
    buckets: &[],
};
