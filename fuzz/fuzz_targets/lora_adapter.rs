//! LoRA adapter files (PEFT and kohya namings, with or without an
//! `adapter_config.json`) mapped onto a small demo model: any bytes give an adapter or
//! an error, never a panic.
//!
//! Input: two bytes of little-endian config length, that many bytes of config text
//! (none when the length is 0), then the adapter file's bytes.
#![no_main]

use std::path::Path;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stagehand::lora::parse_adapter;
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::model::ModelIndex;

/// The model the adapters patch: 2 blocks of 2 layers of 8 x 8, written once.
fn model() -> &'static ModelIndex {
    static MODEL: OnceLock<(tempfile::TempDir, ModelIndex)> = OnceLock::new();
    &MODEL
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary folder");
            let spec = DemoSpec {
                blocks: 2,
                layers_per_block: 2,
                dim: 8,
                seed: 1,
            };
            let path = write_linear_stack(dir.path(), &spec).expect("the demo model");
            let index = ModelIndex::open(&path, None).expect("its index");
            (dir, index)
        })
        .1
}

fuzz_target!(|input: &[u8]| {
    let Some((length, rest)) = input.split_first_chunk::<2>() else {
        return;
    };
    let config_bytes = usize::from(u16::from_le_bytes(*length)).min(rest.len());
    let (config, adapter) = rest.split_at(config_bytes);
    let config = (config_bytes > 0).then(|| String::from_utf8_lossy(config).into_owned());
    let path = Path::new("fuzz-adapter.safetensors");
    let parsed = parse_adapter(
        path,
        adapter,
        config.as_deref(),
        0.8,
        "fuzz".into(),
        model(),
        &[],
    );
    if let Ok(adapter) = parsed {
        for target in &adapter.targets {
            assert!(target.tensor < model().tensors.len());
        }
    }
});
