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
