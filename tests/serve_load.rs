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

#[test]
fn a_client_that_hangs_up_cancels_its_sequence_and_frees_its_place() {
    // Proves a disconnect stops the generation at its next step: the next request,
    // which could only run once that sequence left, is answered, and far fewer than
    // the 4000 tokens asked were generated.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let stream = server.streaming(4000);
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
    let running = server.streaming(4000);
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

#[test]
fn a_bounded_load_of_mixed_requests_gets_no_5xx_and_every_answer_equals_its_single_run() {
    // Proves under 16 concurrent clients (320 requests, embeddings and greedy
    // completions on two models) nothing fails and nothing changes: each answer is
    // the one the same request gets alone. Prints p50/p99 latency (not asserted).
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models_without_eos(dir.path());
    let server = Server::start(&[
        "--model",
        &bert.display().to_string(),
        "--model",
        &llama.display().to_string(),
        "--max-sequences",
        "8",
        "--queue-depth",
        "64",
    ]);
    bounded_load(server, mixed_requests(&["bert"], &["llama"]), "own budgets");
}

#[test]
fn the_same_load_on_two_models_in_one_shared_budget_with_adapters_per_request() {
    // Proves the load above holds when the two models share a budget of about one
    // and a half of them (each request makes one give way to the other) and requests
    // also name each model's adapter (`bert:style`, `llama:style`): no 5xx, and every
    // answer is the one the same request gets alone.
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models_without_eos(dir.path());
    let (bert_lora, llama_lora) = serve_support::adapters(dir.path(), 1);
    let config = serve_support::shared_budget_config_with(
        dir.path(),
        &bert,
        &llama,
        Some((&bert_lora, &llama_lora)),
    );
    let server = Server::start(&["--config", &config.display().to_string()]);
    let requests = mixed_requests(&["bert", "bert:style"], &["llama", "llama:style"]);
    bounded_load(server, requests, "shared budget, adapters");
}

/// Eight requests, embeddings of `embedders` and greedy completions of `decoders` in
/// turn (each list cycled).
fn mixed_requests(embedders: &[&str], decoders: &[&str]) -> Vec<(&'static str, serde_json::Value)> {
    (0..8)
        .map(|index| {
            if index % 2 == 0 {
                let model = embedders[index / 2 % embedders.len()];
                ("/v1/embeddings", json!({"model": model, "input": format!("text number {index}")}))
            } else {
                let model = decoders[index / 2 % decoders.len()];
                let body = json!({"model": model, "prompt": format!("prompt {index}"), "max_tokens": 4 + index, "temperature": 0});
                ("/v1/completions", body)
            }
        })
        .collect()
}

/// Each request once alone, then 16 clients sending 20 each: every answer 200 and
/// equal to its single run (completions exactly; embeddings within 1e-6, the ulps a
/// larger step moves), no request counted failed; p50/p99 printed as `what`.
fn bounded_load(server: Server, requests: Vec<(&'static str, serde_json::Value)>, what: &str) {
    let server = std::sync::Arc::new(server);
    let answer = |reply: &serve_support::Reply| -> serde_json::Value {
        let body = reply.json();
        if body["object"] == "list" {
            body["data"][0]["embedding"].clone()
        } else {
            body["choices"][0]["text"].clone()
        }
    };
    let expected: Vec<serde_json::Value> = requests
        .iter()
        .map(|(path, body)| answer(&server.post(path, body)))
        .collect();
    let requests = std::sync::Arc::new(requests);
    let expected = std::sync::Arc::new(expected);
    let clients: Vec<_> = (0..16)
        .map(|client| {
            let (server, requests, expected) = (server.clone(), requests.clone(), expected.clone());
            std::thread::spawn(move || {
                let mut latencies = Vec::new();
                for round in 0..20 {
                    let pick = (client * 3 + round) % requests.len();
                    let (path, body) = &requests[pick];
                    let started = std::time::Instant::now();
                    let reply = server.post(path, body);
                    latencies.push(started.elapsed().as_secs_f64());
                    assert_eq!(
                        reply.status,
                        200,
                        "client {client} round {round}: {}",
                        reply.text()
                    );
                    let got = answer(&reply);
                    if path.ends_with("completions") {
                        assert_eq!(got, expected[pick], "request {pick} changed under load");
                    } else {
                        let difference = got
                            .as_array()
                            .unwrap()
                            .iter()
                            .zip(expected[pick].as_array().unwrap())
                            .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
                            .fold(0.0, f64::max);
                        assert!(difference <= 1e-6, "request {pick} changed by {difference}");
                    }
                }
                latencies
            })
        })
        .collect();
    let joined: Vec<_> = clients.into_iter().map(|client| client.join()).collect();
    if joined.iter().any(Result::is_err) {
        let stopped = std::sync::Arc::try_unwrap(server).ok().map(Server::stop);
        let log = stopped.map_or(String::new(), |stopped| stopped.stderr);
        panic!("a client failed ({what}); the server said:\n{log}");
    }
    let mut latencies: Vec<f64> = joined.into_iter().flat_map(Result::unwrap).collect();
    latencies.sort_by(f64::total_cmp);
    let at = |quantile: f64| latencies[((latencies.len() - 1) as f64 * quantile) as usize];
    eprintln!(
        "load ({what}): {} requests from 16 clients, p50 {:.1} ms, p99 {:.1} ms",
        latencies.len(),
        at(0.5) * 1e3,
        at(0.99) * 1e3
    );
    let text = server.get("/metrics").text();
    let failed = metric(
        &text,
        "stagehand_serve_requests_total",
        &[("outcome", "failed")],
    );
    assert_eq!(failed, 0.0);
}
