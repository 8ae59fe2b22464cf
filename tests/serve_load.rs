//! `stagehand serve` under load and faults: a full queue answers 429 with
//! Retry-After, a request past its timeout is cancelled with 504, and a client that
//! hangs up cancels its sequence (it stops generating and its place goes to the next).
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use std::io::Read;

use serde_json::json;

use serve_support::{metric, models_without_eos, Server};

/// The decoder alone, one sequence at a time, with `extra` flags.
fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    let (_, llama) = models_without_eos(dir);
    let llama = llama.display().to_string();
    let mut args = vec![
        "--model",
        llama.as_str(),
        "--max-sequences",
        "1",
        "--max-tokens",
        "4000",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn generated_tokens(server: &Server) -> f64 {
    let text = server.get("/metrics").text();
    metric(
        &text,
        "stagehand_serve_tokens_total",
        &[("model", "llama"), ("kind", "generated")],
    )
}

/// A streamed generation of `tokens` tokens whose first chunk has arrived.
fn streaming(server: &Server, tokens: u64) -> std::net::TcpStream {
    let body = json!({"model": "llama", "prompt": "hi", "max_tokens": tokens, "stream": true});
    let mut stream = server.send(
        "POST",
        "/v1/completions",
        &[],
        Some(body.to_string().as_bytes()),
    );
    let mut seen = Vec::new();
    let mut buffer = [0u8; 256];
    while !String::from_utf8_lossy(&seen).contains("data: {") {
        let read = stream.read(&mut buffer).expect("the stream answers");
        assert!(
            read > 0,
            "the stream ended early: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buffer[..read]);
    }
    stream
}

#[test]
fn a_client_that_hangs_up_cancels_its_sequence_and_frees_its_place() {
    // Proves a disconnect stops the generation at its next step: the next request,
    // which could only run once that sequence left, is answered, and far fewer than
    // the 4000 tokens asked were generated.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let stream = streaming(&server, 4000);
    drop(stream);
    let next = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi", "max_tokens": 3}),
    );
    assert_eq!(next.status, 200, "{}", next.text());
    let generated = generated_tokens(&server);
    assert!(
        generated < 1000.0,
        "the cancelled sequence went on: {generated} tokens"
    );
    let text = server.get("/metrics").text();
    let cancelled = [("model", "llama"), ("outcome", "cancelled")];
    assert_eq!(
        metric(&text, "stagehand_serve_requests_total", &cancelled),
        1.0
    );
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    // Proves the bound: one sequence running, one request queued, the next refused.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--queue-depth", "1"]);
    let running = streaming(&server, 4000);
    let queued_body = json!({"model": "llama", "prompt": "hi", "max_tokens": 2}).to_string();
    let mut queued = server.send("POST", "/v1/completions", &[], Some(queued_body.as_bytes()));
    serve_support::eventually("the second request is queued", || {
        let text = server.get("/metrics").text();
        metric(
            &text,
            "stagehand_serve_queue_depth_requests",
            &[("model", "llama")],
        ) == 1.0
    });
    let refused = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi"}),
    );
    refused.assert_error(429, "queue");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert_eq!(refused.json()["error"]["code"], "rate_limit_exceeded");
    drop(running);
    let mut answer = Vec::new();
    queued.read_to_end(&mut answer).unwrap();
    let answer = serve_support::Reply::parse(&answer);
    assert_eq!(
        answer.status,
        200,
        "the queued request ran once the first left: {}",
        answer.text()
    );
}

#[test]
fn a_request_past_its_timeout_is_cancelled_with_504() {
    // Proves the timeout answers 504 and stops the sequence (the next one runs).
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--request-timeout", "0.5"]);
    let slow = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi", "max_tokens": 4000}),
    );
    slow.assert_error(504, "did not finish");
    let next = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(next.status, 200, "{}", next.text());
    assert!(generated_tokens(&server) < 1000.0);
}
