//! `stagehand sample` from the command line: every flag of its own used once (exit
//! code and the line it prints), and the bad inputs of the Flux family — each exit 2
//! with one line naming what was wrong.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{assert_bad_input, stagehand};
use stagehand::compute::DType;
use stagehand::families::flux::{
    write_conditioning, write_flux_lora, FluxDemo, FluxLoraNaming, FluxPreset, Layout,
};

/// A generated model of `preset` in the diffusers layout and a conditioning file.
fn model(dir: &Path, preset: FluxPreset, dtype: DType) -> (PathBuf, PathBuf) {
    let demo = FluxDemo {
        preset,
        layout: Layout::Diffusers,
        dtype,
        seed: 1,
    };
    let model = demo
        .write(&dir.join(format!("{preset:?}-{dtype}")))
        .unwrap();
    let cond = dir.join(format!("{preset:?}-cond.safetensors"));
    write_conditioning(&cond, &preset.shape(), 6, 2).unwrap();
    (model, cond)
}

fn sample(model: &Path, cond: &Path, args: &[&str]) -> Output {
    stagehand()
        .args(["sample", "--device", "cpu", "--log", "warn", "--model"])
        .arg(model)
        .arg("--cond")
        .arg(cond)
        .args(["--width", "32", "--height", "48"])
        .args(args)
        .output()
        .expect("binary runs")
}

fn succeeded(output: &Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn every_flag_of_sample_runs() {
    // Proves each of sample's own flags is accepted and does what it says: the latent
    // file, JSON, an --init start, image-to-image strength, a LoRA.
    let dir = tempfile::tempdir().unwrap();
    let (model, cond) = model(dir.path(), FluxPreset::Tiny, DType::Bf16);
    let out = dir.path().join("first.safetensors");
    let out_text = out.to_str().unwrap();
    let text = succeeded(&sample(
        &model,
        &cond,
        &["--steps", "2", "--seed", "3", "--quiet", "--out", out_text],
    ));
    assert!(
        text.contains("sample: wrote") && text.contains("latent [1, 16, 6, 4]"),
        "{text}"
    );
    let json = succeeded(&sample(
        &model,
        &cond,
        &[
            "--steps",
            "2",
            "--guidance",
            "4.0",
            "--json",
            "--out",
            out_text,
        ],
    ));
    let value: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(value["steps"], 2);
    let again = dir.path().join("again.safetensors");
    let init = succeeded(&sample(
        &model,
        &cond,
        &[
            "--steps",
            "2",
            "--init",
            out_text,
            "--quiet",
            "--out",
            again.to_str().unwrap(),
        ],
    ));
    assert!(init.contains("after 2 denoising steps"), "{init}");
    let image = succeeded(&sample(
        &model,
        &cond,
        &[
            "--steps",
            "4",
            "--init",
            out_text,
            "--strength",
            "0.5",
            "--seed",
            "1",
            "--quiet",
            "--out",
            out_text,
        ],
    ));
    assert!(
        image.contains("after 2 denoising steps"),
        "strength 0.5 of 4 steps runs 2: {image}"
    );
    let lora = dir.path().join("lora.safetensors");
    write_flux_lora(&lora, &FluxPreset::Tiny.shape(), FluxLoraNaming::Peft, 2, 5).unwrap();
    let with_lora = format!("{}:0.5", lora.display());
    let patched = succeeded(&sample(
        &model,
        &cond,
        &[
            "--steps", "1", "--lora", &with_lora, "--quiet", "--out", out_text,
        ],
    ));
    assert!(patched.contains("sample: wrote"), "{patched}");
}

#[test]
fn bad_sampling_inputs_exit_2_with_one_line() {
    // Proves each bad input of the list is refused by name, before any block
    // moves: --steps 0, a size not divisible by 16, a conditioning file missing a
    // tensor or of the wrong shape, guidance on schnell, --seed beside --init, and a
    // checkpoint whose block count disagrees with its config.
    let dir = tempfile::tempdir().unwrap();
    let (model, cond) = model(dir.path(), FluxPreset::Tiny, DType::Bf16);
    let out = dir.path().join("out.safetensors");
    let out = out.to_str().unwrap();
    assert_bad_input(
        &sample(&model, &cond, &["--steps", "0", "--out", out]),
        &["--steps 0"],
    );
    let odd = stagehand()
        .args([
            "sample", "--device", "cpu", "--steps", "1", "--width", "40", "--height", "48",
            "--out", out, "--model",
        ])
        .arg(&model)
        .arg("--cond")
        .arg(&cond)
        .output()
        .unwrap();
    assert_bad_input(&odd, &["--width 40", "multiples of 16"]);
    let wrong = dir.path().join("wrong.safetensors");
    common::lora::write_f32_tensors(
        &wrong,
        &[("encoder_hidden_states", vec![1, 4, 7], vec![0.0; 28])],
    );
    assert_bad_input(
        &sample(&model, &wrong, &["--steps", "1", "--out", out]),
        &["encoder_hidden_states", "[1, 4, 7]"],
    );
    let shape = FluxPreset::Tiny.shape();
    let context = vec![0.0; 4 * shape.context_dim];
    common::lora::write_f32_tensors(
        &wrong,
        &[(
            "encoder_hidden_states",
            vec![1, 4, shape.context_dim],
            context,
        )],
    );
    assert_bad_input(
        &sample(&model, &wrong, &["--steps", "1", "--out", out]),
        &["pooled_projections", "missing"],
    );
    let (schnell, schnell_cond) = self::model(dir.path(), FluxPreset::TinySchnell, DType::Bf16);
    assert_bad_input(
        &sample(
            &schnell,
            &schnell_cond,
            &["--steps", "1", "--guidance", "3.5", "--out", out],
        ),
        &["--guidance", "no guidance embedder"],
    );
    assert_bad_input(
        &sample(
            &model,
            &cond,
            &["--steps", "1", "--seed", "1", "--init", out, "--out", out],
        ),
        &["--seed", "--init"],
    );
    let config_path = model.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        config.replace("\"num_layers\": 2", "\"num_layers\": 3"),
    )
    .unwrap();
    assert_bad_input(
        &sample(&model, &cond, &["--steps", "1", "--out", out]),
        &["2 double_blocks", "num_layers"],
    );
}
