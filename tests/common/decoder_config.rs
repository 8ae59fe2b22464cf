//! Helpers of the decoder config-key tests (`tests/decoder_config*.rs`): tiny
//! generated folders with an edited `config.json`, and `generate` runs over them.

use std::path::{Path, PathBuf};

use serde_json::Value;
use stagehand::compute::DType;
use stagehand::families::llama::DecoderArch;
use stagehand::run::{execute, no_observer, prepare_with, Extras, WorkloadKind};
use stagehand::settings::Settings;

use super::decoder::{decoder_plan, tiny_decoder};
use super::{assert_bad_input, stagehand};

pub struct Folders {
    pub dir: tempfile::TempDir,
}

impl Folders {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A fresh tiny folder of `arch` named `name`, its config edited by `edit`.
    pub fn with(&self, name: &str, arch: DecoderArch, edit: impl FnOnce(&mut Value)) -> PathBuf {
        let folder = tiny_decoder(&self.dir.path().join(name), arch, DType::F32, 3);
        let path = folder.join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(path, config.to_string()).unwrap();
        folder
    }

    pub fn llama(&self, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
        self.with(name, DecoderArch::Llama, edit)
    }
}

pub fn generate(model: &Path, args: &[&str]) -> std::process::Output {
    let mut command = stagehand();
    // Every step against the resident pass (generate's own default checks the first).
    command.args([
        "generate", "--device", "cpu", "--log", "warn", "--json", "--verify", "full",
    ]);
    if !args.contains(&"--max-tokens") {
        command.args(["--max-tokens", "3"]);
    }
    command
        .arg("--model")
        .arg(model)
        .args(args)
        .output()
        .unwrap()
}

/// The logits of the prompt's prefill, computed through the library (resident).
pub fn prefill_logits(model: &Path) -> Vec<f32> {
    let settings = Settings::default();
    let prepared = prepare_with(
        model,
        WorkloadKind::Decoder,
        1,
        &settings,
        false,
        &Extras::default(),
    )
    .unwrap();
    let mut plan = decoder_plan(&settings, 64 << 20, 1, no_observer());
    plan.keep_outputs = true;
    let outcome = execute(&prepared, plan).unwrap();
    outcome.report.outputs[&0].clone()
}

pub fn refused(model: &Path, args: &[&str], expected: &[&str]) {
    assert_bad_input(&generate(model, args), expected);
}

/// A successful run's JSON, and its stderr.
pub fn runs(model: &Path, args: &[&str]) -> (Value, String) {
    let output = generate(model, args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "runs: {stderr}");
    let value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    (value, stderr)
}
