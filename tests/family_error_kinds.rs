//! A model family's refusals as an embedder sees them: a checkpoint lacking a tensor,
//! a `config.json` value refused, a prompt longer than the model takes and a pipeline
//! request out of range are told apart by kind and by the name they carry (the
//! tensor, the key, the field), never by their words.

use std::error::Error as _;
use std::path::{Path, PathBuf};

use stagehand::compute::DType;
use stagehand::families::llama::{
    write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset, ExpertHint, Sampling,
};
use stagehand::families::{DecoderInput, FamilyError, PromptInput};
use stagehand::pipeline::{generate, FluxParts, ImageRequest, PipelineError, PipelineRun};
use stagehand::run::{prepare, prepare_with, Extras, RunError, WorkloadKind};
use stagehand::settings::Settings;

/// A generated tiny Llama folder (f32 weights, one file).
fn tiny_decoder(dir: &Path) -> PathBuf {
    let demo = DecoderDemo {
        arch: DecoderArch::Llama,
        preset: DecoderPreset::Tiny,
        dtype: DType::F32,
        seed: 3,
        shard_bytes: 1 << 30,
    };
    write_decoder_folder(dir, &demo).expect("decoder folder")
}

fn settings() -> Settings {
    Settings {
        device: stagehand::settings::DeviceKind::Cpu,
        ..Settings::default()
    }
}

/// The one safetensors file of `folder`.
fn weights_of(folder: &Path) -> PathBuf {
    std::fs::read_dir(folder)
        .expect("the folder")
        .map(|entry| entry.expect("an entry").path())
        .find(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .expect("a safetensors file")
}

/// Sets `key` of `folder`'s `config.json` to `value`.
fn set_config(folder: &Path, key: &str, value: serde_json::Value) {
    let path = folder.join("config.json");
    let text = std::fs::read_to_string(&path).expect("config.json");
    let mut config: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    config[key] = value;
    std::fs::write(&path, config.to_string()).expect("writes config.json");
}

#[test]
fn a_checkpoint_without_a_tensor_is_corrupt_naming_the_tensor_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_decoder(dir.path());
    let weights = weights_of(&folder);
    // Rename the final norm in the header (same length, so every offset stays): the
    // file parses, but the tensor the model needs is not in it.
    let mut bytes = std::fs::read(&weights).unwrap();
    let header_bytes = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + header_bytes].to_vec()).unwrap();
    let renamed = header.replace("\"model.norm.weight\"", "\"model.norm.weighx\"");
    assert_ne!(header, renamed, "the tiny decoder has model.norm.weight");
    bytes[8..8 + header_bytes].copy_from_slice(renamed.as_bytes());
    std::fs::write(&weights, &bytes).unwrap();

    let error = prepare(&folder, WorkloadKind::Auto, 1, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::CorruptCheckpoint { ref path, .. } = error else {
        panic!("expected a corrupt checkpoint, got {error:?}");
    };
    assert_eq!(path, &weights);
    let cause = error.source().expect("the family's error");
    let Some(FamilyError::MissingTensor { name, path, .. }) = cause.downcast_ref() else {
        panic!("expected a missing tensor behind it, got {cause:?}");
    };
    assert_eq!(name, "model.norm.weight");
    assert_eq!(path, &weights);
}

#[test]
fn a_refused_config_value_names_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_decoder(dir.path());
    set_config(&folder, "num_attention_heads", serde_json::json!(0));
    let error = prepare(&folder, WorkloadKind::Auto, 1, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::UnsupportedModel { ref found, .. } = error else {
        panic!("expected an unsupported model, got {error:?}");
    };
    assert_eq!(found, "num_attention_heads");
    let cause = error.source().expect("the family's error");
    let Some(FamilyError::BadConfig { key, path, .. }) = cause.downcast_ref() else {
        panic!("expected a refused config value behind it, got {cause:?}");
    };
    assert_eq!(key.as_deref(), Some("num_attention_heads"));
    assert_eq!(path, &folder.join("config.json"));
}

#[test]
fn a_prompt_longer_than_the_model_takes_is_a_refused_request_naming_the_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_decoder(dir.path());
    set_config(&folder, "max_position_embeddings", serde_json::json!(8));
    let extras = Extras::default().with(DecoderInput {
        prompt: PromptInput::TokenIds(vec![1; 16]),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    });
    let error = prepare_with(
        &folder,
        WorkloadKind::Decoder,
        1,
        &settings(),
        false,
        &extras,
    )
    .err()
    .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::BadRequest { field, message, .. } = error else {
        panic!("expected a refused request, got {error:?}");
    };
    assert_eq!(field, "prompt", "{message}");
}

#[test]
fn a_pipeline_request_out_of_range_names_its_field() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/flux-tiny");
    let parts = FluxParts::open(&fixture).expect("a Flux pipeline");
    let settings = settings();
    let run = PipelineRun::quiet(&settings);
    let request = ImageRequest {
        prompt: "a lighthouse".to_string(),
        width: 48,
        height: 64,
        steps: 0,
        guidance: None,
        seed: 0,
        count: 1,
        max_sequence_length: 16,
        latents: None,
        vae_tile: None,
        init: None,
    };
    let error = generate(&parts, &request, &run).err().expect("refused");
    assert!(error.is_bad_input());
    let PipelineError::BadField { field, .. } = error else {
        panic!("expected a refused field, got {error:?}");
    };
    assert_eq!(field, "steps");
    // Serve answers with the run's kind, the field kept.
    let width = ImageRequest {
        width: 50,
        steps: 2,
        ..request
    };
    let error = RunError::from(generate(&parts, &width, &run).err().expect("refused"));
    assert_eq!(error.exit_code(), 2);
    let RunError::BadRequest { field, .. } = error else {
        panic!("expected a refused request, got {error:?}");
    };
    assert_eq!(field, "width");
}
