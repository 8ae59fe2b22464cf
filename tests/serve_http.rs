//! `stagehand serve` over plain HTTP: each endpoint answers in OpenAI's shape with the
//! model's own results, and each failure is the 4xx/5xx it should be, with OpenAI's
//! error body; the metrics page carries the serve series; SIGTERM drains and exits 0
//! with every budget released.
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use serde_json::{json, Value};

use serve_support::{eventually, metric, models, Server};

fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    let (bert, llama) = models(dir);
    let mut args = vec![
        "--model".to_string(),
        bert.display().to_string(),
        "--model".to_string(),
        llama.display().to_string(),
    ];
    args.extend(extra.iter().map(|arg| arg.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Server::start(&args)
}

fn completion(server: &Server, body: Value) -> Value {
    let reply = server.post("/v1/completions", &body);
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

#[test]
fn models_health_and_ready_answer() {
    // Proves the listing names every served model and the probes answer while serving.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let listed = server.get("/v1/models").json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["bert", "llama"]);
    assert_eq!(listed["object"], "list");
    assert_eq!(server.get("/health").status, 200);
    let ready = server.get("/ready");
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["status"], "ready");
}

#[test]
fn embeddings_of_a_list_equal_each_text_alone_in_float_and_base64() {
    // Proves a batch of texts embeds each text as it embeds alone (padding changes
    // nothing), base64 carries the same f32 bytes, and usage counts the tokens.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let texts = ["a man is eating food", "the cat sits outside", "hello"];
    let batch = server.post("/v1/embeddings", &json!({"model": "bert", "input": texts}));
    assert_eq!(batch.status, 200, "{}", batch.text());
    let batch = batch.json();
    assert!(batch["usage"]["prompt_tokens"].as_u64().unwrap() >= 3 * 3);
    for (index, text) in texts.iter().enumerate() {
        let alone = server
            .post("/v1/embeddings", &json!({"model": "bert", "input": text}))
            .json();
        let together = &batch["data"][index]["embedding"];
        let alone = &alone["data"][0]["embedding"];
        let difference = max_difference(together, alone);
        assert!(
            difference <= 1e-6,
            "text {index}: batched differs from alone by {difference}"
        );
    }
    let encoded = server.post(
        "/v1/embeddings",
        &json!({"model": "bert", "input": texts[0], "encoding_format": "base64"}),
    );
    let encoded = encoded.json()["data"][0]["embedding"]
        .as_str()
        .unwrap()
        .to_string();
    let bytes = base64_decode(&encoded);
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let alone = server
        .post(
            "/v1/embeddings",
            &json!({"model": "bert", "input": texts[0]}),
        )
        .json();
    let expected: Vec<f32> = alone["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(floats, expected);
}

fn max_difference(a: &Value, b: &Value) -> f64 {
    let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
        .fold(0.0, f64::max)
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}

#[test]
fn greedy_completions_repeat_and_stop_where_asked() {
    // Proves greedy decoding is deterministic, max_tokens is honoured with
    // finish_reason "length", and a stop sequence cuts the text before it.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let ask = json!({"model": "llama", "prompt": "hello", "max_tokens": 6, "temperature": 0});
    let first = completion(&server, ask.clone());
    let second = completion(&server, ask);
    let text = first["choices"][0]["text"].as_str().unwrap().to_string();
    assert_eq!(text, second["choices"][0]["text"].as_str().unwrap());
    assert_eq!(first["choices"][0]["finish_reason"], "length");
    assert_eq!(first["usage"]["completion_tokens"], 6);
    assert_eq!(first["object"], "text_completion");
    // Stop at what the model writes after its first token: the text ends before it.
    let long = completion(
        &server,
        json!({"model": "llama", "prompt": "hello", "max_tokens": 12, "temperature": 0}),
    );
    let long_text = long["choices"][0]["text"].as_str().unwrap();
    let cut = long_text
        .char_indices()
        .nth(3)
        .map_or(long_text.len(), |(at, _)| at);
    let stop = &long_text[cut..(cut + 4).min(long_text.len())];
    let stopped = completion(
        &server,
        json!({"model": "llama", "prompt": "hello", "max_tokens": 12, "temperature": 0, "stop": [stop]}),
    );
    let stopped_text = stopped["choices"][0]["text"].as_str().unwrap();
    assert_eq!(stopped["choices"][0]["finish_reason"], "stop");
    assert!(
        !stopped_text.contains(stop),
        "{stopped_text:?} holds {stop:?}"
    );
    assert!(long_text.starts_with(stopped_text));
    // Seeded sampling repeats too.
    let sampled = json!({"model": "llama", "prompt": "hello", "max_tokens": 6, "temperature": 0.9, "seed": 5});
    assert_eq!(
        completion(&server, sampled.clone())["choices"][0]["text"],
        completion(&server, sampled)["choices"][0]["text"]
    );
}

#[test]
fn chat_renders_the_folder_template_and_streams_what_it_answers_whole() {
    // Proves chat is the completion of the template's rendering (token for token), and
    // the streamed answer is the same text, ending with usage and [DONE].
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let messages =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    let chat = server.post(
        "/v1/chat/completions",
        &json!({"model": "llama", "messages": messages, "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(chat.status, 200, "{}", chat.text());
    let chat = chat.json();
    let answer = chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(chat["object"], "chat.completion");
    assert_eq!(chat["choices"][0]["message"]["role"], "assistant");
    let rendered = "<|begin_of_text|><|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n";
    let tokenizer =
        tokenizers::Tokenizer::from_file(dir.path().join("llama/tokenizer.json")).unwrap();
    let ids = tokenizer
        .encode(rendered, false)
        .unwrap()
        .get_ids()
        .to_vec();
    let plain = completion(
        &server,
        json!({"model": "llama", "prompt": ids, "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(plain["choices"][0]["text"].as_str().unwrap(), answer);
    assert_eq!(
        chat["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        ids.len()
    );
    let streamed = server.post(
        "/v1/chat/completions",
        &json!({"model": "llama", "messages": messages, "max_tokens": 5, "temperature": 0,
                "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(streamed.status, 200);
    assert!(streamed
        .header("content-type")
        .unwrap()
        .starts_with("text/event-stream"));
    let events = streamed.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, answer);
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert!(chunks
        .iter()
        .any(|chunk| chunk["choices"][0]["finish_reason"] == "length"));
}

#[test]
fn every_bad_request_gets_its_status_and_an_openai_error() {
    // Proves each refusal is a clear 4xx naming what was wrong, never a 5xx.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--max-tokens", "16"]);
    let post = |path: &str, body: Value| server.post(path, &body);
    post("/v1/embeddings", json!({"model": "nope", "input": "x"})).assert_error(404, "nope");
    let raw = server.request("POST", "/v1/completions", &[], Some(b"{not json"));
    raw.assert_error(400, "not a valid request");
    post("/v1/completions", json!({"prompt": "x"})).assert_error(400, "model");
    post(
        "/v1/completions",
        json!({"model": "llama", "prompt": "x", "n": 2}),
    )
    .assert_error(400, "`n`");
    post(
        "/v1/completions",
        json!({"model": "llama", "prompt": "x", "max_tokens": 17}),
    )
    .assert_error(400, "max_tokens");
    post(
        "/v1/completions",
        json!({"model": "llama", "prompt": "x", "temperature": 3}),
    )
    .assert_error(400, "temperature");
    post(
        "/v1/completions",
        json!({"model": "llama", "prompt": [9999]}),
    )
    .assert_error(400, "vocabulary");
    post("/v1/completions", json!({"model": "bert", "prompt": "x"})).assert_error(400, "encoder");
    post("/v1/embeddings", json!({"model": "llama", "input": "x"})).assert_error(400, "decoder");
    post("/v1/embeddings", json!({"model": "bert", "input": []})).assert_error(400, "empty");
    post(
        "/v1/embeddings",
        json!({"model": "bert", "input": "x", "dimensions": 8}),
    )
    .assert_error(400, "dimensions");
    post(
        "/v1/embeddings",
        json!({"model": "bert", "input": "x", "encoding_format": "hex"}),
    )
    .assert_error(400, "encoding_format");
    server.get("/v1/nothing").assert_error(404, "/v1/nothing");
    let huge = json!({"model": "bert", "input": "x".repeat(3 << 20)});
    post("/v1/embeddings", huge).assert_error(413, "limit");
}

#[test]
fn a_folder_without_a_chat_template_is_served_for_completions_and_refused_chat_by_name() {
    // Proves chat needs the folder's template and says so, while completions work.
    let dir = tempfile::tempdir().unwrap();
    let (_, llama) = models(dir.path());
    std::fs::remove_file(llama.join("tokenizer_config.json")).unwrap();
    let server = Server::start(&["--model", &llama.display().to_string()]);
    let chat = server.post(
        "/v1/chat/completions",
        &json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}),
    );
    chat.assert_error(400, "chat template");
    completion(
        &server,
        json!({"model": "llama", "prompt": "hi", "max_tokens": 2}),
    );
}

#[test]
fn an_api_key_is_required_when_set() {
    // Proves /v1 needs the bearer key (401 without it) while the probes stay open.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--api-key", "sekret"]);
    server.get("/v1/models").assert_error(401, "API key");
    let wrong = server.request(
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer nope")],
        None,
    );
    wrong.assert_error(401, "API key");
    let right = server.request(
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer sekret")],
        None,
    );
    assert_eq!(right.status, 200);
    assert_eq!(server.get("/health").status, 200);
}

#[test]
fn the_metrics_page_carries_the_serve_series_and_passes_promtool() {
    // Proves requests, tokens and batches are counted per model, next to the
    // pipeline's catalog, on an exposition promtool accepts.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    server.post(
        "/v1/embeddings",
        &json!({"model": "bert", "input": ["a", "b"]}),
    );
    completion(
        &server,
        json!({"model": "llama", "prompt": "hi", "max_tokens": 3}),
    );
    server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi", "n": 3}),
    );
    let text = server.get("/metrics").text();
    let ok = [
        ("model", "llama"),
        ("endpoint", "completions"),
        ("outcome", "ok"),
    ];
    assert_eq!(metric(&text, "stagehand_serve_requests_total", &ok), 1.0);
    let bad = [("model", "llama"), ("outcome", "bad_request")];
    assert_eq!(metric(&text, "stagehand_serve_requests_total", &bad), 1.0);
    let generated = [("model", "llama"), ("kind", "generated")];
    assert_eq!(
        metric(&text, "stagehand_serve_tokens_total", &generated),
        3.0
    );
    let batches = [("model", "bert")];
    assert_eq!(
        metric(&text, "stagehand_serve_batch_size_sequences_sum", &batches),
        2.0
    );
    assert!(metric(&text, "stagehand_link_transferred_bytes_total", &[]) > 0.0);
    if let Ok(mut child) = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let output = child.wait_with_output().unwrap();
        let lint = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && lint.trim().is_empty(),
            "promtool: {lint}"
        );
    } else {
        eprintln!("promtool is not installed here: the lint of the page was not run");
    }
}

#[test]
fn sigterm_refuses_new_requests_drains_the_one_in_flight_and_exits_0_with_nothing_held() {
    // Proves the shutdown: 503 for new work, the in-flight stream finishes whole, both
    // budgets of every model back at 0 B, exit status 0.
    let dir = tempfile::tempdir().unwrap();
    let server = start(
        dir.path(),
        &["--max-tokens", "8000", "--max-sequences", "2"],
    );
    let body =
        json!({"model": "llama", "prompt": "hi", "max_tokens": 8000, "stream": true}).to_string();
    let mut stream = server.send("POST", "/v1/completions", &[], Some(body.as_bytes()));
    // Read only the start: the stream stays in flight while its events wait on this
    // socket (the tiny model generates far faster than any request could be timed).
    let mut first = [0u8; 64];
    std::io::Read::read(&mut stream, &mut first).unwrap();
    server.signal(libc::SIGTERM);
    eventually("the server refuses new requests", || {
        server.get("/ready").status == 503
    });
    let refused = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi"}),
    );
    refused.assert_error(503, "shutting down");
    assert!(refused.header("retry-after").is_some());
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut stream, &mut rest).unwrap();
    let whole = String::from_utf8_lossy(&first).to_string() + &String::from_utf8_lossy(&rest);
    // It ends at max_tokens or at the model's end-of-text token: either way, whole.
    let ends = ["\"finish_reason\":\"length\"", "\"finish_reason\":\"stop\""];
    assert!(
        ends.iter().any(|end| whole.contains(end)),
        "finished: {whole}"
    );
    assert!(whole.contains("data: [DONE]"));
    let stopped = server.wait();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
    for model in ["bert", "llama"] {
        let line = format!("{model} stopped; vram 0 B and pinned 0 B still held");
        assert!(
            stopped.stdout.iter().any(|out| out.contains(&line)),
            "{:?}",
            stopped.stdout
        );
    }
}

#[test]
fn the_server_answers_what_generate_and_embed_compute() {
    // Proves serve runs the same machinery as the one-shot commands: a greedy
    // completion is `stagehand generate`'s text for the same ids, an embedding is
    // `stagehand embed`'s (both from --json), on the same folders.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let (bert, llama) = (dir.path().join("bert"), dir.path().join("llama"));
    let ids = [256u32, 104, 105, 32, 116];
    let served = completion(
        &server,
        json!({"model": "llama", "prompt": ids, "max_tokens": 6, "temperature": 0}),
    );
    let generated = common::process::output_within_deadline(common::stagehand().args([
        "generate",
        "--model",
        &llama.display().to_string(),
        "--token-ids",
        "256,104,105,32,116",
        "--max-tokens",
        "6",
        "--json",
        "--quiet",
    ]));
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    let generated: Value = serde_json::from_slice(&generated.stdout).unwrap();
    assert_eq!(served["choices"][0]["text"], generated["text"]);
    let text = "a man is eating food";
    let served = server
        .post("/v1/embeddings", &json!({"model": "bert", "input": text}))
        .json();
    let embedded = common::process::output_within_deadline(common::stagehand().args([
        "embed",
        "--model",
        &bert.display().to_string(),
        text,
        "--json",
        "--quiet",
    ]));
    assert!(
        embedded.status.success(),
        "{}",
        String::from_utf8_lossy(&embedded.stderr)
    );
    let embedded: Value = serde_json::from_slice(&embedded.stdout).unwrap();
    assert_eq!(
        served["data"][0]["embedding"],
        embedded["texts"][0]["embedding"]
    );
}
