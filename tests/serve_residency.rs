//! What `stagehand serve` tells a router (issue 42, item 3), over plain HTTP:
//! `GET /residency` names each model's state (resident, streamed, cold), its queue
//! depth and requests in flight, and its share of the server's VRAM and pinned
//! memory; `/metrics` carries the same state and queue depth, set at the scrape.
#![cfg(feature = "serve")]

mod common;
mod serve_support;

use std::io::Read;

use serde_json::{json, Value};

use serve_support::{eventually, metric, models_without_eos, Server};

/// A VRAM budget each tiny model fits in whole (the default, 40 % of a model,
/// streams most of it).
const ROOMY: &str = "64MiB";

/// The encoder and the decoder (which runs to its `max_tokens`), one sequence at a
/// time, each under a budget it fits in, with `extra` flags.
fn start(dir: &std::path::Path, extra: &[&str]) -> Server {
    let (bert, llama) = models_without_eos(dir);
    let (bert, llama) = (bert.display().to_string(), llama.display().to_string());
    let mut args = vec![
        "--model",
        bert.as_str(),
        "--model",
        llama.as_str(),
        "--max-sequences",
        "1",
        "--max-tokens",
        "4000",
        "--vram-budget",
        ROOMY,
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn residency(server: &Server) -> Value {
    let reply = server.get("/residency");
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

fn model<'a>(report: &'a Value, id: &str) -> &'a Value {
    report["models"]
        .as_array()
        .expect("a list of models")
        .iter()
        .find(|model| model["id"] == id)
        .unwrap_or_else(|| panic!("{id} is not in {report}"))
}

fn state_gauge(server: &Server, model: &str, state: &str) -> f64 {
    let text = server.get("/metrics").text();
    metric(
        &text,
        "stagehand_serve_residency_models",
        &[("model", model), ("state", state)],
    )
}

#[test]
fn residency_names_each_models_state_queue_and_shares() {
    // Proves the report lists every served model with its kind, state, queue bound
    // and budgets; that the shares of the models add up to at most the whole; and
    // that the same state is on /metrics (1 for it, 0 for the others).
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--queue-depth", "3"]);
    let report = residency(&server);
    assert_eq!(report["object"], "residency");
    assert_eq!(report["draining"], false);
    let ids: Vec<&str> = report["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|model| model["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["bert", "llama"]);
    let mut vram_share = 0.0;
    for (id, kind) in [("bert", "encoder"), ("llama", "decoder")] {
        let entry = model(&report, id);
        assert_eq!(entry["kind"], kind);
        assert_eq!(entry["state"], "resident", "{entry}");
        assert_eq!(entry["streamed_bytes_per_step"], 0);
        assert_eq!(entry["queue_capacity"], 3);
        assert_eq!(entry["queue_depth"], 0);
        assert_eq!(entry["in_flight"], 0);
        assert!(entry["idle_seconds"].is_null(), "{entry}");
        let vram = entry["vram_bytes"].as_u64().unwrap();
        assert!(vram >= entry["model_bytes"].as_u64().unwrap(), "{entry}");
        assert!(vram <= entry["vram_budget_bytes"].as_u64().unwrap());
        vram_share += entry["vram_share"].as_f64().unwrap();
        assert_eq!(state_gauge(&server, id, "resident"), 1.0);
        assert_eq!(state_gauge(&server, id, "streamed"), 0.0);
        assert_eq!(state_gauge(&server, id, "cold"), 0.0);
    }
    assert!(vram_share > 0.0 && vram_share <= 1.0, "{report}");
    assert!(report["vram_budget_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn residency_counts_the_queue_and_the_requests_in_flight() {
    // Proves a router sees load where it is: one generation running and one queued
    // behind it show as in flight 2 and queue depth 1 on the decoder (and on the
    // metrics page, read at the scrape), none on the encoder; both go back to 0.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &[]);
    let running = server.streaming(4000);
    let queued_body = json!({"model": "llama", "prompt": "hi", "max_tokens": 2}).to_string();
    let mut queued = server.send("POST", "/v1/completions", &[], Some(queued_body.as_bytes()));
    eventually("the second request is queued", || {
        model(&residency(&server), "llama")["queue_depth"] == 1
    });
    let report = residency(&server);
    let llama = model(&report, "llama");
    assert_eq!(llama["in_flight"], 2, "{llama}");
    assert!(llama["idle_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(model(&report, "bert")["in_flight"], 0);
    let text = server.get("/metrics").text();
    let depth = metric(
        &text,
        "stagehand_serve_queue_depth_requests",
        &[("model", "llama")],
    );
    assert_eq!(depth, 1.0);
    drop(running);
    let mut answer = Vec::new();
    queued.read_to_end(&mut answer).unwrap();
    assert_eq!(serve_support::Reply::parse(&answer).status, 200);
    eventually("the decoder is idle again", || {
        let llama = model(&residency(&server), "llama").clone();
        llama["in_flight"] == 0 && llama["queue_depth"] == 0
    });
}

/// The decoder's residency entry and its state gauges under `budget`, and whether a
/// completion is answered.
fn under_budget(llama: &str, budget: &str) -> (Value, [f64; 2]) {
    let server = Server::start(&["--model", llama, "--vram-budget", budget]);
    let report = residency(&server);
    let entry = model(&report, "llama").clone();
    let state = entry["state"].as_str().unwrap().to_string();
    let gauges = [
        state_gauge(&server, "llama", &state),
        ["resident", "streamed", "cold"]
            .iter()
            .map(|other| state_gauge(&server, "llama", other))
            .sum(),
    ];
    let reply = server.post(
        "/v1/completions",
        &json!({"model": "llama", "prompt": "hi", "max_tokens": 2}),
    );
    assert_eq!(reply.status, 200, "under {budget}: {}", reply.text());
    (entry, gauges)
}

#[test]
fn the_state_follows_the_budget_resident_streamed_cold() {
    // Proves the state follows the plan: in a roomy budget the decoder is resident;
    // in two thirds of its size it keeps some blocks and streams the rest (fewer
    // bytes than the model); in a third it keeps none (it streams all of it). Each
    // time /metrics shows 1 for that state alone, and the model still answers.
    let dir = tempfile::tempdir().unwrap();
    let (_, llama) = models_without_eos(dir.path());
    let llama = llama.display().to_string();
    let (roomy, gauges) = under_budget(&llama, ROOMY);
    assert_eq!(roomy["state"], "resident", "{roomy}");
    assert_eq!(roomy["streamed_bytes_per_step"], 0);
    assert_eq!(gauges, [1.0, 1.0]);
    let whole = roomy["model_bytes"].as_u64().unwrap();
    let (part, gauges) = under_budget(&llama, &format!("{}B", whole * 2 / 3));
    let streamed = part["streamed_bytes_per_step"].as_u64().unwrap();
    assert_eq!(part["state"], "streamed", "{part}");
    assert!(streamed > 0 && streamed < whole, "{part}");
    assert_eq!(gauges, [1.0, 1.0]);
    let (none, gauges) = under_budget(&llama, &format!("{}B", whole / 3));
    assert_eq!(none["state"], "cold", "{none}");
    assert_eq!(none["streamed_bytes_per_step"], whole);
    assert_eq!(gauges, [1.0, 1.0]);
}

#[test]
fn residency_says_draining_after_sigterm_while_a_request_finishes() {
    // Proves a router can tell a draining server from a ready one on the same
    // endpoint: after SIGTERM, with a request still running, `draining` is true.
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), &["--drain-seconds", "30"]);
    let running = server.streaming(4000);
    server.signal(libc::SIGTERM);
    eventually("the server drains", || {
        residency(&server)["draining"] == true
    });
    drop(running);
    let stopped = server.wait();
    assert!(stopped.status.success(), "{}", stopped.stderr);
}
