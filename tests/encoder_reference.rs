//! Encoders against what sentence-transformers itself computed: the folders under
//! `tests/fixtures/encoders/` were written by transformers and sentence-transformers
//! (seeded random weights, hidden 32, 2 layers) with the embeddings
//! sentence-transformers `encode` computed for fixed texts in batches of 3
//! (`scripts/make-encoder-fixtures.py`, which needs PyTorch; these tests only read the
//! files). Each runs streamed under a VRAM budget below the model, every batch verified
//! bit for bit against its resident pass, and must give sentence-transformers'
//! embeddings, in input order, within [`EMBEDDING_TOLERANCE`], and truncate the texts
//! it truncated.

mod common;

use std::path::{Path, PathBuf};

use common::decoder::decoder_plan;
use common::reference::{self, largest_difference};
use serde_json::Value;
use stagehand::actors::ResidencyPolicy;
use stagehand::families::bert::embeddings_in_input_order;
use stagehand::run::{
    execute, no_observer, prepare_with, EncoderInput, Extras, Prepared, WorkloadKind,
};
use stagehand::settings::Settings;

/// Largest difference allowed between a value of stagehand's embedding and
/// sentence-transformers' (both f32; they sum in other orders). Measured: at most
/// 1.2e-6 (bert-cls-max, whose max pooling is not normalised).
const EMBEDDING_TOLERANCE: f32 = 1e-5;

fn fixture(name: &str) -> PathBuf {
    reference::fixture("encoders", name)
}

struct Reference {
    batch: usize,
    texts: Vec<String>,
    truncated: Vec<bool>,
    embeddings: Vec<Vec<f32>>,
}

fn read_reference(folder: &Path) -> Reference {
    let value = reference::json(&folder.join("reference.json"));
    let list = |key: &str| value[key].as_array().unwrap().clone();
    Reference {
        batch: value["batch"].as_u64().unwrap() as usize,
        texts: list("texts")
            .iter()
            .map(|text| text.as_str().unwrap().to_string())
            .collect(),
        truncated: list("truncated")
            .iter()
            .map(|flag| flag.as_bool().unwrap())
            .collect(),
        embeddings: reference::float_rows(&value["embeddings"]),
    }
}

/// What a streamed run of `folder` embedded, in input order, and what it truncated.
struct Embedded {
    embeddings: Vec<Vec<f32>>,
    truncated: Vec<bool>,
    describe: &'static str,
}

fn prepare(folder: &Path, texts: &[String], batch: usize, extras: Extras) -> Prepared {
    let settings = Settings::default();
    let extras = extras.with(EncoderInput::Texts(texts.to_vec()));
    prepare_with(
        folder,
        WorkloadKind::Encoder,
        batch,
        &settings,
        false,
        &extras,
    )
    .unwrap()
}

fn embed(folder: &Path, texts: &[String], batch: usize) -> Embedded {
    let prepared = prepare(folder, texts, batch, Extras::default());
    let steps = texts.len().div_ceil(batch) as u64;
    // The planner's least budget at prefetch depth 1: every layer crosses the bus.
    let vram = prepared.plan_minimum_bytes(1, ResidencyPolicy::Planned).0;
    let settings = Settings::default();
    let mut plan = decoder_plan(&settings, vram, steps, no_observer());
    plan.prefetch_depth = 1;
    plan.keep_outputs = true;
    let outcome = execute(&prepared, plan).unwrap();
    assert_eq!(
        outcome.report.verified_steps,
        steps,
        "{}: every batch bit for bit against the resident pass",
        folder.display()
    );
    // Streamed: every block crossed the bus each step. One step moves the model once
    // (no prefetch runs for a step that never comes); more steps move it again.
    let moved = outcome.report.stats.pinned_to_vram.model_bytes;
    assert!(
        moved >= outcome.model_bytes && (steps == 1 || moved > outcome.model_bytes),
        "{}: streamed ({moved} bytes moved in {steps} steps, model {})",
        folder.display(),
        outcome.model_bytes
    );
    let embeddings = embeddings_in_input_order(
        &outcome.report.outputs,
        texts.len(),
        prepared.facts().output_order(),
    )
    .unwrap();
    Embedded {
        embeddings,
        truncated: (0..texts.len())
            .map(|text| prepared.truncated_texts.contains(&text))
            .collect(),
        describe: prepared.describe(),
    }
}

/// Embeds fixture `name` as sentence-transformers did and holds it against its output.
fn matches_sentence_transformers(name: &str, describe: &str) {
    let folder = fixture(name);
    let expected = read_reference(&folder);
    let ran = embed(&folder, &expected.texts, expected.batch);
    assert_eq!(ran.describe, describe, "{name}");
    let worst = largest_difference(&ran.embeddings, &expected.embeddings);
    eprintln!("{name}: largest difference from sentence-transformers {worst:e}");
    assert!(
        worst <= EMBEDDING_TOLERANCE,
        "{name}: embeddings differ from sentence-transformers' by {worst}"
    );
    assert_eq!(ran.truncated, expected.truncated, "{name}: truncated texts");
}

#[test]
fn bert_as_the_hub_ships_it_matches_sentence_transformers() {
    // Proves max_seq_length and do_lower_case from sentence_bert_config.json, mean
    // pooling from the old flags and 2_Normalize, with a tokenizer.json whose fixed
    // padding (40) and truncation (16) sentence-transformers ignores.
    matches_sentence_transformers("bert-mean", "bert encoder");
}

#[test]
fn cls_and_max_pooling_in_the_version_5_layout_match() {
    // Proves `pooling_mode` ["cls", "max"] concatenated, and the length from
    // tokenizer_config.json's model_max_length.
    matches_sentence_transformers("bert-cls-max", "bert encoder");
}

#[test]
fn sqrt_length_weighted_and_last_token_pooling_match() {
    // Proves mean_sqrt_len_tokens, weightedmean and lasttoken (old flags, in
    // sentence-transformers' order) and normalisation over their concatenation.
    matches_sentence_transformers("bert-sqrt-weighted-last", "bert encoder");
}

#[test]
fn roberta_matches_sentence_transformers() {
    // Proves RoBERTa's positions from pad_token_id + 1 and its byte-level tokenizer.
    matches_sentence_transformers("roberta", "roberta encoder");
}

#[test]
fn xlm_roberta_matches_sentence_transformers() {
    // Proves model_type xlm-roberta is the RoBERTa variant, with CLS pooling.
    matches_sentence_transformers("xlm-roberta", "roberta encoder");
}

#[test]
fn the_batch_size_changes_neither_order_nor_values() {
    // Proves texts sorted by length into batches come back in input order, and each
    // text's embedding does not depend on what it was batched with (padding to the
    // batch's longest text is masked): batches of 1, 3 and all texts agree.
    let folder = fixture("roberta");
    let expected = read_reference(&folder);
    let alone = embed(&folder, &expected.texts, 1);
    for batch in [3, expected.texts.len()] {
        let batched = embed(&folder, &expected.texts, batch);
        let worst = largest_difference(&batched.embeddings, &alone.embeddings);
        assert!(worst <= EMBEDDING_TOLERANCE, "batch {batch}: {worst}");
    }
    // The order is really exercised: the texts are given sorted neither way.
    let lengths: Vec<usize> = expected.texts.iter().map(String::len).collect();
    assert!(lengths.windows(2).any(|pair| pair[0] < pair[1]));
    assert!(lengths.windows(2).any(|pair| pair[0] > pair[1]));
}

#[test]
fn the_roberta_demo_preset_streams_bit_for_bit() {
    // Proves `demo-model --arch roberta` writes a folder stagehand opens as a RoBERTa
    // (514-style positions past pad_token_id 1, one token type) and embeds streamed,
    // every batch equal to its resident pass.
    let dir = tempfile::tempdir().unwrap();
    let demo = stagehand::families::bert::BertDemo {
        roberta: true,
        ..Default::default()
    };
    let folder = stagehand::families::bert::write_bert_folder(dir.path(), &demo).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["model_type"], "roberta");
    assert_eq!(config["max_position_embeddings"], 514);
    let texts: Vec<String> = [
        "A man is eating food.",
        "Hello world.",
        "The new movie is awesome today.",
    ]
    .map(String::from)
    .to_vec();
    let ran = embed(&folder, &texts, 2);
    assert_eq!(ran.describe, "roberta encoder");
    assert_eq!(ran.embeddings.len(), 3);
}
