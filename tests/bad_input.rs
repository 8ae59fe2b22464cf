//! Every kind of bad checkpoint gives one clear line naming the file and the problem,
//! exit status 2, and never a panic.

mod common;

use std::path::Path;

use common::{assert_bad_input, bert_like, sharded_llama, stagehand, write_raw};
use proptest::prelude::*;
use stagehand::model::ModelIndex;

fn inspect(path: &Path) -> std::process::Output {
    stagehand()
        .arg("inspect")
        .arg(path)
        .output()
        .expect("binary runs")
}

fn path_text(path: &Path) -> String {
    path.display().to_string()
}

#[test]
fn missing_path() {
    // Proves a path that does not exist is named and called missing.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("nope.safetensors");
    assert_bad_input(
        &inspect(&path),
        &[&path_text(&path), "no such file or directory"],
    );
}

#[test]
fn directory_without_safetensors() {
    // Proves an empty folder is reported as holding no checkpoint.
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("README.md"), "not a model").expect("write");
    assert_bad_input(
        &inspect(dir.path()),
        &[&path_text(dir.path()), "holds no .safetensors files"],
    );
}

#[test]
fn file_that_is_not_safetensors() {
    // Proves a text file is recognised as another format, not misread.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("notes.safetensors");
    std::fs::write(&path, "These are my notes, not a tensor file at all.\n").expect("write");
    assert_bad_input(
        &inspect(&path),
        &[&path_text(&path), "not a safetensors file"],
    );
}

#[test]
fn tiny_file() {
    // Proves a file shorter than the length field is refused cleanly.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tiny.safetensors");
    std::fs::write(&path, [1u8, 2, 3]).expect("write");
    assert_bad_input(&inspect(&path), &[&path_text(&path), "too short"]);
}

#[test]
fn truncated_header() {
    // Proves a real checkpoint cut inside its header is called a truncated header.
    let dir = tempfile::tempdir().expect("temp dir");
    let whole = std::fs::read(bert_like(dir.path())).expect("fixture");
    let header_len = u64::from_le_bytes(whole[..8].try_into().expect("8 bytes")) as usize;
    let path = dir.path().join("cut.safetensors");
    std::fs::write(&path, &whole[..8 + header_len / 2]).expect("write");
    assert_bad_input(&inspect(&path), &[&path_text(&path), "truncated header"]);
}

#[test]
fn header_length_larger_than_file() {
    // Proves a length field pointing past the end of the file is caught before reading.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("long.safetensors");
    let mut bytes = 5_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&path, bytes).expect("write");
    assert_bad_input(
        &inspect(&path),
        &[&path_text(&path), "says 5000 bytes but only 2 follow it"],
    );
}

#[test]
fn header_length_over_limit() {
    // Proves a header length above the 100 MB limit is refused without allocating it.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("huge.safetensors");
    let mut bytes = 200_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    std::fs::write(&path, bytes).expect("write");
    assert_bad_input(
        &inspect(&path),
        &[&path_text(&path), "200000000 bytes", "100 MB"],
    );
}

#[test]
fn header_not_json() {
    // Proves a header that is not JSON is named as such.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("garbled.safetensors");
    write_raw(&path, "{\"a\": [1, 2", 0);
    assert_bad_input(&inspect(&path), &[&path_text(&path), "not valid JSON"]);
}

#[test]
fn offsets_out_of_range() {
    // Proves a tensor whose offsets run past the data is named with its offsets.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("short.safetensors");
    write_raw(
        &path,
        r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#,
        8,
    );
    assert_bad_input(
        &inspect(&path),
        &[&path_text(&path), "tensor `w`", "[0, 16]", "past the end"],
    );
}

#[test]
fn overlapping_tensors() {
    // Proves two tensors sharing bytes are both named.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("overlap.safetensors");
    let header = r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}"#;
    write_raw(&path, header, 24);
    assert_bad_input(&inspect(&path), &[&path_text(&path), "`a` and `b` overlap"]);
}

#[test]
fn size_not_matching_dtype_and_shape() {
    // Proves offsets that disagree with dtype x shape say both sizes.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("mismatch.safetensors");
    write_raw(
        &path,
        r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}}"#,
        16,
    );
    assert_bad_input(
        &inspect(&path),
        &[&path_text(&path), "tensor `w`", "hold 16 bytes", "needs 12"],
    );
}

#[test]
fn unknown_dtype() {
    // Proves an unknown dtype is named.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("dtype.safetensors");
    write_raw(
        &path,
        r#"{"w":{"dtype":"F12","shape":[4],"data_offsets":[0,16]}}"#,
        16,
    );
    assert_bad_input(&inspect(&path), &[&path_text(&path), "unknown dtype `F12`"]);
}

#[test]
fn gap_between_tensors() {
    // Proves unaccounted bytes between tensors are reported, not silently skipped.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gap.safetensors");
    let header = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
    write_raw(&path, header, 12);
    assert_bad_input(&inspect(&path), &[&path_text(&path), "belong to no tensor"]);
}

#[test]
fn index_naming_shard_outside_its_directory() {
    // Proves an index cannot make us read files outside its folder.
    let dir = tempfile::tempdir().expect("temp dir");
    let index_path = sharded_llama(dir.path());
    let text = std::fs::read_to_string(&index_path).expect("index");
    std::fs::write(
        &index_path,
        text.replace("model-00002-of-00002", "../model-00002-of-00002"),
    )
    .expect("write");
    assert_bad_input(
        &inspect(&index_path),
        &[
            &path_text(&index_path),
            "`../model-00002-of-00002.safetensors`",
            "outside",
        ],
    );
}

#[test]
fn index_naming_missing_shard() {
    // Proves a shard the index names but that is absent is named.
    let dir = tempfile::tempdir().expect("temp dir");
    let index_path = sharded_llama(dir.path());
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).expect("remove");
    assert_bad_input(
        &inspect(&index_path),
        &[
            &path_text(&index_path),
            "model-00002-of-00002.safetensors",
            "does not exist",
        ],
    );
}

#[test]
fn index_placing_tensor_in_wrong_shard() {
    // Proves an index that disagrees with the shards' headers is caught.
    let dir = tempfile::tempdir().expect("temp dir");
    let index_path = sharded_llama(dir.path());
    let mut index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&index_path).expect("index")).expect("json");
    index["weight_map"]["lm_head.weight"] = serde_json::json!("model-00001-of-00002.safetensors");
    std::fs::write(&index_path, serde_json::to_vec(&index).expect("json")).expect("write");
    assert_bad_input(
        &inspect(&index_path),
        &[
            &path_text(&index_path),
            "`lm_head.weight`",
            "has no such tensor",
        ],
    );
}

#[test]
fn invalid_block_pattern() {
    // Proves a broken regex is a bad-input error naming the setting.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = bert_like(dir.path());
    let output = stagehand()
        .args(["inspect", "--block-pattern", "layers.("])
        .arg(&path)
        .output()
        .expect("runs");
    assert_bad_input(
        &output,
        &[
            "block_pattern",
            "layers.(",
            "flag --block-pattern",
            "not a valid regex",
        ],
    );
}

/// Opens `bytes` as a checkpoint and checks the outcome is Ok or a one-line error
/// naming the file.
fn open_bytes(bytes: &[u8]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().map_err(|error| TestCaseError::fail(error.to_string()))?;
    let path = dir.path().join("fuzz.safetensors");
    std::fs::write(&path, bytes).map_err(|error| TestCaseError::fail(error.to_string()))?;
    if let Err(error) = ModelIndex::open(&path, None) {
        let message = error.to_string();
        prop_assert!(
            message.contains(&path_text(&path)),
            "names the file: {}",
            message
        );
        prop_assert_eq!(message.lines().count(), 1, "one line: {}", message);
    }
    Ok(())
}

fn valid_file_bytes() -> Vec<u8> {
    let header = r#"{"__metadata__":{"k":"v"},"a.layers.0.w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[4],"data_offsets":[16,24]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend((0..24u8).collect::<Vec<_>>());
    bytes
}

proptest! {
    #![proptest_config(common::replay::replayable(256, 0xbad_1297))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        // Proves random input only ever yields Ok or a clean, one-line error.
        open_bytes(&bytes)?;
    }

    #[test]
    fn mutated_valid_files_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        // Proves corrupted real headers (flipped bytes, truncation) fail cleanly.
        let mut bytes = valid_file_bytes();
        for (position, value) in flips {
            let at = position.index(bytes.len());
            bytes[at] = value;
        }
        if truncate {
            let keep = cut.index(bytes.len());
            bytes.truncate(keep);
        }
        open_bytes(&bytes)?;
    }
}

#[test]
fn valid_fuzz_seed_file_opens() {
    // Proves the proptest's seed file is valid, so mutations start from a real file.
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("seed.safetensors");
    std::fs::write(&path, valid_file_bytes()).expect("write");
    let index = ModelIndex::open(&path, None).expect("seed file opens");
    assert_eq!(index.tensors.len(), 2);
    assert_eq!(index.metadata.get("k").map(String::as_str), Some("v"));
}

#[test]
fn bench_lora_with_rank_zero() {
    // Proves `stagehand bench lora` refuses a rank-0 adapter before doing any work.
    let output = stagehand()
        .args(["bench", "lora", "--rank", "0"])
        .output()
        .expect("binary runs");
    assert_bad_input(&output, &["--rank", "at least 1"]);
}
