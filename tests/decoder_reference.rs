//! Decoders against what transformers itself computed: the folders under
//! `tests/fixtures/decoders/` were written by transformers 5 (`save_pretrained`, so
//! their `config.json` carries `rope_parameters` and `dtype`) with the logits and 16
//! greedy tokens it computed for a fixed prompt (`scripts/make-decoder-fixtures.py`,
//! which needs PyTorch; these tests only read the files). Each runs streamed under a
//! VRAM budget below the model, verified bit for bit against its resident pass, and
//! must pick transformers' tokens with logits within [`LOGIT_TOLERANCE`]; the same
//! folder with its config rewritten in transformers 4's layout must compute the same
//! bits.

mod common;

use std::path::{Path, PathBuf};

use common::decoder::decoder_plan;
use serde_json::Value;
use stagehand::actors::ResidencyPolicy;
use stagehand::families::llama::{ExpertHint, Sampling};
use stagehand::run::{
    execute, no_observer, prepare_with, DecoderInput, Extras, PromptInput, WorkloadKind,
};
use stagehand::settings::Settings;

/// Largest difference allowed between a logit of stagehand's and transformers' (both
/// f32; they sum in other orders). Measured: at most 1.4e-5 (llama-biases, whose
/// logits reach ±30), 1.1e-5 elsewhere.
const LOGIT_TOLERANCE: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/decoders")
        .join(name)
}

struct Reference {
    prompt: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn reference(folder: &Path) -> Reference {
    let text = std::fs::read_to_string(folder.join("reference.json")).unwrap();
    let value: Value = serde_json::from_str(&text).unwrap();
    let ids = |key: &str| -> Vec<u32> {
        value[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect()
    };
    Reference {
        prompt: ids("prompt"),
        tokens: ids("tokens"),
        logits: value["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| {
                row.as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect()
            })
            .collect(),
    }
}

/// What a streamed run of `folder` computed: per step its logits, and the tokens.
struct Run {
    logits: Vec<Vec<f32>>,
    tokens: Vec<u32>,
    /// Weight bytes that crossed to VRAM over the run, and the model's.
    moved_bytes: u64,
    model_bytes: u64,
}

fn run(folder: &Path, prompt: &[u32], steps: u64) -> Run {
    let settings = Settings::default();
    let extras = Extras::default().with(DecoderInput {
        prompt: PromptInput::TokenIds(prompt.to_vec()),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    });
    let prepared =
        prepare_with(folder, WorkloadKind::Decoder, 1, &settings, false, &extras).unwrap();
    // The planner's least budget at prefetch depth 1 (two ring slots: these models
    // have two layers and a head) and the KV cache: blocks cross the bus every step.
    let vram = prepared.plan_minimum_bytes(1, ResidencyPolicy::Planned).0
        + prepared.activation_bytes(steps);
    let mut plan = decoder_plan(&settings, vram, steps, no_observer());
    plan.prefetch_depth = 1;
    plan.keep_outputs = true;
    let outcome = execute(&prepared, plan).unwrap();
    let report = &outcome.report;
    assert_eq!(
        report.verified_steps,
        steps,
        "{}: every step bit for bit against the resident pass",
        folder.display()
    );
    Run {
        logits: (0..steps)
            .map(|step| report.outputs[&step].clone())
            .collect(),
        tokens: report.tokens.clone(),
        moved_bytes: report.stats.pinned_to_vram.model_bytes,
        model_bytes: outcome.model_bytes,
    }
}

/// Runs the fixture `name` and holds it against transformers; returns the run.
fn matches_transformers(name: &str) -> Run {
    let folder = fixture(name);
    let expected = reference(&folder);
    let steps = expected.tokens.len() as u64;
    let ran = run(&folder, &expected.prompt, steps);
    assert!(
        ran.moved_bytes > ran.model_bytes,
        "{name}: streamed, the budget too small to keep it ({} B moved for a {} B model)",
        ran.moved_bytes,
        ran.model_bytes
    );
    let worst = ran
        .logits
        .iter()
        .zip(&expected.logits)
        .flat_map(|(ours, theirs)| {
            assert_eq!(ours.len(), theirs.len(), "{name}: vocabulary");
            ours.iter().zip(theirs).map(|(a, b)| (a - b).abs())
        })
        .fold(0.0f32, f32::max);
    eprintln!("{name}: largest logit difference from transformers {worst:e}");
    assert!(
        worst <= LOGIT_TOLERANCE,
        "{name}: logits differ from transformers' by {worst}"
    );
    assert_eq!(ran.tokens, expected.tokens, "{name}: greedy tokens");
    ran
}

/// The fixture's folder copied into `dir` with its config in transformers 4's layout:
/// `rope_theta` and `rope_scaling` at the top level, `torch_dtype` for `dtype`.
fn in_v4_layout(name: &str, dir: &Path) -> PathBuf {
    let source = fixture(name);
    let target = dir.join(name);
    std::fs::create_dir_all(&target).unwrap();
    for file in ["model.safetensors", "reference.json"] {
        std::fs::copy(source.join(file), target.join(file)).unwrap();
    }
    let text = std::fs::read_to_string(source.join("config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    let object = config.as_object_mut().unwrap();
    if let Some(Value::Object(mut rope)) = object.remove("rope_parameters") {
        if let Some(theta) = rope.remove("rope_theta") {
            object.insert("rope_theta".into(), theta);
        }
        if rope.get("rope_type").and_then(Value::as_str) != Some("default") {
            object.insert("rope_scaling".into(), Value::Object(rope));
        }
    }
    if let Some(dtype) = object.remove("dtype") {
        object.insert("torch_dtype".into(), dtype);
    }
    std::fs::write(target.join("config.json"), config.to_string()).unwrap();
    target
}

/// The fixture in both layouts: transformers' tokens and logits, the same bits.
fn both_layouts(name: &str) {
    let v5 = matches_transformers(name);
    let dir = tempfile::tempdir().unwrap();
    let folder = in_v4_layout(name, dir.path());
    let expected = reference(&folder);
    let v4 = run(&folder, &expected.prompt, expected.tokens.len() as u64);
    assert_eq!(v4.tokens, v5.tokens, "{name}: transformers 4 layout");
    assert!(
        v4.logits
            .iter()
            .flatten()
            .zip(v5.logits.iter().flatten())
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "{name}: both layouts compute the same bits"
    );
}

#[test]
fn llama3_with_rope_parameters_matches_transformers() {
    // Proves Llama 3's `llama3` rope scaling read from transformers 5's
    // `rope_parameters` (and from 4's `rope_scaling`) computes what transformers does.
    both_layouts("llama3");
}

#[test]
fn linear_rope_scaling_matches_transformers() {
    // Proves `rope_type: linear` divides the frequencies by its factor.
    both_layouts("llama-linear");
}

#[test]
fn dynamic_rope_scaling_past_max_positions_matches_transformers() {
    // Proves `rope_type: dynamic` recomputes the base per step once the sequence
    // outgrows max_position_embeddings (16 here; the run reaches 23 tokens), keeping
    // the keys already cached as transformers' cache does.
    both_layouts("llama-dynamic");
}

#[test]
fn yarn_rope_scaling_matches_transformers() {
    // Proves `rope_type: yarn`: the ramped frequencies and the attention factor.
    both_layouts("llama-yarn");
}

#[test]
fn llama_biases_and_tied_embeddings_match_transformers() {
    // Proves `attention_bias` (q, k, v and o), `mlp_bias` and `tie_word_embeddings`.
    both_layouts("llama-biases");
}

#[test]
fn mistral_inside_its_sliding_window_matches_transformers() {
    // Proves a Mistral folder with `sliding_window` runs while the sequence fits it.
    both_layouts("mistral");
}

#[test]
fn qwen2_with_qkv_biases_matches_transformers() {
    both_layouts("qwen2");
}

#[test]
fn qwen3_with_per_head_qk_norms_matches_transformers() {
    // Proves Qwen3's q_norm/k_norm and a head_dim wider than hidden / heads.
    both_layouts("qwen3");
}

#[test]
fn qwen3_moe_matches_transformers() {
    // Proves Qwen3-MoE's routing (softmax, top-k, renormalised with norm_topk_prob)
    // through the expert cache, and its experts' own width.
    both_layouts("qwen3-moe");
}

#[test]
fn qwen3_moe_with_a_sparse_step_matches_transformers() {
    // Proves `decoder_sparse_step` 2 (layer 0 dense, layer 1 experts) with
    // `norm_topk_prob` false.
    both_layouts("qwen3-moe-sparse-step");
}

#[test]
fn qwen2_moe_with_its_shared_expert_matches_transformers() {
    // Proves Qwen2-MoE: `mlp_only_layers` [0], the shared expert under its sigmoid
    // gate, and unnormalised top-k weights.
    both_layouts("qwen2-moe");
}

#[test]
fn mixtral_matches_transformers() {
    both_layouts("mixtral");
}
