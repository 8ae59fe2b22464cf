//! Defaults that work out of the box: the budgets stagehand picks itself are budgets
//! the run can use, a budget that is too small is refused with the flag and a value
//! that works (and that value does work), and a demo model gets the same defaults
//! however it is named.

mod common;

use std::path::{Path, PathBuf};

use common::{assert_bad_input, stagehand, write_safetensors, Spec};
use safetensors::Dtype;
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::run::{prepare, WorkloadKind};
use stagehand::settings::Settings;

/// An encoder whose embedding table (1 MiB) is far larger than its layers (4 × 64 KiB):
/// 40 % of the model is less than the embedding alone, which must stay resident.
fn large_embedding(dir: &Path) -> PathBuf {
    let layers: Vec<String> = (0..4)
        .map(|layer| format!("encoder.layer.{layer}.intermediate.dense.weight"))
        .collect();
    let mut specs: Vec<Spec<'_>> =
        vec![("embeddings.word_embeddings.weight", Dtype::F32, &[512, 512])];
    specs.extend(
        layers
            .iter()
            .map(|name| (name.as_str(), Dtype::F32, &[128usize, 128][..])),
    );
    let path = dir.join("encoder.safetensors");
    write_safetensors(&path, &specs, None);
    path
}

fn run(model: &Path, extra: &[&str]) -> std::process::Output {
    stagehand()
        .args([
            "run", "--device", "cpu", "--steps", "2", "--quiet", "--model",
        ])
        .arg(model)
        .args(extra)
        .output()
        .expect("binary runs")
}

/// The value a "too small" error suggests for `flag`: the word after it.
fn suggested(stderr: &str, flag: &str) -> String {
    let after = stderr
        .split(&format!("set {flag} "))
        .nth(1)
        .unwrap_or_else(|| panic!("no `set {flag} VALUE` in: {stderr}"));
    after
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_checkpoint_whose_embedding_outweighs_40_percent_runs_with_no_flags() {
    // Proves the automatic VRAM budget is raised to what the plan needs (it used to be
    // 40 % of the model, which the plan then refused with exit 2).
    let dir = tempfile::tempdir().unwrap();
    let model = large_embedding(dir.path());
    let output = run(&model, &[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("vram budget raised from"), "{stderr}");
    // stderr is a pipe here, not a terminal: log lines carry no colour codes.
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escape in piped stderr: {stderr:?}"
    );
}

#[test]
fn a_vram_budget_too_small_names_the_flag_and_a_value_that_works() {
    // Proves the suggested --vram-budget is enough: the same run with it succeeds.
    let dir = tempfile::tempdir().unwrap();
    let model = large_embedding(dir.path());
    let output = run(&model, &["--vram-budget", "512KiB"]);
    assert_bad_input(
        &output,
        &["vram_budget 512 KiB is below", "set --vram-budget "],
    );
    let value = suggested(&String::from_utf8_lossy(&output.stderr), "--vram-budget");
    let output = run(&model, &["--vram-budget", &value]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "--vram-budget {value}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_pin_ceiling_too_small_names_the_flag_and_a_value_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let model = large_embedding(dir.path());
    let output = run(&model, &["--pin-ceiling", "64KiB", "--vram-budget", "2MiB"]);
    assert_bad_input(
        &output,
        &["pin_ceiling 64 KiB is below", "set --pin-ceiling "],
    );
    let value = suggested(&String::from_utf8_lossy(&output.stderr), "--pin-ceiling");
    let output = run(&model, &["--pin-ceiling", &value, "--vram-budget", "2MiB"]);
    assert_eq!(
        output.status.code(),
        Some(0),
        "--pin-ceiling {value}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn a_demo_model_gets_the_demo_defaults_however_it_is_named() {
    // Proves `run --model <demo file>` is treated as the demo (pin ceiling half the
    // model, so the disk tier streams), as plain `run` is: one default per file.
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec {
        blocks: 4,
        layers_per_block: 1,
        dim: 64,
        seed: 3,
    };
    let path = write_linear_stack(dir.path(), &spec).unwrap();
    let prepared = prepare(&path, WorkloadKind::Auto, 2, &Settings::default(), false).unwrap();
    assert!(prepared.is_demo, "a file with demo metadata is the demo");
    let other = large_embedding(dir.path());
    let prepared = prepare(&other, WorkloadKind::Auto, 2, &Settings::default(), false).unwrap();
    assert!(!prepared.is_demo);
}
