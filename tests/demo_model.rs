//! The linear-stack demo model: deterministic, valid safetensors, recognisable, and
//! written atomically.

mod common;

use common::{assert_bad_input, check_block_layout, stagehand};
use stagehand::model::demo::{write_linear_stack, DemoSpec, LINEAR_STACK_FILE};
use stagehand::model::ModelIndex;

const SMALL: DemoSpec = DemoSpec {
    blocks: 3,
    layers_per_block: 2,
    dim: 16,
    seed: 11,
};

#[test]
fn written_model_indexes_into_one_block_per_demo_block() {
    // Proves the file is valid safetensors with the documented names, shapes, blocks
    // and metadata, and that the run can recognise it.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_linear_stack(dir.path(), &SMALL).expect("writes");
    assert_eq!(path, dir.path().join(LINEAR_STACK_FILE));
    let index = ModelIndex::open(&path, None).expect("indexes");
    let names: Vec<&str> = index
        .blocks
        .iter()
        .map(|block| block.name.as_str())
        .collect();
    assert_eq!(names, ["blocks.0", "blocks.1", "blocks.2"]);
    assert!(index
        .blocks
        .iter()
        .all(|block| block.bytes == SMALL.block_bytes() && block.extents.len() == 1));
    let tensor = index
        .tensor("blocks.1.linear1.weight")
        .expect("tensor exists");
    assert_eq!(
        (tensor.dtype.as_str(), tensor.shape.as_slice()),
        ("F32", &[16usize, 16][..])
    );
    assert_eq!(
        tensor.block_offset,
        SMALL.layer_bytes(),
        "layer 1 follows layer 0 in its block"
    );
    assert_eq!(DemoSpec::from_metadata(&index.metadata), Some(SMALL));
    check_block_layout(&index);
}

#[test]
fn file_bytes_equal_the_regenerated_weights() {
    // Proves every tensor holds exactly what `fill_weight` regenerates, so the run can
    // check results without trusting the file.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = write_linear_stack(dir.path(), &SMALL).expect("writes");
    let bytes = std::fs::read(&path).expect("readable");
    let parsed = safetensors::SafeTensors::deserialize(&bytes).expect("parses");
    let mut expected = vec![0f32; 16 * 16];
    for block in 0..SMALL.blocks {
        for layer in 0..SMALL.layers_per_block {
            SMALL.fill_weight(block, layer, &mut expected);
            let view = parsed
                .tensor(&DemoSpec::tensor_name(block, layer))
                .expect("tensor");
            let stored: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|chunk| f32::from_le_bytes(chunk.try_into().expect("4 bytes")))
                .collect();
            assert_eq!(stored, expected, "block {block} layer {layer}");
        }
    }
}

#[test]
fn same_seed_same_bytes_other_seed_other_bytes() {
    // Proves the writer is deterministic in its seed.
    let first = tempfile::tempdir().expect("temp dir");
    let second = tempfile::tempdir().expect("temp dir");
    let third = tempfile::tempdir().expect("temp dir");
    let a = std::fs::read(write_linear_stack(first.path(), &SMALL).expect("writes")).expect("read");
    let b =
        std::fs::read(write_linear_stack(second.path(), &SMALL).expect("writes")).expect("read");
    let other = DemoSpec { seed: 12, ..SMALL };
    let c = std::fs::read(write_linear_stack(third.path(), &other).expect("writes")).expect("read");
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn no_temporary_file_is_left_and_leftovers_are_not_models() {
    // Proves the write goes through a temp name that never looks like a checkpoint, so
    // a killed run leaves nothing a folder open would pick up.
    let dir = tempfile::tempdir().expect("temp dir");
    write_linear_stack(dir.path(), &SMALL).expect("writes");
    let entries: Vec<String> = std::fs::read_dir(dir.path())
        .expect("listable")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    assert_eq!(entries, [LINEAR_STACK_FILE]);

    // A half-written leftover from a killed run, next to no finished model.
    let empty = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        empty.path().join(format!(".{LINEAR_STACK_FILE}.999.tmp")),
        b"partial",
    )
    .expect("write");
    assert!(
        ModelIndex::open(empty.path(), None).is_err(),
        "a leftover temp file is not a model"
    );
}

#[test]
fn cli_writes_the_model_and_rejects_bad_sizes() {
    // Proves `stagehand demo-model` writes the file and refuses a zero size with exit 2.
    let dir = tempfile::tempdir().expect("temp dir");
    let output = stagehand()
        .args([
            "demo-model",
            "--blocks",
            "2",
            "--layers-per-block",
            "1",
            "--dim",
            "8",
            "--seed",
            "3",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let index = ModelIndex::open(&dir.path().join(LINEAR_STACK_FILE), None).expect("indexes");
    let spec = DemoSpec::from_metadata(&index.metadata).expect("recognised");
    assert_eq!(
        (spec.blocks, spec.layers_per_block, spec.dim, spec.seed),
        (2, 1, 8, 3)
    );

    let bad = stagehand()
        .args(["demo-model", "--dim", "0", "--out"])
        .arg(dir.path())
        .output()
        .expect("runs");
    assert_bad_input(&bad, &["dim (0)", "at least 1"]);
}

/// `demo-model --lora-out` writes an adapter that `run --lora` applies and verifies.
#[test]
fn the_demo_lora_runs_against_its_merged_reference() {
    let dir = tempfile::tempdir().expect("temp dir");
    let lora = dir.path().join("demo-lora.safetensors");
    let output = stagehand()
        .args([
            "demo-model",
            "--blocks",
            "6",
            "--layers-per-block",
            "2",
            "--dim",
            "64",
        ])
        .args(["--lora-rank", "4", "--out"])
        .arg(dir.path())
        .arg("--lora-out")
        .arg(&lora)
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let model = dir.path().join(LINEAR_STACK_FILE);
    let output = stagehand()
        .args([
            "run",
            "--steps",
            "2",
            "--json",
            "--device",
            "cpu",
            "--vram-budget",
            "128KiB",
        ])
        .arg("--model")
        .arg(&model)
        .arg("--lora")
        .arg(format!("{}:0.8", lora.display()))
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("summary is JSON");
    assert_eq!(summary["verified_steps"], 2);
    assert!(summary["lora_bytes"].as_u64().unwrap_or(0) > 0, "{summary}");
}
