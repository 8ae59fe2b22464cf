//! `--trace` of simulated runs: disk, copy and compute lanes, one slice per block
//! transfer or compute, no overlap on a lane, byte-identical for the same seed; and
//! the `simulate` command's output and exit statuses.

mod common;

use std::collections::hash_map::DefaultHasher;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use stagehand::harness::Scenario;
use stagehand::telemetry::TraceRecorder;

fn scenario(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(name)
}

/// Parses a Chrome trace into lane name → slices (name, start µs, end µs).
fn lanes(json: &str) -> BTreeMap<String, Vec<(String, f64, f64)>> {
    let value: serde_json::Value = serde_json::from_str(json).unwrap();
    let events = value["traceEvents"].as_array().unwrap();
    let mut names = BTreeMap::new();
    for event in events.iter().filter(|event| event["name"] == "thread_name") {
        names.insert(
            event["tid"].as_u64().unwrap(),
            event["args"]["name"].as_str().unwrap().to_string(),
        );
    }
    let mut lanes: BTreeMap<String, Vec<(String, f64, f64)>> = names
        .values()
        .map(|name| (name.clone(), Vec::new()))
        .collect();
    for event in events.iter().filter(|event| event["ph"] == "X") {
        let lane = &names[&event["tid"].as_u64().unwrap()];
        let start = event["ts"].as_f64().unwrap();
        let end = start + event["dur"].as_f64().unwrap();
        lanes.get_mut(lane).unwrap().push((
            event["name"].as_str().unwrap().to_string(),
            start,
            end,
        ));
    }
    lanes
}

fn trace_of(scenario_file: &str) -> String {
    let scenario = Scenario::load(&scenario(scenario_file)).unwrap();
    let trace = Arc::new(TraceRecorder::new());
    let _ = scenario.run(Some(Arc::clone(&trace)));
    trace.chrome_trace_json()
}

fn hash(text: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    text.hash(&mut hasher);
    hasher.finish()
}

#[test]
fn a_simulated_trace_has_three_lanes_of_non_overlapping_block_slices() {
    // Proves the trace shows disk, copy and compute lanes with one slice per block
    // operation, every copy named by its block, and no two slices overlapping on a lane.
    let json = trace_of("llama3-8b-jitter-slow-reads.toml");
    let lanes = lanes(&json);
    assert_eq!(
        lanes.keys().collect::<Vec<_>>(),
        ["compute", "copy", "disk"],
        "lanes"
    );
    let block_names: Vec<String> = std::iter::once("model.embed_tokens".to_string())
        .chain((0..32).map(|index| format!("model.layers.{index}")))
        .chain(std::iter::once("tail".to_string()))
        .collect();
    for (lane, slices) in &lanes {
        assert!(!slices.is_empty(), "lane {lane} is empty");
        let mut sorted = slices.clone();
        sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
        for pair in sorted.windows(2) {
            // Microsecond floats: allow rounding of the last digit.
            assert!(
                pair[1].1 >= pair[0].2 - 1e-3,
                "lane {lane}: {:?} overlaps {:?}",
                pair[0],
                pair[1]
            );
        }
        for (name, _, _) in slices {
            assert!(
                block_names.contains(name),
                "lane {lane}: slice `{name}` is not named by its block"
            );
        }
    }
    // 6 steps × 34 blocks of compute; the disk and copy lanes carry the streamed ones.
    assert_eq!(lanes["compute"].len(), 6 * 34);
    assert!(lanes["copy"].len() >= 34 && lanes["disk"].len() >= 34);
}

#[test]
fn the_same_scenario_and_seed_give_the_same_trace_byte_for_byte() {
    // Proves determinism: two runs of a jittered scenario hash the same; another seed differs.
    let first = trace_of("llama3-8b-jitter-slow-reads.toml");
    let second = trace_of("llama3-8b-jitter-slow-reads.toml");
    assert_eq!(hash(&first), hash(&second));
    assert_eq!(first.len(), second.len());

    let mut scenario = Scenario::load(&scenario("llama3-8b-jitter-slow-reads.toml")).unwrap();
    scenario.options.faults.seed += 1;
    let trace = Arc::new(TraceRecorder::new());
    let _ = scenario.run(Some(Arc::clone(&trace)));
    assert_ne!(hash(&first), hash(&trace.chrome_trace_json()));
}

fn stagehand() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stagehand"));
    // No layer from the developer's environment or the repository's default file.
    command.current_dir(std::env::temp_dir());
    command.env_clear();
    command
}

#[test]
fn simulate_writes_its_trace_and_json() {
    // Proves `stagehand simulate --trace FILE --json` writes a parseable trace and a
    // JSON verdict with stagehand and both baselines.
    let folder = tempfile::tempdir().unwrap();
    let trace = folder.path().join("step.json");
    let output = stagehand()
        .args([
            "simulate",
            "--model",
            "llama3-8b",
            "--hardware",
            "rtx3060-12gb",
        ])
        .args(["--steps", "4", "--json", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verdict: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(verdict["fits"], true);
    assert_eq!(verdict["fit"]["bottleneck"], "link");
    assert_eq!(verdict["stagehand"]["policy"], "stagehand");
    let baselines: Vec<&str> = verdict["baselines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|baseline| baseline["policy"].as_str().unwrap())
        .collect();
    assert_eq!(baselines, ["naive", "lru_prefetch"]);
    assert!(verdict["stagehand"]["efficiency"].as_f64().unwrap() > 0.95);
    let lanes = lanes(&std::fs::read_to_string(&trace).unwrap());
    assert_eq!(lanes["compute"].len(), 4 * 34);
}

#[test]
fn simulate_says_what_does_not_fit_and_refuses_bad_input() {
    // Proves a model that does not fit is a verdict (exit 3, the failing budgets named)
    // and an unknown profile or a bad size is bad input (exit 2). The depth is explicit:
    // left to the simulator, depth 0 fits these budgets (tests/sim_depth.rs).
    let output = stagehand()
        .args([
            "simulate",
            "--model",
            "llama3-70b",
            "--hardware",
            "rtx3060-12gb",
        ])
        .args(["--ram", "32GiB", "--disk", "hdd", "--vram-budget", "5GiB"])
        .args(["--pin-ceiling", "4GiB", "--prefetch-depth", "2"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(3));
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("fits: NO")
            && text.contains("vram_budget 5 GiB is 3.41 GiB short")
            && text.contains("pin_ceiling 4 GiB is 1.87 GiB short"),
        "{text}"
    );
    for bad in [
        vec!["--hardware", "rtx9999"],
        vec!["--hardware", "rtx3060-12gb", "--ram", "lots"],
        vec!["--hardware", "rtx3060-12gb", "--disk", "floppy"],
    ] {
        let output = stagehand()
            .args(["simulate", "--model", "llama3-8b"])
            .args(&bad)
            .output()
            .unwrap();
        assert_eq!(output.status.code(), Some(2), "{bad:?}");
        let message = String::from_utf8_lossy(&output.stderr);
        assert!(message.contains(bad[bad.len() - 1]), "{message}");
    }
}

#[test]
fn run_trace_packs_real_transfers_onto_rows_that_never_overlap() {
    // Proves `stagehand run --trace FILE` (wall clock, TraceObserver) writes disk, copy
    // and compute rows, one compute slice per block per step, no row overlapping.
    let folder = tempfile::tempdir().unwrap();
    let trace = folder.path().join("run.json");
    // The small demo model, streamed through a budget below its 4 MiB: the default
    // 256 MiB model at batch 64 spent 40 s of a debug build in GEMMs.
    let model = common::demo::small_demo_model(folder.path());
    let output = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .current_dir(folder.path())
        .args(["run", "--steps", "3", "--batch", "4", "--model"])
        .arg(&model)
        .args([
            "--vram-budget",
            "2560KiB",
            "--pin-ceiling",
            "3MiB",
            "--trace",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lanes = lanes(&std::fs::read_to_string(&trace).unwrap());
    for prefix in ["disk", "copy", "compute"] {
        assert!(
            lanes.keys().any(|lane| lane.starts_with(prefix)),
            "no {prefix} lane: {:?}",
            lanes.keys()
        );
    }
    let compute: usize = lanes
        .iter()
        .filter(|(lane, _)| lane.starts_with("compute"))
        .map(|(_, slices)| slices.len())
        .sum();
    assert_eq!(compute % 3, 0, "{compute} compute slices over 3 steps");
    for (lane, slices) in &lanes {
        let mut sorted = slices.clone();
        sorted.sort_by(|a, b| a.1.total_cmp(&b.1));
        for pair in sorted.windows(2) {
            assert!(pair[1].1 >= pair[0].2 - 1e-3, "{lane}: {pair:?}");
        }
    }
}
