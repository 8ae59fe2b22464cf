//! Qwen3, Qwen3-MoE and Qwen2-MoE end to end through the binary, on the demo folders
//! `demo-model --arch qwen3|qwen3-moe|qwen2-moe` writes: streamed runs verify bit for
//! bit against their resident pass and pick its tokens; the MoE experts go through
//! the expert cache, whatever the policy or the hint, and the next-MoE-layer hint
//! foresees more of them; `simulate --model` and `bench --model` take the folders
//! (through the registry, with no per-family code).

mod common;

use std::path::{Path, PathBuf};

use common::stagehand;
use serde_json::Value;

const ARCHES: [&str; 3] = ["qwen3", "qwen3-moe", "qwen2-moe"];

/// `stagehand demo-model --arch ARCH` into `dir`, through the binary.
fn demo(dir: &Path, arch: &str, preset: &str) -> PathBuf {
    let out = dir.join(format!("{arch}-{preset}"));
    let output = stagehand()
        .args([
            "demo-model",
            "--arch",
            arch,
            "--decoder-preset",
            preset,
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{arch}: {stdout}");
    assert!(stdout.contains("wrote"), "{stdout}");
    out
}

fn generate(model: &Path, args: &[&str]) -> Value {
    let output = stagehand()
        .args([
            // Every step against the resident pass (generate's default checks the first).
            "generate", "--json", "--device", "cpu", "--log", "warn", "--verify", "full", "--model",
        ])
        .arg(model)
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn qwen_folders_stream_bit_exact_against_their_resident_run() {
    // Proves each family runs streamed (the automatic budget is 40 % of the model)
    // with every step verified against the resident reference, and picks the tokens
    // of a run that holds everything resident.
    let dir = tempfile::tempdir().unwrap();
    for (arch, described) in
        ARCHES
            .into_iter()
            .zip(["qwen3 decoder", "qwen3-moe decoder", "qwen2-moe decoder"])
    {
        let model = demo(dir.path(), arch, "tiny");
        let streamed = generate(&model, &["--max-tokens", "12", "--prompt", "qwen"]);
        let summary = &streamed["summary"];
        assert_eq!(summary["workload"], described);
        assert_eq!(summary["verified_steps"], 12, "{arch}");
        let moved = summary["streamed_bytes_per_step_planned"].as_u64().unwrap();
        let misses = summary["expert_misses"].as_u64().unwrap_or(0);
        assert!(moved > 0 || misses > 0, "{arch} streams: {summary}");
        let resident = generate(
            &model,
            &[
                "--max-tokens",
                "12",
                "--prompt",
                "qwen",
                "--vram-budget",
                "256MiB",
            ],
        );
        assert_eq!(resident["summary"]["streamed_bytes_per_step_planned"], 0);
        assert_eq!(streamed["tokens"], resident["tokens"], "{arch}");
    }
}

#[test]
fn qwen_moe_experts_go_through_the_cache_and_the_hint_foresees_them() {
    // Proves, as for Mixtral: the tokens do not depend on the expert policy or the
    // hint, every run uses as many experts, the hint is used, and it raises the share
    // of experts foreseen (resident, or hinted and on their way) over no hint.
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3-moe", "qwen2-moe"] {
        let model = demo(dir.path(), arch, "tiny");
        let mut tokens = None;
        let mut uses = None;
        let mut foreseen = Vec::new();
        for policy in ["lru", "lfu-aging"] {
            for hint in ["none", "next-layer"] {
                let output = generate(
                    &model,
                    &[
                        "--max-tokens",
                        "16",
                        "--expert-policy",
                        policy,
                        "--moe-hint",
                        hint,
                        "--expert-slots",
                        "10",
                    ],
                );
                let summary = &output["summary"];
                assert_eq!(summary["verified_steps"], 16, "{arch} {policy} {hint}");
                let hints = summary["expert_hints"].as_u64().unwrap();
                assert_eq!(hints > 0, hint == "next-layer", "{arch} {policy} {hint}");
                let used = summary["expert_hits"].as_u64().unwrap()
                    + summary["expert_misses"].as_u64().unwrap();
                assert_eq!(*uses.get_or_insert(used), used, "{arch} {policy} {hint}");
                let picked = output["tokens"].clone();
                assert_eq!(*tokens.get_or_insert(picked.clone()), picked, "{arch}");
                foreseen.push(summary["expert_foreseen_rate"].as_f64().unwrap());
            }
        }
        eprintln!(
            "{arch}: foreseen (lru none, lru hint, lfu-aging none, lfu-aging hint) {foreseen:?}"
        );
        for pair in foreseen.chunks(2) {
            assert!(pair[1] > pair[0], "{arch}: the hint helps: {foreseen:?}");
        }
    }
}

#[test]
fn simulate_describes_qwen_folders_from_their_config_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    for arch in ARCHES {
        let model = demo(dir.path(), arch, "tiny");
        let output = stagehand()
            .args([
                "simulate",
                "--hardware",
                "rtx3060-12gb",
                "--json",
                "--model",
            ])
            .arg(&model)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{arch}: {stdout}");
        let report: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(report["output"]["unit"], "token", "{arch}");
        assert_eq!(report["fits"], true, "{arch}");
        assert!(report.to_string().contains("tokens/s"), "{arch}");
    }
}

#[test]
fn bench_measures_qwen_folders_and_the_moe_expert_policies() {
    // Proves `bench --model` runs on the folders: its configurations, and for an MoE
    // model a row per expert policy and hint.
    let dir = tempfile::tempdir().unwrap();
    for arch in ["qwen3", "qwen3-moe"] {
        let model = demo(dir.path(), arch, "tiny");
        let output = stagehand()
            .args(["bench", "--device", "cpu", "--log", "warn", "--steps", "3"])
            .args(["--rounds", "1", "--json", "--model"])
            .arg(&model)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{arch}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: Value = serde_json::from_str(&stdout).unwrap();
        assert!(
            !report["configurations"].as_array().unwrap().is_empty(),
            "{arch}"
        );
        let experts = report["experts"].as_array().map_or(0, Vec::len);
        assert_eq!(experts > 0, arch == "qwen3-moe", "{arch}: {report}");
    }
}

#[test]
fn demo_presets_have_real_names_and_refuse_a_shape_that_does_not_exist() {
    // Proves the written config is the real family's (model_type, architectures, the
    // MoE keys) and `1b` of a Qwen MoE (no such model) is refused by name.
    let dir = tempfile::tempdir().unwrap();
    let model = demo(dir.path(), "qwen2-moe", "small");
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["model_type"], "qwen2_moe");
    assert_eq!(config["architectures"][0], "Qwen2MoeForCausalLM");
    assert_eq!(config["num_experts"], 20);
    assert_eq!(config["shared_expert_intermediate_size"], 1024);
    let output = stagehand()
        .args([
            "demo-model",
            "--arch",
            "qwen3-moe",
            "--decoder-preset",
            "1b",
            "--out",
        ])
        .arg(dir.path().join("none"))
        .output()
        .unwrap();
    common::assert_bad_input(&output, &["--decoder-preset OneB", "Qwen3Moe"]);
}

#[test]
fn an_moe_decoders_kv_cache_grows_past_its_first_page() {
    // Proves the expert cache leaves room for the KV cache the run grows to: 80 tokens
    // need a second 64-token page, which once found every weight resident or in a
    // fixed expert slot and stopped the run ("the KV cache does not fit after 64
    // tokens").
    let dir = tempfile::tempdir().unwrap();
    let model = demo(dir.path(), "qwen3-moe", "tiny");
    let output = generate(&model, &["--max-tokens", "80"]);
    assert_eq!(output["summary"]["verified_steps"], 80);
}
