//! `stagehand serve` with an embedder and a decoder sharing one `[budget]` that holds
//! about one and a half of them: embeddings and chat answered in turn, each the same
//! after the other model ran (the idle one gave way and came back), the models'
//! series labelled by model, and after SIGTERM each holds vram 0 B and pinned 0 B.
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use serde_json::json;

use serve_support::{models, shared_budget_config, Server};

#[test]
fn an_embedder_and_a_decoder_share_one_budget_in_turn() {
    // Proves the "done when" over HTTP: both endpoints answer with two models
    // in one budget, and switching back and forth changes no answer.
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let config = shared_budget_config(dir.path(), &bert, &llama);
    let server = Server::start(&["--config", &config.display().to_string()]);
    let embed = || {
        let reply = server.post(
            "/v1/embeddings",
            &json!({"model": "bert", "input": ["one text", "another"], "encoding_format": "float"}),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"].clone()
    };
    let chat = || {
        let body = json!({
            "model": "llama",
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 5,
            "temperature": 0
        });
        let reply = server.post("/v1/chat/completions", &body);
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["choices"][0]["message"]["content"].clone()
    };
    let first_embedding = embed();
    let first_chat = chat();
    for _turn in 0..2 {
        assert_eq!(embed(), first_embedding, "the embedder's answer changed");
        assert_eq!(chat(), first_chat, "the decoder's answer changed");
    }
    let metrics = server.get("/metrics").text();
    for model in ["bert", "llama"] {
        assert!(
            metrics.contains(&format!("model=\"{model}\"")),
            "no series for {model}"
        );
    }
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
    let said = format!("{}\n{}", stopped.stdout.join("\n"), stopped.stderr);
    for model in ["bert", "llama"] {
        assert!(
            said.contains(&format!("{model} stopped; vram 0 B and pinned 0 B")),
            "{said}"
        );
    }
}
