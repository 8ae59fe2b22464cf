//! `stagehand serve`'s access log, read from the real server's stderr: one line per
//! request at `info` with the client, method, path, status, model, prompt and
//! completion tokens and milliseconds (a streamed answer's line counts its whole
//! stream); the probes stay out of it at `info`.
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use serde_json::{json, Value};

use serve_support::{models, Server};

/// The stderr lines that are access-log lines of `method path` answered `status`.
fn lines_of<'a>(stderr: &'a str, method: &str, path: &str, status: u16) -> Vec<&'a str> {
    let request = format!("\"{method} {path}\" {status} ");
    stderr
        .lines()
        .filter(|line| line.contains(" INFO ") && line.contains(&request))
        .collect()
}

fn usage(answer: &Value) -> (u64, u64) {
    let usage = &answer["usage"];
    let count = |name: &str| usage[name].as_u64().unwrap_or(0);
    (count("prompt_tokens"), count("completion_tokens"))
}

#[test]
fn every_request_gets_one_info_line_with_its_model_tokens_and_time() {
    // Proves each request is logged once, after its answer, with what it used.
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let (bert, llama) = (bert.display().to_string(), llama.display().to_string());
    let server = Server::start_exactly(&[
        "--model",
        &bert,
        "--model",
        &llama,
        "--bind",
        "127.0.0.1:0",
        "--log",
        "info",
    ]);
    let whole = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hello", "max_tokens": 6, "temperature": 0}),
    );
    assert_eq!(whole.status, 200, "{}", whole.text());
    let streamed = server.post(
        "/v1/chat/completions",
        &json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 5, "temperature": 0, "stream": true,
                "stream_options": {"include_usage": true}}),
    );
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    let streamed_usage = streamed
        .events()
        .iter()
        .filter_map(|event| serde_json::from_str::<Value>(event).ok())
        .find(|event| event["usage"].is_object())
        .expect("a usage chunk");
    let embedded = server.post(
        "/v1/embeddings",
        &json!({"model": "bert", "input": ["a man is eating food", "hello"]}),
    );
    assert_eq!(embedded.status, 200, "{}", embedded.text());
    let missing = server.post("/v1/completions", &json!({"model": "nope", "prompt": "x"}));
    assert_eq!(missing.status, 404);
    assert_eq!(server.get("/health").status, 200);
    let stopped = server.stop();
    let stderr = stopped.stderr;

    let (prompt, completion) = usage(&whole.json());
    let expected = format!("model=llama prompt_tokens={prompt} completion_tokens={completion} ms=");
    let logged = lines_of(&stderr, "POST", "/v1/completions", 200);
    assert_eq!(logged.len(), 1, "one line per request: {stderr}");
    assert!(
        logged[0].contains(&expected),
        "{} lacks {expected}",
        logged[0]
    );
    assert!(
        logged[0].contains("127.0.0.1:"),
        "the client: {}",
        logged[0]
    );

    let (prompt, completion) = usage(&streamed_usage);
    assert!(completion > 0);
    let expected = format!("model=llama prompt_tokens={prompt} completion_tokens={completion} ms=");
    let logged = lines_of(&stderr, "POST", "/v1/chat/completions", 200);
    assert_eq!(logged.len(), 1, "{stderr}");
    assert!(
        logged[0].contains(&expected),
        "{} lacks {expected}",
        logged[0]
    );

    let (prompt, _) = usage(&embedded.json());
    let expected = format!("model=bert prompt_tokens={prompt} completion_tokens=0 ms=");
    let logged = lines_of(&stderr, "POST", "/v1/embeddings", 200);
    assert_eq!(logged.len(), 1, "{stderr}");
    assert!(
        logged[0].contains(&expected),
        "{} lacks {expected}",
        logged[0]
    );

    let logged = lines_of(&stderr, "POST", "/v1/completions", 404);
    assert_eq!(logged.len(), 1, "{stderr}");
    assert!(logged[0].contains("model=nope"), "{}", logged[0]);
    let milliseconds: f64 = logged[0]
        .rsplit("ms=")
        .next()
        .and_then(|figure| figure.trim().parse().ok())
        .expect("milliseconds");
    assert!(milliseconds >= 0.0);
    assert!(
        lines_of(&stderr, "GET", "/health", 200).is_empty(),
        "the probes log at debug: {stderr}"
    );
}
