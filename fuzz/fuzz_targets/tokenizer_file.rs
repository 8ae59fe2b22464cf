//! A `tokenizer.json`, loaded through the paths stagehand takes (Hugging Face's
//! `tokenizers` behind `families::prompt_tokens::PromptTokenizer::for_encoder`, the
//! pipelines' text encoders, and `families::bert::tokenize`, the embedders) and used
//! on a short prompt: any bytes give token ids or an error, never a panic.
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stagehand::families::bert::{tokenize, TextLimits};
use stagehand::families::prompt_tokens::PromptTokenizer;

const LENGTH: usize = 16;

/// A text encoder's folder, its `tokenizer.json` written over on each run.
fn encoder() -> &'static Path {
    static FOLDER: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &FOLDER
        .get_or_init(|| {
            // One thread: the fuzzer's process is the unit, rayon's pool adds nothing.
            std::env::set_var("TOKENIZERS_PARALLELISM", "false");
            let_the_library_catch_the_crates_panics();
            let dir = tempfile::tempdir().expect("a temporary folder");
            let path = dir.path().join("text_encoder");
            std::fs::create_dir_all(&path).expect("the encoder's folder");
            (dir, path)
        })
        .1
}

/// libFuzzer's panic hook aborts at the panic, before any unwinding: a panic inside
/// Hugging Face's `tokenizers` (0.23.2 `.expect`s on malformed decoders, see
/// RELIABILITY.md) would end every run although the library catches it
/// (`catch_unwind` in `families::tokenizer_json::read`) and returns an error. So a
/// panic raised in that crate's own code unwinds to that catch; any other panic —
/// ours, or one the library failed to catch — still aborts as a crash.
fn let_the_library_catch_the_crates_panics() {
    let fuzzer_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let in_tokenizers = info.location().is_some_and(|location| {
            let file = location.file();
            file.contains("/tokenizers-") || file.starts_with("tokenizers/")
        });
        if !in_tokenizers {
            fuzzer_hook(info);
        }
    }));
}

fuzz_target!(|input: &[u8]| {
    let dir = encoder();
    let path = dir.join("tokenizer.json");
    std::fs::write(&path, input).expect("written");
    if let Ok(tokenizer) = PromptTokenizer::for_encoder(dir, LENGTH, "<pad>") {
        if let Ok(prompt) = tokenizer.encode("a fox in the snow, Ünïcode 🦊") {
            assert_eq!(prompt.ids.len(), LENGTH);
        }
    }
    let limits = TextLimits {
        max_positions: LENGTH,
        max_length: None,
        lower_case: true,
    };
    if let Ok(tokens) = tokenize(&path, &["a fox in the snow 🦊".to_string()], limits) {
        for text in tokens {
            assert!(text.ids.len() <= LENGTH);
        }
    }
});
