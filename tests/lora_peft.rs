//! `--lora DIR` with PEFT adapter folders as `peft` saves them: the adapters under
//! `tests/fixtures/encoders/` were written by peft's `save_pretrained`
//! (`scripts/make-encoder-fixtures.py`), with what the adapted model computes in
//! PyTorch. A decoder (generate) and an encoder (embed) give those outputs within the
//! stated tolerance, streamed; folders that do not fit the model are refused by name.

mod common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::decoder::decoder_plan;
use common::reference::{float_rows, floats, ids, json, largest_difference};
use common::{assert_bad_input, stagehand};
use serde_json::Value;
use stagehand::actors::ResidencyPolicy;
use stagehand::families::llama::{ExpertHint, Sampling};
use stagehand::lora::LoraSpec;
use stagehand::run::{
    execute, lora_region_bytes, no_observer, prepare_with, DecoderInput, Extras, PromptInput,
    WorkloadKind,
};
use stagehand::settings::Settings;

/// Largest difference allowed from PyTorch's logits with the adapter applied (f32,
/// other summation orders, and the low-rank path on streamed layers). Measured: 6.1e-6.
const LOGIT_TOLERANCE: f32 = 1e-4;
/// The same for an embedding value (normalised embeddings). Measured: 1.4e-6 streamed,
/// 9.8e-7 resident.
const EMBEDDING_TOLERANCE: f32 = 1e-5;

fn repo(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

#[test]
fn a_peft_folder_on_a_decoder_gives_the_adapted_models_tokens_and_logits() {
    // Proves a folder peft saved (q/k/v/o, r 4, alpha 16) attaches to the llama3
    // fixture streamed below its size: PyTorch's 16 greedy tokens, its logits within
    // LOGIT_TOLERANCE.
    let adapter = repo("tests/fixtures/encoders/peft-llama3");
    let reference = json(&adapter.join("reference.json"));
    let prompt = ids(&reference["prompt"]);
    let tokens = ids(&reference["tokens"]);
    let settings = Settings::default();
    let extras = Extras {
        loras: vec![LoraSpec {
            path: adapter.clone(),
            strength: 1.0,
        }],
        ..Extras::default()
    }
    .with(DecoderInput {
        prompt: PromptInput::TokenIds(prompt),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    });
    let model = repo("tests/fixtures/decoders/llama3");
    let prepared =
        prepare_with(&model, WorkloadKind::Decoder, 1, &settings, false, &extras).unwrap();
    let steps = tokens.len() as u64;
    // The least plan at depth 1, the KV cache and the adapter's own region.
    let vram = prepared.plan_minimum_bytes(1, ResidencyPolicy::Planned).0
        + prepared.activation_bytes(steps)
        + lora_region_bytes(&prepared, 1);
    let mut plan = decoder_plan(&settings, vram, steps, no_observer());
    plan.prefetch_depth = 1;
    plan.keep_outputs = true;
    let outcome = execute(&prepared, plan).unwrap();
    let report = &outcome.report;
    assert_eq!(report.tokens, tokens, "the adapted model's greedy tokens");
    let logits: Vec<Vec<f32>> = (0..steps)
        .map(|step| report.outputs[&step].clone())
        .collect();
    let worst = largest_difference(&logits, &float_rows(&reference["logits"]));
    eprintln!("peft-llama3: largest logit difference from PyTorch {worst:e}");
    assert!(worst <= LOGIT_TOLERANCE, "logits differ by {worst}");
    assert!(
        report.stats.pinned_to_vram.model_bytes > outcome.model_bytes,
        "streamed"
    );
}

fn embed(model: &Path, adapter: &Path, texts: &[String], budget: &str) -> Output {
    let mut command = stagehand();
    command
        .args([
            "embed", "--json", "--quiet", "--log", "error", "--device", "cpu",
        ])
        .args(["--batch", "3", "--vram-budget", budget, "--model"])
        .arg(model)
        .arg("--lora")
        .arg(adapter)
        .args(texts);
    command.output().unwrap()
}

#[test]
fn a_peft_folder_on_an_encoder_gives_sentence_transformers_adapted_embeddings() {
    // Proves an rsLoRA adapter (scale alpha / sqrt(r)) peft saved for bert-mean gives
    // the embeddings sentence-transformers computes with it merged, resident or streamed.
    let adapter = repo("tests/fixtures/encoders/peft-bert");
    let reference = json(&adapter.join("reference.json"));
    let texts: Vec<String> = reference["texts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|text| text.as_str().unwrap().to_string())
        .collect();
    let model = repo("tests/fixtures/encoders/bert-mean");
    for budget in ["64MiB", "64KiB"] {
        let output = embed(&model, &adapter, &texts, budget);
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let embedded: Value = serde_json::from_slice(&output.stdout).unwrap();
        let ours: Vec<Vec<f32>> = embedded["texts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|text| floats(&text["embedding"]))
            .collect();
        let worst = largest_difference(&ours, &float_rows(&reference["embeddings"]));
        eprintln!("peft-bert at {budget}: largest difference {worst:e}");
        assert!(worst <= EMBEDDING_TOLERANCE, "{budget}: {worst}");
    }
}

/// A change made to a copied adapter_config.json.
type ConfigEdit = fn(&mut Value);

/// The llama3 adapter folder copied into `dir` with its config edited.
fn edited_adapter(dir: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let source = repo("tests/fixtures/encoders/peft-llama3");
    let target = dir.join(name);
    std::fs::create_dir_all(&target).unwrap();
    std::fs::copy(
        source.join("adapter_model.safetensors"),
        target.join("adapter_model.safetensors"),
    )
    .unwrap();
    let mut config = json(&source.join("adapter_config.json"));
    edit(&mut config);
    std::fs::write(target.join("adapter_config.json"), config.to_string()).unwrap();
    target
}

fn generate(adapter: &Path) -> Output {
    stagehand()
        .args(["generate", "--quiet", "--log", "error", "--device", "cpu"])
        .args(["--token-ids", "1,17,42", "--max-tokens", "2", "--model"])
        .arg(repo("tests/fixtures/decoders/llama3"))
        .arg("--lora")
        .arg(adapter)
        .output()
        .unwrap()
}

#[test]
fn folders_that_do_not_fit_the_model_are_refused_by_name() {
    // Proves each bad PEFT folder exits 2 with one line naming the file and the key:
    // no adapter_config.json, a pickle only, a base named for another architecture,
    // targets that match no weight, DoRA, modules_to_save, an r the factors do not have.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    assert_bad_input(&generate(&empty), &["empty", "adapter_config.json"]);
    let pickle = edited_adapter(dir.path(), "pickle", |_| {});
    std::fs::rename(
        pickle.join("adapter_model.safetensors"),
        pickle.join("adapter_model.bin"),
    )
    .unwrap();
    assert_bad_input(&generate(&pickle), &["adapter_model.bin", "safetensors"]);
    let cases: [(&str, ConfigEdit, &[&str]); 5] = [
        (
            "bert-base",
            |config| config["base_model_name_or_path"] = "google-bert/bert-base-uncased".into(),
            &["base_model_name_or_path", "bert", "`llama`"],
        ),
        (
            "targets",
            |config| config["target_modules"] = serde_json::json!(["q_proj", "query"]),
            &["target_modules", "\"query\"", "matches no weight"],
        ),
        (
            "dora",
            |config| config["use_dora"] = true.into(),
            &["use_dora", "does not implement"],
        ),
        (
            "saved-modules",
            |config| config["modules_to_save"] = serde_json::json!(["lm_head"]),
            &["modules_to_save"],
        ),
        (
            "rank",
            |config| config["r"] = 8.into(),
            &["r is 8", "rank 4"],
        ),
    ];
    for (name, edit, expected) in cases {
        let adapter = edited_adapter(dir.path(), name, edit);
        let mut needles = vec!["adapter_config.json"];
        needles.extend_from_slice(expected);
        assert_bad_input(&generate(&adapter), &needles);
    }
    // The unedited copy runs: the refusals are the edits'.
    let plain = edited_adapter(dir.path(), "plain", |_| {});
    let output = generate(&plain);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
