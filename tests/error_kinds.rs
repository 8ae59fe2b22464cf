//! The library's errors as an embedder sees them: it matches on the kind (a budget too
//! small, a corrupt checkpoint, an unknown model type, a missing folder, a refused
//! setting), never on the words, and a budget refusal's figures are ones that work.

use std::error::Error as _;
use std::path::{Path, PathBuf};

use stagehand::actors::ResidencyPolicy;
use stagehand::compute::DType;
use stagehand::families::bert::{write_bert_folder, BertDemo, BertPreset};
use stagehand::families::llama::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::model::IndexError;
use stagehand::run::{
    execute, prepare, Budget, Budgets, Outcome, Prepared, RunError, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

const KIB: u64 = 1024;

/// 8 blocks of 512 KiB (2 layers of 256×256 f32 each).
fn demo_model(dir: &Path) -> PathBuf {
    let spec = DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim: 256,
        seed: 7,
    };
    write_linear_stack(dir, &spec).expect("demo model")
}

/// A generated tiny BERT folder (f32 weights).
fn tiny_bert(dir: &Path) -> PathBuf {
    let demo = BertDemo {
        preset: BertPreset::Tiny,
        dtype: DType::F32,
        ..BertDemo::default()
    };
    write_bert_folder(dir, &demo).expect("bert folder")
}

/// A generated tiny Llama folder (f32 weights).
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

fn run(prepared: &Prepared, settings: &Settings, budgets: Budgets) -> Result<Outcome, RunError> {
    let plan = RunPlan {
        prefetch_depth: 2,
        policy: ResidencyPolicy::Planned,
        ..RunPlan::new(settings, budgets, 2)
    };
    execute(prepared, plan)
}

/// Runs `budgets`, expects a refusal of `expected` and retries at its least figure,
/// which must get past it; returns that figure.
fn refused_then_run_at_least(
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
    expected: Budget,
) -> u64 {
    let error = run(prepared, settings, budgets).err().expect("refused");
    assert!(error.is_bad_input(), "{error}");
    assert_eq!(error.exit_code(), 2);
    let RunError::BudgetTooSmall {
        budget,
        given_bytes,
        least_bytes,
        ref message,
        ..
    } = error
    else {
        panic!("expected a budget too small, got {error:?}");
    };
    println!("{message}");
    assert_eq!(budget, expected, "{message}");
    let given = match budget {
        Budget::Vram => budgets.vram_budget_bytes,
        _ => budgets.pin_ceiling_bytes,
    };
    assert_eq!(given_bytes, given, "{message}");
    assert!(least_bytes > given_bytes, "{message}");
    assert!(message.contains(budget.flag()), "{message}");
    // The cause is the plan's own error, typed.
    let cause = error.source().expect("a source");
    assert!(
        cause
            .downcast_ref::<stagehand::actors::SessionError>()
            .is_some(),
        "{cause:?}"
    );
    let retried = match budget {
        Budget::Vram => Budgets {
            vram_budget_bytes: least_bytes,
            ..budgets
        },
        _ => Budgets {
            pin_ceiling_bytes: least_bytes,
            ..budgets
        },
    };
    let outcome = run(prepared, settings, retried);
    assert!(
        outcome.is_ok(),
        "the least figure {least_bytes} did not run: {:?}",
        outcome.err()
    );
    least_bytes
}

#[test]
fn a_vram_budget_below_the_ring_names_the_least_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let settings = settings();
    let prepared = prepare(&model, WorkloadKind::Auto, 2, &settings, false).unwrap();
    let budgets = Budgets {
        vram_budget_bytes: 1024 * KIB,
        pin_ceiling_bytes: 4096 * KIB,
    };
    let least = refused_then_run_at_least(&prepared, &settings, budgets, Budget::Vram);
    // A ring of 3 slots of 512 KiB (prefetch depth 2).
    assert_eq!(least, 3 * 512 * KIB);
}

#[test]
fn a_pin_ceiling_below_the_staging_ring_names_the_least_that_works() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let settings = settings();
    let prepared = prepare(&model, WorkloadKind::Auto, 2, &settings, false).unwrap();
    let budgets = Budgets {
        vram_budget_bytes: 2560 * KIB,
        pin_ceiling_bytes: 600 * KIB,
    };
    refused_then_run_at_least(&prepared, &settings, budgets, Budget::PinCeiling);
}

#[test]
fn an_encoders_least_vram_budget_runs() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_bert(dir.path());
    let settings = settings();
    let prepared = prepare(&folder, WorkloadKind::Auto, 2, &settings, false).unwrap();
    let budgets = Budgets {
        vram_budget_bytes: 64 * KIB,
        pin_ceiling_bytes: 64 * 1024 * KIB,
    };
    refused_then_run_at_least(&prepared, &settings, budgets, Budget::Vram);
}

#[test]
fn a_decoders_least_vram_budget_counts_its_kv_reserve() {
    // Proves the least figure is the whole flag's value where the run sets room aside
    // (a decoder's first KV pages) before it plans the weights in the rest.
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_decoder(dir.path());
    let settings = settings();
    let prepared = prepare(&folder, WorkloadKind::Auto, 1, &settings, false).unwrap();
    let budgets = Budgets {
        vram_budget_bytes: 1024 * KIB,
        pin_ceiling_bytes: 64 * 1024 * KIB,
    };
    refused_then_run_at_least(&prepared, &settings, budgets, Budget::Vram);
}

#[test]
fn a_corrupt_header_is_a_corrupt_checkpoint_with_its_index_error_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let mut bytes = std::fs::read(&model).unwrap();
    // The header's JSON starts after its 8-byte length: break its first brace.
    bytes[8] = b'#';
    std::fs::write(&model, &bytes).unwrap();
    let error = prepare(&model, WorkloadKind::Auto, 2, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::CorruptCheckpoint { ref path, .. } = error else {
        panic!("expected a corrupt checkpoint, got {error:?}");
    };
    assert_eq!(path, &model);
    let cause = error.source().expect("a source");
    assert!(cause.downcast_ref::<IndexError>().is_some(), "{cause:?}");
}

#[test]
fn a_truncated_checkpoint_is_a_corrupt_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let length = std::fs::metadata(&model).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap();
    file.set_len(length / 2).unwrap();
    let error = prepare(&model, WorkloadKind::Auto, 2, &settings(), false)
        .err()
        .expect("refused");
    let RunError::CorruptCheckpoint { path, message, .. } = error else {
        panic!("expected a corrupt checkpoint, got {error:?}");
    };
    assert_eq!(path, model, "{message}");
}

#[test]
fn an_unknown_model_type_is_an_unsupported_model_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_bert(dir.path());
    let config_path = folder.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["model_type"] = "mamba".into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let error = prepare(&folder, WorkloadKind::Auto, 2, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::UnsupportedModel { path, found, .. } = error else {
        panic!("expected an unsupported model, got {error:?}");
    };
    assert_eq!(found, "mamba");
    assert_eq!(path, config_path);
}

#[test]
fn a_quantization_no_family_computes_is_an_unsupported_model_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let folder = tiny_decoder(dir.path());
    let config_path = folder.join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
    config["quantization_config"] = serde_json::json!({"quant_method": "gptq", "bits": 4});
    std::fs::write(&config_path, config.to_string()).unwrap();
    let error = prepare(&folder, WorkloadKind::Auto, 1, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::UnsupportedModel { found, message, .. } = error else {
        panic!("expected an unsupported model, got {error:?}");
    };
    assert_eq!(found, "gptq", "{message}");
}

#[test]
fn a_missing_folder_is_a_missing_file() {
    let dir = tempfile::tempdir().unwrap();
    let gone = dir.path().join("no-such-model");
    let error = prepare(&gone, WorkloadKind::Auto, 2, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::MissingFile { path, .. } = error else {
        panic!("expected a missing file, got {error:?}");
    };
    assert_eq!(path, gone);
}

#[test]
fn a_bad_block_pattern_is_a_refused_setting_named_by_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let settings = Settings {
        block_pattern: Some("([".to_string()),
        ..settings()
    };
    let error = prepare(&model, WorkloadKind::Auto, 2, &settings, false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::BadSetting { key, message } = error else {
        panic!("expected a refused setting, got {error:?}");
    };
    assert_eq!(key, "block_pattern", "{message}");
}

#[test]
fn a_compute_dtype_cuda_cannot_do_is_a_missing_capability() {
    // Proves a setting the GPU path cannot compute is refused by kind before any
    // device is opened (so this holds with or without a GPU).
    let dir = tempfile::tempdir().unwrap();
    let model = demo_model(dir.path());
    let settings = Settings {
        compute_dtype: stagehand::compute::ComputeDtype::Bf16,
        ..settings()
    };
    let prepared = prepare(&model, WorkloadKind::Auto, 2, &settings, false).unwrap();
    let budgets = Budgets {
        vram_budget_bytes: 2560 * KIB,
        pin_ceiling_bytes: 4096 * KIB,
    };
    let error = stagehand::run::execute_cuda(&prepared, RunPlan::new(&settings, budgets, 1))
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::MissingCapability { capability, .. } = error else {
        panic!("expected a missing capability, got {error:?}");
    };
    // With the cuda feature the dtype is refused; without it, CUDA itself is.
    assert!(
        capability == "compute_dtype" || capability == "cuda",
        "{capability}"
    );
}

#[test]
fn a_folder_of_several_index_files_is_an_unsupported_model_saying_so() {
    // Proves a checkpoint the index cannot read as one model (here two index files to
    // choose from) is `UnsupportedModel` with `found` saying what it is, exit 2: it
    // was a `BadInput` string.
    let dir = tempfile::tempdir().unwrap();
    demo_model(dir.path());
    let model = dir.path().to_path_buf();
    for name in ["a.safetensors.index.json", "b.safetensors.index.json"] {
        std::fs::write(model.join(name), r#"{"weight_map": {}}"#).unwrap();
    }
    let error = prepare(&model, WorkloadKind::Auto, 2, &settings(), false)
        .err()
        .expect("refused");
    assert_eq!(error.exit_code(), 2);
    let RunError::UnsupportedModel {
        path,
        found,
        message,
        ..
    } = error
    else {
        panic!("expected an unsupported model, got {error:?}");
    };
    assert_eq!(path, model);
    assert!(found.contains("2 index files"), "{found}");
    assert!(message.contains("pass the one you mean"), "{message}");
}
