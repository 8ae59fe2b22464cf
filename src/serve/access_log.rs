//! The access log: one line per request at `info`, as uvicorn and vLLM print —
//! client, method, path, status, the model, its prompt and completion tokens and the
//! milliseconds the whole response took:
//!
//! ```text
//! INFO 127.0.0.1:50412 "POST /v1/completions" 200 model=llama prompt_tokens=5 completion_tokens=16 ms=48.2
//! ```
//!
//! The line is written when the response's body ends (a streamed answer's last event,
//! or the client going away), so a stream's tokens and time are its whole. Handlers
//! put what they know on the response as [`RequestFacts`] (the model, the tokens; a
//! streamed answer's task keeps counting into it after the response left). The probes
//! a load balancer or Prometheus polls every few seconds (`/health`, `/ready`,
//! `/metrics`) log at `debug`, so they do not drown the requests. Turn the lines off
//! with `--log info,stagehand::serve::access_log=warn`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{ConnectInfo, Request};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

/// What the log line says about a request beyond its method, path and status.
#[derive(Debug, Default)]
pub struct RequestFacts {
    model: OnceLock<String>,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
}

impl RequestFacts {
    /// The model the request named (the first one set is kept).
    pub fn set_model(&self, model: &str) {
        let _ = self.model.set(model.to_string());
    }

    pub fn set_tokens(&self, prompt_tokens: usize, completion_tokens: usize) {
        self.prompt_tokens
            .store(prompt_tokens as u64, Ordering::Relaxed);
        self.completion_tokens
            .store(completion_tokens as u64, Ordering::Relaxed);
    }

    /// The facts on `response`, put there if it has none yet.
    pub fn of(response: &mut Response) -> Arc<RequestFacts> {
        let extensions = response.extensions_mut();
        if let Some(facts) = extensions.get::<Arc<RequestFacts>>() {
            return Arc::clone(facts);
        }
        let facts = Arc::new(RequestFacts::default());
        extensions.insert(Arc::clone(&facts));
        facts
    }
}

/// The middleware: times the request and logs its line when the response body ends.
pub async fn log_requests(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let client = request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ConnectInfo(address)| *address);
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let mut response = next.run(request).await;
    let facts = RequestFacts::of(&mut response);
    let line = AccessLine {
        client,
        method,
        path,
        status: response.status(),
        started,
        facts,
    };
    response.map(|body| {
        Body::new(LoggedBody {
            inner: body,
            line: Some(line),
        })
    })
}

/// One request's line, written once.
struct AccessLine {
    client: Option<SocketAddr>,
    method: Method,
    path: String,
    status: StatusCode,
    started: Instant,
    facts: Arc<RequestFacts>,
}

impl AccessLine {
    fn write(self) {
        let text = self.text();
        if matches!(self.path.as_str(), "/health" | "/ready" | "/metrics") {
            tracing::debug!("{text}");
        } else {
            tracing::info!("{text}");
        }
    }

    fn text(&self) -> String {
        let client = self
            .client
            .map_or_else(|| "-".to_string(), |address| address.to_string());
        let model = self.facts.model.get().map_or("-", String::as_str);
        format!(
            "{client} \"{} {}\" {} model={model} prompt_tokens={} completion_tokens={} ms={:.1}",
            self.method,
            self.path,
            self.status.as_u16(),
            self.facts.prompt_tokens.load(Ordering::Relaxed),
            self.facts.completion_tokens.load(Ordering::Relaxed),
            self.started.elapsed().as_secs_f64() * 1e3
        )
    }
}

/// A response body that writes its request's line when it ends or is dropped (the
/// client went away mid-stream).
struct LoggedBody {
    inner: Body,
    line: Option<AccessLine>,
}

impl HttpBody for LoggedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(context);
        if matches!(polled, Poll::Ready(None)) {
            if let Some(line) = this.line.take() {
                line.write();
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for LoggedBody {
    fn drop(&mut self) {
        if let Some(line) = self.line.take() {
            line.write();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_names_the_request_its_model_tokens_and_time() {
        let facts = Arc::new(RequestFacts::default());
        facts.set_model("llama");
        facts.set_model("ignored: the first model named is kept");
        facts.set_tokens(5, 16);
        let line = AccessLine {
            client: Some(SocketAddr::from(([127, 0, 0, 1], 50412))),
            method: Method::POST,
            path: "/v1/completions".to_string(),
            status: StatusCode::OK,
            started: Instant::now(),
            facts,
        };
        let text = line.text();
        assert!(
            text.starts_with(
                "127.0.0.1:50412 \"POST /v1/completions\" 200 model=llama prompt_tokens=5 completion_tokens=16 ms="
            ),
            "{text}"
        );
        let without = AccessLine {
            client: None,
            method: Method::GET,
            path: "/v1/models".to_string(),
            status: StatusCode::NOT_FOUND,
            started: Instant::now(),
            facts: Arc::default(),
        };
        assert!(without.text().starts_with(
            "- \"GET /v1/models\" 404 model=- prompt_tokens=0 completion_tokens=0 ms="
        ));
    }
}
