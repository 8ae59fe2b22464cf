//! Batching in `stagehand serve`: concurrent generations for one model share each
//! decode step (continuous batching), concurrent embedding requests share a step, and
//! every answer equals the same request run alone (greedy decoding: the same tokens;
//! embeddings: the same values).
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use std::sync::Arc;

use serde_json::{json, Value};

use serve_support::{metric, models_without_eos, Server};

/// `requests` posted to `path` at once, one thread each; the answers in order.
fn concurrently(server: &Arc<Server>, path: &'static str, requests: Vec<Value>) -> Vec<Value> {
    let threads: Vec<_> = requests
        .into_iter()
        .map(|body| {
            let server = Arc::clone(server);
            std::thread::spawn(move || {
                let reply = server.post(path, &body);
                assert_eq!(reply.status, 200, "{}", reply.text());
                reply.json()
            })
        })
        .collect();
    threads
        .into_iter()
        .map(|thread| thread.join().unwrap())
        .collect()
}

/// The mean batch of `model`'s steps so far (sum over count of the histogram).
fn mean_batch(server: &Server, model: &str) -> f64 {
    let text = server.get("/metrics").text();
    let labels = [("model", model)];
    metric(&text, "stagehand_serve_batch_size_sequences_sum", &labels)
        / metric(&text, "stagehand_serve_batch_size_sequences_count", &labels)
}

#[test]
fn concurrent_generations_share_steps_and_each_equals_its_run_alone() {
    // Proves continuous batching: sequences of different prompts and lengths join and
    // leave the batch, steps carry several sequences, and each greedy answer is token
    // for token the answer it gets alone.
    let dir = tempfile::tempdir().unwrap();
    let (_, llama) = models_without_eos(dir.path());
    let server = Arc::new(Server::start(&[
        "--model",
        &llama.display().to_string(),
        "--max-sequences",
        "4",
    ]));
    let prompts = [
        "hello",
        "the cat",
        "a b c d e f",
        "weights stream from disk",
    ];
    let requests: Vec<Value> = prompts
        .iter()
        .enumerate()
        .map(|(index, prompt)| {
            json!({"model": "llama", "prompt": prompt, "max_tokens": 12 + 4 * index, "temperature": 0})
        })
        .collect();
    let alone: Vec<Value> = requests
        .iter()
        .map(|body| server.post("/v1/completions", body).json())
        .collect();
    assert_eq!(
        mean_batch(&server, "llama"),
        1.0,
        "alone, every step holds one sequence"
    );
    let together = concurrently(&server, "/v1/completions", requests);
    for (index, (alone, together)) in alone.iter().zip(&together).enumerate() {
        assert_eq!(
            together["choices"][0]["text"], alone["choices"][0]["text"],
            "prompt {index}: batched differs from alone"
        );
        assert_eq!(together["usage"], alone["usage"]);
    }
    assert!(
        mean_batch(&server, "llama") > 1.0,
        "some steps carried several sequences"
    );
}

#[test]
fn concurrent_embedding_requests_share_a_step_and_each_equals_its_run_alone() {
    // Proves requests queued together are embedded in one step, each answer the same.
    let dir = tempfile::tempdir().unwrap();
    let (bert, _) = models_without_eos(dir.path());
    let server = Arc::new(Server::start(&["--model", &bert.display().to_string()]));
    let texts = [
        "a man is eating food",
        "the cat sits outside",
        "hello world",
        "two men pushed carts",
    ];
    let requests: Vec<Value> = (0..16)
        .map(|index| json!({"model": "bert", "input": texts[index % texts.len()]}))
        .collect();
    let alone: Vec<Value> = requests
        .iter()
        .map(|body| server.post("/v1/embeddings", body).json())
        .collect();
    assert_eq!(mean_batch(&server, "bert"), 1.0);
    let together = concurrently(&server, "/v1/embeddings", requests);
    for (index, (alone, together)) in alone.iter().zip(&together).enumerate() {
        let (a, b) = (
            &alone["data"][0]["embedding"],
            &together["data"][0]["embedding"],
        );
        let difference = a
            .as_array()
            .unwrap()
            .iter()
            .zip(b.as_array().unwrap())
            .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
            .fold(0.0, f64::max);
        // Not bit for bit: the GEMM blocks its rows by the batch's row count, so a
        // value can move by an ulp or so (1e-6 bounds it for unit-norm embeddings).
        assert!(
            difference <= 1e-6,
            "request {index}: batched differs by {difference}"
        );
    }
    assert!(
        mean_batch(&server, "bert") > 1.0,
        "some steps carried several requests"
    );
}
