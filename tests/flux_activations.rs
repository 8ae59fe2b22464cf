//! A Flux step's activations: what `stagehand sample` reports it reserved and each
//! kind of block's working set are the figures the simulator's description of the
//! same model and input carries, and `simulate --model FILE` reports those of the
//! 1024² step with 512 text tokens it describes.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use stagehand::compute::DType;
use stagehand::families::flux::{
    write_conditioning, FluxDemo, FluxPreset, Layout, SampleInput, Start,
};
use stagehand::run::driver::Model;
use stagehand::run::{prepare_with, Extras, Prepared, WorkloadKind};
use stagehand::settings::Settings;
use stagehand::simulate::ModelDescription;

const PRESET: FluxPreset = FluxPreset::Tiny;

/// The tiny Flux in the original layout and a conditioning of `tokens` tokens.
fn model(dir: &Path, tokens: usize) -> (PathBuf, PathBuf) {
    let demo = FluxDemo {
        preset: PRESET,
        layout: Layout::Original,
        dtype: DType::Bf16,
        seed: 3,
    };
    let model = demo.write(&dir.join("flux")).unwrap();
    let cond = dir.join(format!("cond-{tokens}.safetensors"));
    write_conditioning(&cond, &PRESET.shape(), tokens, 4).unwrap();
    (model, cond)
}

fn prepared(model: &Path, cond: &Path, width: usize, height: usize) -> Prepared {
    let extras = Extras::default().with(SampleInput {
        cond: cond.to_path_buf().into(),
        width,
        height,
        steps: 1,
        guidance: None,
        start: Start::Seed(0),
    });
    let kind = WorkloadKind::Diffusion;
    prepare_with(model, kind, 1, &Settings::default(), false, &extras).unwrap()
}

fn stagehand(args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{args:?}: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn sample_reports_the_working_sets_the_simulators_description_carries() {
    // Proves the reserved bytes and per-kind working sets `sample --json` reports are
    // those of the simulator's description of the same model and input (one
    // function), that the run reserved them (its peak VRAM holds them), and that
    // every kind's working set is below the step's reservation.
    let dir = tempfile::tempdir().unwrap();
    let (model, cond) = model(dir.path(), 8);
    let out = dir.path().join("latent.safetensors");
    let [model_arg, cond_arg, out_arg] =
        [&model, &cond, &out].map(|path| path.display().to_string());
    let sampled = stagehand(&[
        "sample", "--model", &model_arg, "--cond", &cond_arg, "--width", "64", "--height", "48",
        "--steps", "1", "--out", &out_arg, "--json",
    ]);
    let description = ModelDescription::from_prepared(&prepared(&model, &cond, 64, 48), 1).unwrap();
    let described = serde_json::to_value(description.activations.unwrap()).unwrap();
    assert_eq!(sampled["activations"], described);
    let reserved = described["reserved_bytes"].as_u64().unwrap();
    assert_eq!(sampled["activation_bytes"].as_u64(), Some(reserved));
    let kinds: Vec<&str> = described["peaks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|peak| peak["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["embedders", "double block", "single block", "final layer"]
    );
    for peak in described["peaks"].as_array().unwrap() {
        let bytes = peak["bytes"].as_u64().unwrap();
        assert!(0 < bytes && bytes < reserved, "{peak}");
    }
    let peak_vram = sampled["summary"]["peak_vram_bytes"].as_u64().unwrap();
    assert!(
        peak_vram >= reserved,
        "peak VRAM {peak_vram} below the {reserved} reserved"
    );
}

#[test]
fn simulate_reports_the_working_sets_of_the_step_it_describes() {
    // Proves `simulate --model FILE` carries the activations of the step it describes
    // (1024², 512 text tokens): those a sample of that size and conditioning computes,
    // and its predicted peak VRAM holds the reservation.
    let dir = tempfile::tempdir().unwrap();
    let (model, cond) = model(dir.path(), 512);
    let report = stagehand(&[
        "simulate",
        "--model",
        &model.display().to_string(),
        "--hardware",
        "rtx3060-12gb",
        "--steps",
        "2",
        "--no-baselines",
        "--json",
    ]);
    let prepared = prepared(&model, &cond, 1024, 1024);
    let Model::Flux(flux) = &prepared.workload.model else {
        panic!("not a Flux");
    };
    let computed = serde_json::to_value(flux.activations()).unwrap();
    assert_eq!(report["activations"], computed);
    let reserved = computed["reserved_bytes"].as_u64().unwrap();
    let peak_vram = report["stagehand"]["peak_vram_bytes"].as_u64().unwrap();
    assert!(
        peak_vram >= reserved,
        "predicted peak VRAM {peak_vram} below {reserved}"
    );
}
