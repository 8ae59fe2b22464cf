//! Where a folder without `sentence_bert_config.json` cuts its texts: where
//! sentence-transformers does (the smaller of `max_position_embeddings` and the
//! tokenizer's `model_max_length`), not at its `tokenizer.json`'s truncation (128 in
//! the folders `demo-model` writes).

use std::path::Path;

use serde_json::json;
use stagehand::compute::DType;
use stagehand::run::{prepare_with, EncoderInput, Extras, WorkloadKind};
use stagehand::settings::Settings;
use stagehand::{write_bert_folder, BertDemo, BertPreset};

/// A text of `words` words: each is at least one token, plus [CLS] and [SEP].
fn text_of(words: usize) -> String {
    vec!["word"; words].join(" ")
}

/// The tokens of the one step embedding `text` from `folder`, and whether it was cut.
fn tokens_used(folder: &Path, text: &str) -> (u64, bool) {
    let extras = Extras::default().with(EncoderInput::Texts(vec![text.to_string()]));
    let prepared = prepare_with(
        folder,
        WorkloadKind::Encoder,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .unwrap();
    let cut = prepared.truncated_texts.contains(&0);
    (prepared.facts().tokens_per_step(), cut)
}

fn demo_folder(dir: &Path) -> std::path::PathBuf {
    let demo = BertDemo {
        preset: BertPreset::Tiny,
        dtype: DType::F32,
        ..BertDemo::default()
    };
    let folder = write_bert_folder(&dir.join("bert"), &demo).unwrap();
    assert!(!folder.join("sentence_bert_config.json").exists());
    assert!(!folder.join("tokenizer_config.json").exists());
    let tokenizer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("tokenizer.json")).unwrap())
            .unwrap();
    assert_eq!(
        tokenizer["truncation"]["max_length"], 128,
        "the case at hand"
    );
    folder
}

/// A text of about `tokens` tokens ([CLS] and [SEP] included), and its exact count.
fn text_of_about(folder: &Path, tokens: u64) -> (String, u64) {
    let (one_word, _) = tokens_used(folder, "word");
    let per_word = one_word - 2;
    let words = (tokens - 2) / per_word;
    (text_of(words as usize), words * per_word + 2)
}

#[test]
fn a_demo_folder_embeds_a_text_past_the_tokenizers_128_up_to_its_512_positions() {
    // Proves a text of about 180 tokens is embedded whole (not cut at the
    // tokenizer.json's 128) and a longer one is cut at max_position_embeddings.
    let dir = tempfile::tempdir().unwrap();
    let folder = demo_folder(dir.path());
    let (text, count) = text_of_about(&folder, 180);
    let (tokens, cut) = tokens_used(&folder, &text);
    assert!(tokens > 128, "{tokens} tokens");
    assert_eq!((tokens, cut), (count, false));
    let (long, count) = text_of_about(&folder, 800);
    assert!(count > 512);
    assert_eq!(tokens_used(&folder, &long), (512, true));
}

#[test]
fn the_tokenizers_model_max_length_cuts_when_it_is_the_smaller() {
    // Proves the other half of sentence-transformers' min(): a tokenizer_config.json
    // saying 256 cuts there, below the 512 positions.
    let dir = tempfile::tempdir().unwrap();
    let folder = demo_folder(dir.path());
    let config = json!({"model_max_length": 256});
    std::fs::write(folder.join("tokenizer_config.json"), config.to_string()).unwrap();
    let (text, count) = text_of_about(&folder, 180);
    assert_eq!(tokens_used(&folder, &text), (count, false));
    let (long, _) = text_of_about(&folder, 400);
    assert_eq!(tokens_used(&folder, &long), (256, true));
}
