//! Every flag of `stagehand serve --help`, used once: each row starts the command with
//! the flag and checks its effect (a request's answer, a metric, or a bad-input exit
//! with one line naming what was wrong).
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use serde_json::json;

use common::process::output_within_deadline;
use serve_support::{metric, models, Server};

/// `stagehand serve ARGS` that must refuse to start: exit 2, one line, naming `needle`.
fn refused(args: &[&str], needle: &str) {
    let output = output_within_deadline(common::stagehand().arg("serve").args(args));
    common::assert_bad_input(&output, &[needle]);
}

#[test]
fn every_serve_flag_does_what_it_says() {
    // Proves each flag is read and acts: a table of one row per flag.
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let (bert, llama) = (bert.display().to_string(), llama.display().to_string());
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!("[[models]]\nname = \"coder\"\nfolder = \"{llama}\"\n"),
    )
    .unwrap();
    let config = config.display().to_string();
    // --config: the file's model is served under its name.
    let server = Server::start(&["--config", &config]);
    assert_eq!(server.get("/v1/models").json()["data"][0]["id"], "coder");
    drop(server);
    // --model: served under the folder's name.
    let server = Server::start(&["--model", &bert]);
    assert_eq!(server.get("/v1/models").json()["data"][0]["id"], "bert");
    drop(server);
    // --bind: a bad address is refused by name; --log: the level set (info shows the load).
    refused(&["--model", &bert, "--bind", "nowhere"], "is not HOST:PORT");
    let server =
        Server::start_exactly(&["--model", &bert, "--bind", "127.0.0.1:0", "--log", "info"]);
    let stopped = server.stop();
    assert!(
        stopped.stderr.contains("serve: bert loaded"),
        "{}",
        stopped.stderr
    );
    // --api-key: /v1 needs it.
    let server = Server::start(&["--model", &bert, "--api-key", "k"]);
    server.get("/v1/models").assert_error(401, "API key");
    drop(server);
    // --settings: the settings file is read (a missing one is refused by name).
    refused(
        &["--model", &bert, "--settings", "/nonexistent/settings.toml"],
        "settings.toml",
    );
    // --pin-ceiling and --vram-budget: the budgets each model runs under.
    let server = Server::start(&[
        "--model",
        &llama,
        "--pin-ceiling",
        "64MiB",
        "--vram-budget",
        "64MiB",
    ]);
    let text = server.get("/metrics").text();
    let pinned = metric(&text, "stagehand_tier_budget_bytes", &[("tier", "pinned")]);
    let vram = metric(&text, "stagehand_tier_budget_bytes", &[("tier", "vram")]);
    assert_eq!((pinned, vram), (64.0 * 1048576.0, 64.0 * 1048576.0));
    drop(server);
    // --queue-depth, --request-timeout, --drain-seconds, --max-sequences: checked.
    refused(&["--model", &bert, "--queue-depth", "0"], "queue_depth");
    refused(
        &["--model", &bert, "--request-timeout", "0"],
        "request_timeout_seconds",
    );
    refused(&["--model", &bert, "--drain-seconds=-1"], "drain_seconds");
    refused(
        &["--model", &llama, "--max-sequences", "0"],
        "max_sequences",
    );
    // --max-tokens: the largest a request may ask.
    let server = Server::start(&["--model", &llama, "--max-tokens", "2"]);
    let over = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "x", "max_tokens": 3}),
    );
    over.assert_error(400, "max_tokens");
    let default = server.post("/v1/completions", &json!({"model": "llama", "prompt": "x"}));
    assert!(
        default.json()["usage"]["completion_tokens"]
            .as_u64()
            .unwrap()
            <= 2
    );
}

#[test]
fn a_config_key_the_server_does_not_know_is_refused_by_name() {
    // Proves deny_unknown_fields: a typo is an error naming the key, not ignored.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, "bind = \"127.0.0.1:0\"\nqueue_dpeth = 3\n").unwrap();
    refused(&["--config", &config.display().to_string()], "queue_dpeth");
}

#[test]
fn a_configured_lora_adapter_is_applied_as_embed_applies_it() {
    // Proves `lora = [...]` in a model's table attaches the adapter for the model's
    // life: the embedding is `stagehand embed --lora`'s, and not the base model's.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("bert");
    let adapter = dir.path().join("adapter");
    let wrote = output_within_deadline(common::stagehand().args([
        "demo-model",
        "--arch",
        "bert",
        "--out",
        &model.display().to_string(),
        "--lora-out",
        &adapter.display().to_string(),
        "--lora-rank",
        "4",
    ]));
    assert!(
        wrote.status.success(),
        "{}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    let adapter = adapter
        .join("adapter_model.safetensors")
        .display()
        .to_string();
    let config = dir.path().join("serve.toml");
    std::fs::write(
        &config,
        format!(
            "[[models]]\nname = \"tuned\"\nfolder = \"{}\"\nlora = [\"{adapter}:0.8\"]\n\n[[models]]\nname = \"base\"\nfolder = \"{}\"\n",
            model.display(),
            model.display()
        ),
    )
    .unwrap();
    let server = Server::start(&["--config", &config.display().to_string()]);
    let embed = |name: &str| {
        let reply = server.post(
            "/v1/embeddings",
            &json!({"model": name, "input": "hello world"}),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"][0]["embedding"].clone()
    };
    let (tuned, base) = (embed("tuned"), embed("base"));
    assert_ne!(tuned, base, "the adapter changes the embedding");
    let cli = output_within_deadline(common::stagehand().args([
        "embed",
        "--model",
        &model.display().to_string(),
        "--lora",
        &format!("{adapter}:0.8"),
        "hello world",
        "--json",
        "--quiet",
    ]));
    assert!(
        cli.status.success(),
        "{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    let cli: serde_json::Value = serde_json::from_slice(&cli.stdout).unwrap();
    let expected = &cli["texts"][0]["embedding"];
    let difference = tuned
        .as_array()
        .unwrap()
        .iter()
        .zip(expected.as_array().unwrap())
        .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
        .fold(0.0, f64::max);
    // Both take the same path (the run's LoRA machinery); the streamed blocks apply
    // it low-rank, within the LoRA tolerance the run states.
    assert!(difference <= 1e-4, "serve and embed differ by {difference}");
}

#[test]
fn an_adapter_per_request_is_found_relative_to_the_config_and_refused_by_name() {
    // Proves `adapters = { style = FILE }`: `"model": "base:style"` embeds as a model
    // with that adapter as its own `lora` does (both paths relative to the config
    // file), is listed by /v1/models, and a bad name or file stops the start, named.
    let dir = tempfile::tempdir().unwrap();
    let wrote = output_within_deadline(common::stagehand().current_dir(dir.path()).args([
        "demo-model",
        "--arch",
        "bert",
        "--out",
        "bert",
        "--lora-out",
        "adapter",
        "--lora-rank",
        "4",
    ]));
    assert!(
        wrote.status.success(),
        "{}",
        String::from_utf8_lossy(&wrote.stderr)
    );
    let config = dir.path().join("serve.toml");
    let write = |models: &str| std::fs::write(&config, models).unwrap();
    write(
        "[[models]]\nname = \"tuned\"\nfolder = \"bert\"\nlora = [\"adapter/adapter_model.safetensors:0.8\"]\n\n\
         [[models]]\nname = \"base\"\nfolder = \"bert\"\n\
         adapters = { style = \"adapter/adapter_model.safetensors:0.8\" }\n",
    );
    let server = Server::start(&["--config", &config.display().to_string()]);
    let listed = server.get("/v1/models").json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["tuned", "base", "base:style"]);
    let embed = |name: &str| {
        let reply = server.post(
            "/v1/embeddings",
            &json!({"model": name, "input": "hello world"}),
        );
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["model"], name);
        reply.json()["data"][0]["embedding"].clone()
    };
    let (tuned, base, styled) = (embed("tuned"), embed("base"), embed("base:style"));
    assert_ne!(styled, base, "the adapter changes the embedding");
    let difference = styled
        .as_array()
        .unwrap()
        .iter()
        .zip(tuned.as_array().unwrap())
        .map(|(a, b)| (a.as_f64().unwrap() - b.as_f64().unwrap()).abs())
        .fold(0.0, f64::max);
    assert!(
        difference <= 1e-6,
        "base:style and tuned differ by {difference}"
    );
    let unknown = server.post(
        "/v1/embeddings",
        &json!({"model": "base:nope", "input": "x"}),
    );
    assert_eq!(unknown.status, 404, "{}", unknown.text());
    assert!(unknown.text().contains("base:style"), "{}", unknown.text());
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
    let config_arg = config.display().to_string();
    write("[[models]]\nname = \"base\"\nfolder = \"bert\"\nadapters = { \"a:b\" = \"adapter\" }\n");
    refused(&["--config", &config_arg], "\"a:b\" is not an adapter name");
    write("[[models]]\nname = \"base\"\nfolder = \"bert\"\nadapters = { style = \"missing.safetensors\" }\n");
    refused(&["--config", &config_arg], "missing.safetensors");
}

#[test]
fn every_documented_serve_flag_starts_or_is_refused_through_the_binary() {
    // Proves through the CLI table machinery (tests/common/cli.rs) that every flag
    // `serve --help` documents starts the server (it loads its model, then SIGTERM
    // drains it: exit 0) or is refused with exit 2 and one line; none panics.
    use common::cli::{fixtures, row, Expect, Table};
    let fixtures = fixtures();
    let (bert, llama) = (fixtures.bert(), fixtures.llama());
    let config = fixtures.file(
        "serve.toml",
        &format!("bind = \"127.0.0.1:0\"\n[[models]]\nname = \"coder\"\nfolder = \"{llama}\"\n"),
    );
    let settings = fixtures.file("settings.toml", "prefetch_depth = 1\n");
    let missing = fixtures.path("none.toml");
    let loaded = Expect::Runs("loaded");
    let rows = vec![
        row(&[], Expect::Runs("bert loaded")),
        row(&["--model", &llama], Expect::Runs("llama loaded")),
        row(&["--config", &config], Expect::Runs("coder loaded")).bare(),
        row(&["--config", &missing], Expect::Bad("none.toml")).bare(),
        row(&["--model", &missing], Expect::Bad("none.toml")),
        row(&["--bind", "127.0.0.1:0"], Expect::Runs("loaded")),
        row(&["--bind", "nowhere"], Expect::Bad("is not HOST:PORT")),
        row(&["--api-key", "k"], Expect::Runs("loaded")),
        row(&["--settings", &settings], Expect::Runs("loaded")),
        row(&["--settings", &missing], Expect::Bad("none.toml")),
        row(&["--vram-budget", "64MiB"], Expect::Runs("loaded")),
        row(&["--vram-budget", "lots"], Expect::Bad("lots")),
        row(&["--pin-ceiling", "64MiB"], Expect::Runs("loaded")),
        row(&["--queue-depth", "4"], Expect::Runs("loaded")),
        row(&["--queue-depth", "0"], Expect::Bad("queue_depth")),
        row(&["--request-timeout", "10"], Expect::Runs("loaded")),
        row(
            &["--request-timeout", "0"],
            Expect::Bad("request_timeout_seconds"),
        ),
        row(&["--drain-seconds", "1"], Expect::Runs("loaded")),
        row(&["--drain-seconds", "-1"], Expect::Bad("drain_seconds")),
        row(&["--max-tokens", "4"], Expect::Runs("loaded")),
        row(
            &["--model", &llama, "--max-sequences", "2"],
            Expect::Runs("loaded"),
        ),
        row(
            &["--model", &llama, "--max-sequences", "0"],
            Expect::Bad("max_sequences"),
        ),
        row(&["--log", "info"], loaded),
        row(&["--log", "[[["], Expect::Bad("log")),
        row(&["--help"], Expect::Ok("Usage: stagehand serve")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    Table::new("serve", file!())
        .default(&["--model", &bert])
        .default(&["--bind", "127.0.0.1:0"])
        .rows(rows)
        .run();
}
