//! The `/metrics` HTTP listener: metrics-exporter-prometheus's exporter, run on a
//! dedicated thread with its own single-threaded tokio runtime so it works the same
//! whether or not the caller is inside a runtime, and stopped when dropped.

use std::net::SocketAddr;
use std::thread::JoinHandle;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::sync::oneshot;

use super::catalog::CATALOG;
use super::observer::PrometheusObserver;
use super::TelemetryError;

/// The exporter configuration shared by the served and the in-process recorders:
/// every histogram gets its declared buckets, because summaries lose samples in bursts.
pub(super) fn builder() -> Result<PrometheusBuilder, TelemetryError> {
    let mut builder = PrometheusBuilder::new();
    for spec in CATALOG.iter().filter(|spec| !spec.buckets.is_empty()) {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(spec.name.to_string()), spec.buckets)
            .map_err(|error| TelemetryError::Buckets {
                metric: spec.name,
                reason: error.to_string(),
            })?;
    }
    Ok(builder)
}

/// A running `/metrics` listener; dropping it stops the listener and joins its thread.
pub(super) struct MetricsServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // The thread may already have ended (listener error); nothing to tell it then.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("the metrics listener thread panicked while stopping");
            }
        }
    }
}

/// Starts serving Prometheus `/metrics` on `addr` and returns the observer that feeds it.
///
/// The recorder is the observer's own, not the process-global `metrics` one, so tests
/// and several sessions in one process never fight over a global.
pub fn install(addr: SocketAddr) -> Result<PrometheusObserver, TelemetryError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| TelemetryError::Runtime(error.to_string()))?;
    // `build` binds the listener and spawns the upkeep task, so it needs the runtime entered.
    let (recorder, exporter) = {
        let _entered = runtime.enter();
        builder()?
            .with_http_listener(addr)
            .build()
            .map_err(|error| TelemetryError::Listen {
                addr,
                reason: error.to_string(),
            })?
    };
    let handle = recorder.handle();
    let (shutdown, shutdown_received) = oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("stagehand-metrics".to_string())
        .spawn(move || {
            runtime.block_on(async move {
                tokio::select! {
                    outcome = exporter => {
                        if let Err(error) = outcome {
                            tracing::error!(%addr, "metrics listener stopped: {error:?}");
                        }
                    }
                    _ = shutdown_received => {}
                }
            });
        })
        .map_err(|error| TelemetryError::Runtime(error.to_string()))?;
    let server = MetricsServer {
        addr,
        shutdown: Some(shutdown),
        thread: Some(thread),
    };
    // The CLI announces the address to the user; here it is only a debugging aid.
    tracing::debug!(%addr, "metrics listener bound");
    Ok(PrometheusObserver::register(
        &recorder,
        handle,
        Some(server),
    ))
}
