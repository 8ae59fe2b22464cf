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

#[test]
fn an_image_pipeline_and_an_embedder_share_one_budget() {
    // Proves an image model inside a shared [budget]: each pipeline stage joins the
    // budget as `flux:STAGE` while it runs (the embedder giving way) and leaves it,
    // both endpoints answer in turn with the same answers, and after SIGTERM both
    // models hold nothing.
    let dir = tempfile::tempdir().unwrap();
    let (bert, _) = models(dir.path());
    let pipeline =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/flux-tiny");
    let text = format!(
        "[budget]\nvram_budget = \"6MiB\"\npin_ceiling = \"64MiB\"\n\n\
         [[models]]\nname = \"bert\"\nfolder = \"{}\"\n\n\
         [[models]]\nname = \"flux\"\nfolder = \"{}\"\n",
        bert.display(),
        pipeline.display()
    );
    let config = dir.path().join("images.toml");
    std::fs::write(&config, text).unwrap();
    let server = Server::start(&["--config", &config.display().to_string()]);
    let embed = || {
        let body = json!({"model": "bert", "input": ["one text"], "encoding_format": "float"});
        let reply = server.post("/v1/embeddings", &body);
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"].clone()
    };
    let image = || {
        let body = json!({
            "model": "flux", "prompt": "a red fox", "size": "48x64",
            "num_inference_steps": 2, "max_sequence_length": 16, "seed": 4
        });
        let reply = server.post("/v1/images/generations", &body);
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"][0]["b64_json"].clone()
    };
    let first_embedding = embed();
    let first_image = image();
    assert_eq!(embed(), first_embedding, "the embedder's answer changed");
    assert_eq!(
        image(),
        first_image,
        "the same image request gave other bytes"
    );
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
    let said = format!("{}\n{}", stopped.stdout.join("\n"), stopped.stderr);
    for model in ["bert", "flux"] {
        assert!(
            said.contains(&format!("{model} stopped; vram 0 B and pinned 0 B")),
            "{said}"
        );
    }
}

/// `stagehand serve --config FILE` with `text` as the file, expected to exit 2 with a
/// line containing `needle`.
fn refused_config(dir: &std::path::Path, text: &str, needle: &str) {
    let path = dir.join("refused.toml");
    std::fs::write(&path, text).unwrap();
    let output = common::process::output_within_deadline(
        common::stagehand()
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .args(["--bind", "127.0.0.1:0", "--log", "warn"]),
    );
    common::assert_bad_input(&output, &[needle]);
}

#[test]
fn a_shared_budget_that_cannot_hold_the_models_is_refused_by_name() {
    // Proves bad shared budgets are one clear line and exit 2, never a panic: a size
    // that does not parse, a model's own budget beside [budget], and floors that do
    // not fit (the first model's lease is given back before the error).
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let models = format!(
        "[[models]]\nname = \"bert\"\nfolder = \"{}\"\n\n[[models]]\nname = \"llama\"\nfolder = \"{}\"\n",
        bert.display(),
        llama.display()
    );
    refused_config(
        dir.path(),
        &format!("[budget]\nvram_budget = \"lots\"\n\n{models}"),
        "budget.vram_budget",
    );
    refused_config(
        dir.path(),
        &format!("[budget]\nvram_budget = \"1GiB\"\n\n{models}\nvram_budget = \"64MiB\"\n"),
        "models.llama: vram_budget and pin_ceiling cannot be set beside a shared [budget]",
    );
    refused_config(
        dir.path(),
        &format!("[budget]\nvram_budget = \"3MiB\"\npin_ceiling = \"3MiB\"\n\n{models}"),
        "the shared budget",
    );
}
