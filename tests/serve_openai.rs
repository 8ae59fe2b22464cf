//! The official `openai` Python client (PyPI) against a running `stagehand serve` on
//! generated models: models list, embeddings, completions, chat, streaming and error
//! shapes, as `tests/serve_openai.py` checks them; images and videos from the tiny
//! pipelines (`tests/serve_openai_images.py`, `tests/serve_openai_videos.py`).
//!
//! The client comes from `scripts/install-openai.sh` (`.ci/run` runs it and sets
//! `STAGEHAND_OPENAI_PYTHON`, so in CI a missing client fails this test). Locally,
//! without the venv, the test says it is skipped and passes.
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use std::path::PathBuf;

use common::process::output_within_deadline;
use serve_support::{adapters, models, shared_budget_config_with, Server};

/// The python that imports `openai`: `STAGEHAND_OPENAI_PYTHON`, else the venv the
/// install script makes.
fn client_python() -> Option<PathBuf> {
    if let Some(python) = std::env::var_os("STAGEHAND_OPENAI_PYTHON") {
        let python = PathBuf::from(python);
        assert!(
            python.is_file(),
            "STAGEHAND_OPENAI_PYTHON={} is not a file: run scripts/install-openai.sh",
            python.display()
        );
        return Some(python);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/openai-venv/bin/python");
    venv.is_file().then_some(venv)
}

#[test]
fn the_openai_client_gets_models_embeddings_completions_chat_streams_and_errors() {
    // Proves a real client library accepts every answer and error shape the server gives.
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let (bert, llama) = (bert.display().to_string(), llama.display().to_string());
    client_checks(
        &["--model", &bert, "--model", &llama, "--api-key", "test-key"],
        9,
    );
}

#[test]
fn the_openai_client_gets_the_same_from_two_models_sharing_one_budget_and_a_lora_per_request() {
    // Proves issue 24's "done when": the client's embeddings and chat with an embedder
    // and a decoder in one shared budget that holds about one and a half of them, and
    // each model's adapter chosen per request (`"model": "llama:style"`).
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let (bert_lora, llama_lora) = adapters(dir.path(), 1);
    let config =
        shared_budget_config_with(dir.path(), &bert, &llama, Some((&bert_lora, &llama_lora)));
    let config = config.display().to_string();
    client_checks(&["--config", &config, "--api-key", "test-key"], 10);
}

#[test]
fn the_openai_client_generates_images_from_a_served_flux_pipeline() {
    // Proves `images.generate` of the official client against a served pipeline
    // folder: n base64 PNGs of the size asked, the same bytes for the same seed, and
    // the 400s of a url response, a size or n above its limit, a text endpoint.
    let pipeline =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/flux-tiny");
    let pipeline = pipeline.display().to_string();
    client_script_checks(
        "tests/serve_openai_images.py",
        &["--model", &pipeline, "--api-key", "test-key"],
        2,
    );
}

#[test]
fn the_openai_client_makes_videos_from_a_served_wan_pipeline() {
    // Proves `videos.create` (multipart, as the client sends it, with an
    // `input_reference` file for the image-to-video model), `poll`,
    // `create_and_poll`, `download_content`, `list` and `delete` of the official
    // client against a served Wan pipeline folder, and the 400s it raises.
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let pipeline = fixtures.join("wan_pipeline").display().to_string();
    let i2v = fixtures.join("wan_i2v_pipeline").display().to_string();
    client_script_checks(
        "tests/serve_openai_videos.py",
        &[
            "--model",
            &pipeline,
            "--model",
            &i2v,
            "--api-key",
            "test-key",
        ],
        4,
    );
}

/// Runs `tests/serve_openai.py` against `stagehand serve ARGS`; `checks` of them pass.
fn client_checks(args: &[&str], checks: usize) {
    client_script_checks("tests/serve_openai.py", args, checks);
}

/// Runs the client script `script` against `stagehand serve ARGS`; `checks` of its
/// checks pass.
fn client_script_checks(script: &str, args: &[&str], checks: usize) {
    let Some(python) = client_python() else {
        eprintln!(
            "SKIPPED: the openai client is not installed (run scripts/install-openai.sh, or set STAGEHAND_OPENAI_PYTHON); CI sets it and fails without it"
        );
        return;
    };
    let server = Server::start(args);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(script);
    let output = output_within_deadline(
        std::process::Command::new(&python)
            .arg(&script)
            .arg(format!("http://{}", server.addr))
            .arg("test-key"),
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the openai client failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("openai-client: {checks} checks passed")),
        "{stdout}\n{stderr}"
    );
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}
