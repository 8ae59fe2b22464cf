//! Models loaded and unloaded while `stagehand serve` runs (`POST /admin/models`,
//! `DELETE /admin/models/{name}`), beside a model that keeps serving, inside one
//! shared `[budget]`: the new model answers chat, an unloaded one gives every byte of
//! its budgets back and is gone from `/v1/models`, loading it again gives the same
//! answer, and what is wrong (a name served twice, an unknown name, a folder that is
//! not one, a budget beside the shared one, no key or the API key) is refused with
//! its status. The endpoints exist only with an `[admin]` table, and load only from
//! under its `model_roots` (each way out refused).
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use serde_json::{json, Value};

use serve_support::{models, Server};

/// A config serving only `bert`, in a shared budget sized for both models, with an API
/// key and an `[admin]` table whose one model root is `root`.
fn bert_only_config(
    dir: &std::path::Path,
    bert: &std::path::Path,
    root: &std::path::Path,
) -> std::path::PathBuf {
    let path = dir.join("serve.toml");
    let text = format!(
        "api_key = \"k\"\n\n[admin]\nkey = \"admin-k\"\nmodel_roots = [\"{}\"]\n\n\
         [budget]\nvram_budget = \"64MiB\"\npin_ceiling = \"64MiB\"\n\n\
         [[models]]\nname = \"bert\"\nfolder = \"{}\"\n",
        root.display(),
        bert.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

const KEY: [(&str, &str); 1] = [("Authorization", "Bearer k")];
const ADMIN_KEY: [(&str, &str); 1] = [("Authorization", "Bearer admin-k")];

/// A request with the key its route takes: the admin key on `/admin`, else the API key.
fn call(server: &Server, method: &str, path: &str, body: Option<&Value>) -> serve_support::Reply {
    let bytes = body.map(|body| body.to_string().into_bytes());
    let key = if path.starts_with("/admin") {
        &ADMIN_KEY
    } else {
        &KEY
    };
    server.request(method, path, key, bytes.as_deref())
}

fn served(server: &Server) -> Vec<String> {
    let reply = call(server, "GET", "/v1/models", None);
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap().to_string())
        .collect()
}

fn chat(server: &Server) -> serve_support::Reply {
    let body = json!({
        "model": "llama",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 5,
        "temperature": 0
    });
    call(server, "POST", "/v1/chat/completions", Some(&body))
}

#[test]
fn a_decoder_loads_answers_and_unloads_beside_a_serving_encoder() {
    // Proves the load/unload cycle over HTTP, twice, with the encoder answering the
    // same embeddings throughout, and each unload handing back every byte.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("models");
    let (bert, llama) = models(&root);
    let config = bert_only_config(dir.path(), &bert, &root);
    let server = Server::start(&["--config", &config.display().to_string()]);
    let embed = || {
        let body = json!({"model": "bert", "input": "one text"});
        let reply = call(&server, "POST", "/v1/embeddings", Some(&body));
        assert_eq!(reply.status, 200, "{}", reply.text());
        reply.json()["data"].clone()
    };
    let embedded = embed();
    assert_eq!(served(&server), ["bert"]);
    assert_eq!(chat(&server).status, 404, "not served yet");
    let load = json!({"name": "llama", "folder": llama.display().to_string(), "max_sequences": 4});
    let mut answers = Vec::new();
    for round in 0..2 {
        let reply = call(&server, "POST", "/admin/models", Some(&load));
        assert_eq!(reply.status, 201, "round {round}: {}", reply.text());
        assert_eq!(reply.json()["id"], "llama");
        assert_eq!(served(&server), ["bert", "llama"]);
        let answer = chat(&server);
        assert_eq!(answer.status, 200, "{}", answer.text());
        answers.push(answer.json()["choices"][0]["message"]["content"].clone());
        assert_eq!(embed(), embedded, "the encoder's answer changed");
        let reply = call(&server, "DELETE", "/admin/models/llama", None);
        assert_eq!(reply.status, 200, "{}", reply.text());
        let unloaded = reply.json();
        assert_eq!(unloaded["deleted"], true);
        assert_eq!(unloaded["vram_bytes_after"], 0, "VRAM given back");
        assert_eq!(unloaded["pinned_bytes_after"], 0, "pinned RAM given back");
        assert_eq!(served(&server), ["bert"]);
        chat(&server).assert_error(404, "llama");
    }
    assert_eq!(
        answers[0], answers[1],
        "the reloaded model answers the same"
    );
    let metrics = call(&server, "GET", "/metrics", None).text();
    assert!(
        metrics.contains("model=\"llama\""),
        "the loaded model's series"
    );
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}

#[test]
fn wrong_loads_and_unloads_are_refused_with_their_status() {
    // Proves each refusal names what was wrong: no key or the API key 401, a served
    // name 409, an
    // unknown name 404, a folder that is not one 400, unknown keys 400, and a model's
    // own budget beside the shared one 400 — and none changes what is served.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("models");
    let (bert, llama) = models(&root);
    let config = bert_only_config(dir.path(), &bert, &root);
    let server = Server::start(&["--config", &config.display().to_string()]);
    let body = |value: Value| value.to_string().into_bytes();
    let without_key = server.request(
        "POST",
        "/admin/models",
        &[],
        Some(&body(
            json!({"name": "llama", "folder": llama.display().to_string()}),
        )),
    );
    assert_eq!(without_key.status, 401, "{}", without_key.text());
    let with_the_api_key = server.request(
        "POST",
        "/admin/models",
        &KEY,
        Some(&body(
            json!({"name": "llama", "folder": llama.display().to_string()}),
        )),
    );
    with_the_api_key.assert_error(401, "admin key");
    let cases = [
        (
            json!({"name": "bert", "folder": bert.display().to_string()}),
            409,
            "already served",
        ),
        (
            json!({"name": "x", "folder": root.join("no-such-folder").display().to_string()}),
            400,
            "is not a folder",
        ),
        (
            json!({"name": "x", "folder": llama.display().to_string(), "colour": 1}),
            400,
            "colour",
        ),
        (
            json!({"name": "x", "folder": llama.display().to_string(), "vram_budget": "1GiB"}),
            400,
            "shared [budget]",
        ),
    ];
    for (request, status, needle) in cases {
        let reply = call(&server, "POST", "/admin/models", Some(&request));
        reply.assert_error(status, needle);
    }
    call(&server, "DELETE", "/admin/models/nothing", None).assert_error(404, "nothing");
    assert_eq!(served(&server), ["bert"]);
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}

#[test]
fn admin_endpoints_are_off_without_an_admin_table() {
    // Proves a server whose config has no [admin] table loads nothing, whatever key
    // the client holds: the routes answer 404 saying how to turn them on.
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = models(dir.path());
    let path = dir.path().join("serve.toml");
    let text = format!(
        "api_key = \"k\"\n\n[[models]]\nname = \"bert\"\nfolder = \"{}\"\n",
        bert.display()
    );
    std::fs::write(&path, text).unwrap();
    let server = Server::start(&["--config", &path.display().to_string()]);
    let load = json!({"name": "llama", "folder": llama.display().to_string()}).to_string();
    for key in [&KEY, &ADMIN_KEY] {
        let reply = server.request("POST", "/admin/models", key, Some(load.as_bytes()));
        reply.assert_error(404, "admin endpoints are off");
        let reply = server.request("DELETE", "/admin/models/bert", key, None);
        reply.assert_error(404, "admin endpoints are off");
    }
    assert_eq!(served(&server), ["bert"]);
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}

#[test]
fn loads_that_lead_out_of_the_model_roots_are_refused() {
    // Proves each way out of the roots is a 403 naming the field, over HTTP against
    // a real server, with valid model folders outside (so the refusal is the roots'):
    // `..` out of a root, a symlink inside a root to a folder outside, an absolute
    // folder outside, and a LoRA file from outside for a model inside.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("models");
    let (bert, _) = models(&root);
    let (_, outside_llama) = models(&dir.path().join("outside"));
    let config = bert_only_config(dir.path(), &bert, &root);
    let dot_dot = root.join("..").join("outside").join("llama");
    let mut cases = vec![
        (
            "dot-dot",
            json!({"name": "x", "folder": dot_dot.display().to_string()}),
            "folder",
        ),
        (
            "absolute",
            json!({"name": "x", "folder": outside_llama.display().to_string()}),
            "folder",
        ),
    ];
    #[cfg(unix)]
    {
        let link = root.join("escape");
        std::os::unix::fs::symlink(&outside_llama, &link).unwrap();
        let body = json!({"name": "x", "folder": link.display().to_string()});
        cases.push(("symlink", body, "folder"));
    }
    let adapter = dir.path().join("outside").join("adapter.safetensors");
    std::fs::write(&adapter, b"not read").unwrap();
    let inside = root.join("bert");
    let lora = json!({"name": "x", "folder": inside.display().to_string(),
                      "lora": [adapter.display().to_string()]});
    cases.push(("lora", lora, "lora"));
    let server = Server::start(&["--config", &config.display().to_string()]);
    for (case, body, field) in cases {
        let reply = call(&server, "POST", "/admin/models", Some(&body));
        reply.assert_error(403, "outside the server's model roots");
        assert_eq!(reply.json()["error"]["param"], field, "{case}");
    }
    assert_eq!(served(&server), ["bert"], "nothing was loaded");
    let stopped = server.stop();
    assert_eq!(stopped.status.code(), Some(0), "{}", stopped.stderr);
}
