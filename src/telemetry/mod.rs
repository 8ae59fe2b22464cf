//! Observability: every metric declared once ([`catalog`]), the Prometheus adapter of the
//! pipeline's `Observer` port ([`PrometheusObserver`]), the `/metrics` listener
//! ([`install`]), a reader of the text exposition ([`exposition`]) and the PromQL checks the
//! dashboard tests use ([`promql`]), and Chrome traces of runs and simulations
//! ([`trace`], [`TraceObserver`]).
//!
//! ```no_run
//! # fn demo() -> Result<(), stagehand::telemetry::TelemetryError> {
//! use stagehand::actors::{Link, Observer, Owner};
//! let observer = stagehand::telemetry::install("127.0.0.1:9464".parse().expect("address"))?;
//! observer.transfer(Link::DiskToPinned, Owner::Model, 4096, 0.001);
//! # Ok(()) }
//! ```

pub mod catalog;
pub mod exposition;
mod observer;
pub mod pipeline_catalog;
pub mod promql;
mod server;
pub mod serving;
mod serving_catalog;
mod stage_series;
pub mod trace;
mod trace_observer;

use std::net::SocketAddr;

pub use catalog::{describe_all, MetricKind, MetricSpec, CATALOG};
pub use observer::PrometheusObserver;
pub use server::install;
pub use stage_series::{StageFigures, StageObserver};
pub use trace::{Lane, TraceError, TraceRecorder, TraceSlice};
pub use trace_observer::TraceObserver;

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error(
        "cannot serve Prometheus metrics on {addr}: {reason}; \
         choose a free HOST:PORT with --metrics-addr (or STAGEHAND_METRICS_ADDR)"
    )]
    Listen { addr: SocketAddr, reason: String },
    #[error("cannot start the metrics listener's runtime: {0}")]
    Runtime(String),
    #[error("histogram buckets of {metric} were refused: {reason}")]
    Buckets {
        metric: &'static str,
        reason: String,
    },
}
