//! A folder that is not one model gets an error that points to the fix: a diffusers
//! pipeline folder names its parts and which to pass (or `stagehand image`), a parent
//! of model folders lists them, and a stray `.safetensors` file beside a model is
//! named (left out, or refused where it cannot be told apart) — never "holds no
//! .safetensors files" or one tensor "also in" another file.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{assert_bad_input, stagehand, write_safetensors};
use safetensors::Dtype;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn stagehand_on(args: &[&str], path: &Path, rest: &[&str]) -> Output {
    stagehand()
        .args(args)
        .arg(path)
        .args(rest)
        .args(["--log", "warn"])
        .output()
        .expect("binary runs")
}

#[test]
fn a_pipeline_folder_given_for_one_model_names_its_parts_and_what_to_pass() {
    // Proves run, generate, embed and inspect on a diffusers pipeline folder say it is
    // a pipeline, list its parts with their classes, and say what to pass instead.
    let pipeline = fixture("tests/fixtures/pipeline/flux-tiny");
    let transformer = pipeline.join("transformer").display().to_string();
    let expected = [
        "a diffusers pipeline (FluxPipeline), not one model",
        "text_encoder/ (CLIPTextModel)",
        "text_encoder_2/ (T5EncoderModel)",
        "transformer/ (FluxTransformer2DModel)",
        "vae/ (AutoencoderKL)",
        transformer.as_str(),
        "`stagehand image`",
    ];
    let runs = [
        stagehand_on(&["run", "--steps", "1", "--model"], &pipeline, &[]),
        stagehand_on(&["generate", "--model"], &pipeline, &["--prompt", "hello"]),
        stagehand_on(&["embed", "--model"], &pipeline, &["hello"]),
        stagehand_on(&["inspect"], &pipeline, &[]),
    ];
    for output in &runs {
        assert_bad_input(output, &expected);
    }
}

#[test]
fn a_parent_of_model_folders_lists_them() {
    // Proves a folder holding model folders (and no checkpoint of its own) lists each
    // with its model type and says to pass one of them.
    let dir = tempfile::tempdir().expect("temp dir");
    common::encoder::tiny_bert(&dir.path().join("bert"), stagehand::compute::DType::F32);
    common::decoder::tiny_decoder(
        &dir.path().join("llama"),
        stagehand::families::llama::DecoderArch::Llama,
        stagehand::compute::DType::F32,
        7,
    );
    std::fs::create_dir(dir.path().join("notes")).expect("an unrelated folder");
    let first = dir.path().join("bert").display().to_string();
    let expected = [
        "holds no model of its own but 2 model folders",
        "bert/ (bert), llama/ (llama)",
        "pass one of them",
        first.as_str(),
    ];
    let run = stagehand_on(&["run", "--steps", "1", "--model"], dir.path(), &[]);
    assert_bad_input(&run, &expected);
    let embed = stagehand_on(&["embed", "--model"], dir.path(), &["hello"]);
    assert_bad_input(&embed, &expected);
}

/// A copy of the tiny Flux transformer's diffusers folder in `dir`, with a stray
/// `latents.safetensors` (a tensor the model does not have) beside its weights.
fn transformer_with_a_stray(dir: &Path) -> PathBuf {
    let folder = dir.join("transformer");
    std::fs::create_dir(&folder).expect("folder");
    let source = fixture("tests/fixtures/flux/dev/transformer");
    for name in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(source.join(name), folder.join(name)).expect("copied");
    }
    write_safetensors(
        &folder.join("latents.safetensors"),
        &[("latent", Dtype::F32, &[4, 4])],
        None,
    );
    folder
}

#[test]
fn a_stray_file_beside_a_models_weights_is_left_out_and_named() {
    // Proves a .safetensors file beside a diffusers model's own weights is not read as
    // part of the model, and the run names it.
    let dir = tempfile::tempdir().expect("temp dir");
    let folder = transformer_with_a_stray(dir.path());
    let inspected = stagehand_on(&["inspect"], &folder, &[]);
    let stdout = String::from_utf8_lossy(&inspected.stdout);
    assert!(inspected.status.success(), "{stdout}");
    assert!(stdout.contains("files    1"), "{stdout}");
    assert!(!stdout.contains("latents.safetensors"), "{stdout}");
    let run = stagehand_on(&["run", "--steps", "1", "--model"], &folder, &[]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(
        stderr.contains("left out latents.safetensors beside the model's weights diffusion_pytorch_model.safetensors"),
        "{stderr}"
    );
}

#[test]
fn two_files_of_a_folder_that_are_not_one_model_are_both_named() {
    // Proves a folder whose .safetensors files hold the same tensor (a stray beside a
    // bare checkpoint) names both files and says to move the stray out.
    let dir = tempfile::tempdir().expect("temp dir");
    let spec: [common::Spec<'_>; 2] = [
        ("latent", Dtype::F32, &[4, 4]),
        ("blocks.0.weight", Dtype::F32, &[4, 4]),
    ];
    write_safetensors(&dir.path().join("init.safetensors"), &spec[..1], None);
    write_safetensors(&dir.path().join("weights.safetensors"), &spec, None);
    let first = dir.path().join("init.safetensors").display().to_string();
    let second = dir.path().join("weights.safetensors").display().to_string();
    let inspected = stagehand_on(&["inspect"], dir.path(), &[]);
    assert_bad_input(
        &inspected,
        &[
            "tensor `latent` is in both",
            first.as_str(),
            second.as_str(),
            "move the file that is not the model's out of the folder",
        ],
    );
}
