//! The model index and `stagehand inspect` on checkpoints of different layouts.

mod common;

use common::{
    bert_like, block_names, check_block_layout, flux_like, sharded_llama, stagehand,
    write_safetensors, Spec,
};
use safetensors::Dtype;
use stagehand::model::ModelIndex;

fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[test]
fn bert_layers_group_into_numbered_blocks_between_head_and_tail() {
    // Proves `encoder.layer.N.` forms one block per layer, in numeric order, with the
    // embeddings as head and the pooler as tail.
    let dir = temp_dir();
    let index = ModelIndex::open(&bert_like(dir.path()), None).expect("bert fixture indexes");
    let mut expected = vec!["head".to_string()];
    expected.extend((0..12).map(|layer| format!("encoder.layer.{layer}")));
    expected.push("tail".to_string());
    assert_eq!(block_names(&index), expected);
    assert_eq!(index.blocks[1].index, Some(0));
    assert_eq!(index.blocks[12].index, Some(11));
    assert_eq!(index.tensors.len(), 3 + 12 * 3);
    // Each layer's tensors are adjacent in the file: one extent per block.
    assert!(index.blocks[1..13]
        .iter()
        .all(|block| block.extents.len() == 1));
    check_block_layout(&index);
}

#[test]
fn sharded_index_json_and_its_folder_give_the_same_index() {
    // Proves a HF index.json is followed, a layer split across shards gets one extent
    // per shard, and opening the folder finds the same index.
    let dir = temp_dir();
    let index_path = sharded_llama(dir.path());
    let index = ModelIndex::open(&index_path, None).expect("sharded fixture indexes");
    assert_eq!(index.files.len(), 2);
    let mut expected = vec!["head".to_string()];
    expected.extend((0..6).map(|layer| format!("model.layers.{layer}")));
    expected.push("tail".to_string());
    assert_eq!(block_names(&index), expected);
    let split_layer = index.block_named("model.layers.3").expect("layer 3 exists");
    let files: Vec<u32> = split_layer
        .extents
        .iter()
        .map(|extent| extent.file.0)
        .collect();
    assert_eq!(files, [0, 1], "layer 3 spans both shards");
    let tail = index.block_named("tail").expect("tail exists");
    let tail_names: Vec<&str> = tail
        .tensors
        .iter()
        .map(|&t| index.tensors[t].name.as_str())
        .collect();
    assert_eq!(tail_names, ["lm_head.weight", "model.norm.weight"]);
    check_block_layout(&index);

    let from_folder = ModelIndex::open(dir.path(), None).expect("folder indexes");
    assert_eq!(from_folder.blocks, index.blocks);
    assert_eq!(from_folder.tensors, index.tensors);
}

#[test]
fn flux_double_and_single_blocks_stay_apart_and_in_order() {
    // Proves `double_blocks.N` and `single_blocks.N` are distinct blocks (double first),
    // a block whose tensors are not adjacent gets several extents, and dtypes mix.
    let dir = temp_dir();
    let index = ModelIndex::open(&flux_like(dir.path()), None).expect("flux fixture indexes");
    assert_eq!(
        block_names(&index),
        [
            "double_blocks.0",
            "double_blocks.1",
            "single_blocks.0",
            "single_blocks.1",
            "single_blocks.2",
            "tail"
        ]
    );
    // safetensors writes F32 before BF16, so each double block's norm and weight are apart.
    assert_eq!(index.blocks[0].extents.len(), 2);
    assert_eq!(index.metadata.get("format").map(String::as_str), Some("pt"));
    let largest = index.largest_block().expect("has blocks");
    assert_eq!(largest.name, "tail");
    check_block_layout(&index);
}

#[test]
fn custom_block_pattern_overrides_the_prefixes() {
    // Proves a regex's first capture group decides the blocks.
    let dir = temp_dir();
    let path = bert_like(dir.path());
    let index =
        ModelIndex::open(&path, Some(r"^(embeddings|encoder|pooler)\.")).expect("pattern indexes");
    assert_eq!(block_names(&index), ["embeddings", "encoder", "pooler"]);
    check_block_layout(&index);
}

#[test]
fn experts_are_marked_and_stay_in_their_layer() {
    // Proves MoE expert tensors carry their expert number inside the layer's block.
    let dir = temp_dir();
    let names: Vec<String> = (0..4)
        .map(|expert| format!("model.layers.0.block_sparse_moe.experts.{expert}.w1.weight"))
        .chain(["model.layers.0.block_sparse_moe.gate.weight".to_string()])
        .collect();
    let specs: Vec<Spec<'_>> = names
        .iter()
        .map(|name| (name.as_str(), Dtype::F16, &[4, 4][..]))
        .collect();
    let path = dir.path().join("moe.safetensors");
    write_safetensors(&path, &specs, None);
    let index = ModelIndex::open(&path, None).expect("moe fixture indexes");
    assert_eq!(block_names(&index), ["model.layers.0"]);
    let expert = index
        .tensor("model.layers.0.block_sparse_moe.experts.2.w1.weight")
        .expect("tensor");
    assert_eq!(expert.expert, Some(2));
    assert_eq!(
        index
            .tensor("model.layers.0.block_sparse_moe.gate.weight")
            .and_then(|t| t.expert),
        None
    );
}

#[test]
fn inspect_json_reports_files_tensors_dtypes_and_blocks() {
    // Proves `inspect --json` emits the documented schema with consistent figures.
    let dir = temp_dir();
    let index_path = sharded_llama(dir.path());
    let output = stagehand()
        .args(["inspect", "--json"])
        .arg(&index_path)
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    assert_eq!(report["schema"], 1);
    assert_eq!(report["files"].as_array().map(Vec::len), Some(2));
    assert_eq!(report["tensor_count"], 20);
    assert_eq!(report["dtypes"][0]["dtype"], "BF16");
    let blocks = report["blocks"].as_array().expect("blocks array");
    let block_sum: u64 = blocks
        .iter()
        .map(|block| block["bytes"].as_u64().expect("bytes"))
        .sum();
    assert_eq!(report["total_bytes"].as_u64(), Some(block_sum));
    assert_eq!(blocks[4]["name"], "model.layers.3");
    assert_eq!(blocks[4]["index"], 3);
    assert_eq!(blocks[4]["extents"].as_array().map(Vec::len), Some(2));
    assert!(report["largest_block"]["name"].is_string());
    let first_tensor = &report["tensors"][0];
    for field in [
        "name",
        "dtype",
        "shape",
        "file",
        "offset",
        "bytes",
        "block",
        "block_offset",
        "expert",
    ] {
        assert!(first_tensor.get(field).is_some(), "tensor field {field}");
    }
}

#[test]
fn inspect_table_lists_blocks_and_largest() {
    // Proves the human output names the files, totals, blocks and the largest block.
    let dir = temp_dir();
    let path = flux_like(dir.path());
    let output = stagehand()
        .arg("inspect")
        .arg(&path)
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "flux.safetensors",
        "tensors  10",
        "BF16",
        "F32",
        "in 6 blocks",
        "single_blocks.2",
        "largest  tail",
    ] {
        assert!(text.contains(needle), "output mentions {needle:?}:\n{text}");
    }
}

#[test]
fn inspect_block_pattern_flag_is_used() {
    // Proves `--block-pattern` reaches the index.
    let dir = temp_dir();
    let path = bert_like(dir.path());
    let output = stagehand()
        .args([
            "inspect",
            "--json",
            "--block-pattern",
            r"^(embeddings|encoder|pooler)\.",
        ])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("stdout is JSON");
    assert_eq!(report["blocks"].as_array().map(Vec::len), Some(3));
}
