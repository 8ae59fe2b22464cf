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
    // both endpoints answer in turn with the same answers, the same weights served
    // from ComfyUI's files ([models.parts]) make the same picture, and after SIGTERM
    // every model holds nothing.
    let dir = tempfile::tempdir().unwrap();
    let (bert, _) = models(dir.path());
    let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline");
    let (pipeline, comfy) = (fixtures.join("flux-tiny"), fixtures.join("comfy"));
    // The same weights as ComfyUI's separate files: [models.parts].
    let text = format!(
        "[budget]\nvram_budget = \"6MiB\"\npin_ceiling = \"64MiB\"\n\n\
         [[models]]\nname = \"bert\"\nfolder = \"{}\"\n\n\
         [[models]]\nname = \"flux\"\nfolder = \"{}\"\n\n\
         [[models]]\nname = \"flux-files\"\nfolder = \"{}\"\n\
         [models.parts]\nclip = \"{}\"\nt5 = \"{}\"\nvae = \"{}\"\n\
         clip_tokenizer = \"{}\"\nt5_tokenizer = \"{}\"\n",
        bert.display(),
        pipeline.display(),
        comfy.join("flux1-tiny.safetensors").display(),
        comfy.join("clip_l.safetensors").display(),
        comfy.join("t5xxl.safetensors").display(),
        comfy.join("ae.safetensors").display(),
        pipeline.join("tokenizer").display(),
        pipeline.join("tokenizer_2").display(),
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
    let image_of = |model: &str| {
        let body = json!({
            "model": model, "prompt": "a red fox", "size": "48x64",
            "num_inference_steps": 2, "max_sequence_length": 16, "seed": 4
        });
        let reply = server.post("/v1/images/generations", &body);
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"][0]["b64_json"].clone()
    };
    let image = || image_of("flux");
    let first_embedding = embed();
    let first_image = image();
    assert_eq!(embed(), first_embedding, "the embedder's answer changed");
    assert_eq!(
        image(),
        first_image,
        "the same image request gave other bytes"
    );
    assert_eq!(
        pixels(&image_of("flux-files")),
        pixels(&first_image),
        "ComfyUI's files of the same weights made another picture"
    );
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
    let said = format!("{}\n{}", stopped.stdout.join("\n"), stopped.stderr);
    for model in ["bert", "flux", "flux-files"] {
        assert!(
            said.contains(&format!("{model} stopped; vram 0 B and pinned 0 B")),
            "{said}"
        );
    }
}

/// The RGB bytes of a base64 PNG (its text chunks, which name the model, left out).
fn pixels(b64: &serde_json::Value) -> Vec<u8> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64.as_str().expect("b64_json"))
        .expect("base64");
    let mut reader = png::Decoder::new(std::io::Cursor::new(bytes))
        .read_info()
        .expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("a size")];
    let frame = reader.next_frame(&mut pixels).expect("a frame");
    pixels.truncate(frame.buffer_size());
    pixels
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
