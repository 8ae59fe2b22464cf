//! A model family's refusals as an embedder sees them: a checkpoint lacking a tensor,
//! a `config.json` value refused, a prompt longer than the model takes and a pipeline
//! request out of range are told apart by kind and by the name they carry (the
//! tensor, the key, the field), never by their words; so are a step that found no
//! room, stagehand's own bugs and a decoder asked to embed.

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

#[test]
fn a_steps_no_room_is_its_own_kind_and_a_detached_copy_keeps_it() {
    // Proves a step that found no room in the budget is `NoRoom` (exit 1, not the
    // caller's input: serve answers 503), and that the copy each job of an embedding
    // batch gets keeps the kind, its figures and its words without the source chain
    // (each job got a `BadInput` string).
    let error = RunError::from(FamilyError::NoRoom("the KV cache does not fit".into()));
    assert!(!error.is_bad_input());
    assert_eq!(error.exit_code(), 1);
    assert!(
        error.source().is_some(),
        "the family's error stays the source"
    );
    let copy = error.detached();
    let RunError::NoRoom { message, source } = &copy else {
        panic!("expected no room, got {copy:?}");
    };
    assert_eq!(message, "the KV cache does not fit");
    assert!(source.is_none());
    let starved = RunError::from(FamilyError::Session(
        stagehand::actors::SessionError::Starved {
            block: stagehand::actors::BlockId(3),
            attempts: 4,
        },
    ));
    assert!(matches!(starved.detached(), RunError::NoRoom { .. }));

    let budget = RunError::from(FamilyError::Session(
        stagehand::actors::SessionError::NoPlace {
            block: stagehand::actors::BlockId(0),
            bytes: 10,
            reason: "held".into(),
            needed: stagehand::actors::Bytes(4 << 20),
        },
    ));
    let RunError::BudgetTooSmall {
        least_bytes,
        message,
        ..
    } = budget.detached()
    else {
        panic!("expected a budget refusal, got {budget:?}");
    };
    assert_eq!(message, budget.to_string());
    assert!(least_bytes >= 4 << 20, "{least_bytes}");
}

#[test]
fn a_broken_rule_of_stagehands_own_is_internal_not_the_callers_input() {
    // Proves stagehand's own bugs (a shape its parts disagree on, a streamed result
    // that is not the reference's, a session asked out of order) are `Internal`,
    // exit 1, and an activation too large for memory is `NotEnoughMemory`: they were
    // `Failed` or, while the model was opened, `BadInput` strings.
    use stagehand::compute::ComputeError;
    let bugs = [
        FamilyError::Compute(ComputeError::Shape("q: [2, 3] vs [3, 2]".into())),
        FamilyError::Mismatch {
            step: 0,
            index: 1,
            got: 1.0,
            expected: 2.0,
        },
        FamilyError::Session(stagehand::actors::SessionError::Stopped),
    ];
    for bug in bugs {
        let words = bug.to_string();
        let error = RunError::from(bug);
        assert!(
            matches!(&error, RunError::Internal { message, .. } if *message == words),
            "{error:?}"
        );
        assert_eq!(error.exit_code(), 1);
    }
    let memory = RunError::from(FamilyError::Compute(ComputeError::OutOfMemory(
        "an activation of 9 × 9 f32 does not fit in host memory; lower --batch".into(),
    )));
    assert!(
        matches!(memory, RunError::NotEnoughMemory { .. }),
        "{memory:?}"
    );
}

#[test]
fn a_decoder_asked_to_embed_refuses_the_model_field() {
    // Proves a kept-loaded decoder sent an embedding job answers `BadRequest` naming
    // `model` (exit 2, serve's 400), not a `BadInput` string, and keeps serving.
    use stagehand::families::EncoderInput;
    use stagehand::run::loaded::{
        serve_jobs, BatchLimits, Cancel, EmbedJob, Job, LoadedOptions, NoBatchObserver,
    };
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_decoder(dir.path());
    let prepared = prepare(&folder, WorkloadKind::Auto, 1, &settings(), false).expect("opens");
    let (jobs, queue) = flume::bounded(4);
    let (ready, started) = flume::bounded(1);
    let worker = std::thread::spawn(move || {
        let settings = settings();
        let options = LoadedOptions {
            settings: &settings,
            limits: BatchLimits {
                max_sequences: 1,
                max_batch_tokens: 64,
                max_sequence_tokens: 16,
            },
            observer: stagehand::run::no_observer(),
            batches: Box::new(NoBatchObserver),
            shared: None,
        };
        serve_jobs(prepared, options, queue, |info| {
            let _ = ready.send(info.map(|_| ()));
        })
    });
    started.recv().unwrap().expect("the decoder runs");
    let (reply, answer) = flume::bounded(1);
    let job = EmbedJob {
        input: EncoderInput::TokenIds(vec![vec![1, 2]]),
        adapter: None,
        reply,
        cancel: Cancel::new(),
    };
    jobs.send(Job::Embed(job)).unwrap();
    let Err(error) = answer.recv().unwrap() else {
        panic!("the decoder embedded");
    };
    assert_eq!(error.exit_code(), 2);
    let RunError::BadRequest { field, message, .. } = error else {
        panic!("expected a refused request, got {error:?}");
    };
    assert_eq!(field, "model");
    assert!(message.contains("it does not embed"), "{message}");
    drop(jobs);
    let stats = worker.join().unwrap().expect("the model stops cleanly");
    assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
}
