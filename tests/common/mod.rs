//! Shared helpers for the integration tests: building safetensors fixtures with the
//! `safetensors` crate, crafting broken files by hand, and running the binary.
#![allow(dead_code)] // Each test binary uses a different subset.

pub mod cli;
pub mod cli_rows;
pub mod decoder;
pub mod decoder_config;
pub mod demo;
pub mod encoder;
pub mod lora;
pub mod metrics;
pub mod process;
pub mod reference;
pub mod replay;
pub mod sim;
pub mod storage;
pub mod threads;
pub mod usage;
pub mod wan;

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use stagehand::model::ModelIndex;

/// One fixture tensor: name, dtype, shape.
pub type Spec<'a> = (&'a str, Dtype, &'a [usize]);

fn element_bytes(dtype: Dtype) -> usize {
    dtype.bitsize() / 8
}

/// Writes a safetensors file holding `tensors`; each tensor's bytes are a pattern
/// derived from its name, so tests can tell tensors apart by content.
pub fn write_safetensors(
    path: &Path,
    tensors: &[Spec<'_>],
    metadata: Option<HashMap<String, String>>,
) {
    let buffers: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(name, dtype, shape)| {
            let bytes = shape.iter().product::<usize>() * element_bytes(*dtype);
            let salt = name
                .bytes()
                .fold(0u8, |acc, byte| acc.wrapping_mul(31).wrapping_add(byte));
            (0..bytes)
                .map(|i| (i as u8).wrapping_mul(7).wrapping_add(salt))
                .collect()
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .zip(&buffers)
        .map(|((name, dtype, shape), data)| {
            let view = TensorView::new(*dtype, shape.to_vec(), data)
                .expect("fixture tensor is consistent");
            (name.to_string(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, metadata, path).expect("fixture file is written");
}

/// A raw file: 8-byte little-endian header length, the header text, `data_bytes` zeros.
pub fn write_raw(path: &Path, header: &str, data_bytes: usize) {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.resize(bytes.len() + data_bytes, 0);
    std::fs::write(path, bytes).expect("raw fixture is written");
}

/// BERT-like: embeddings, 12 `encoder.layer.N.` layers, a pooler.
pub fn bert_like(dir: &Path) -> PathBuf {
    let mut names = vec![
        "embeddings.word_embeddings.weight".to_string(),
        "embeddings.LayerNorm.weight".to_string(),
        "pooler.dense.weight".to_string(),
    ];
    for layer in 0..12 {
        names.push(format!("encoder.layer.{layer}.attention.self.query.weight"));
        names.push(format!("encoder.layer.{layer}.attention.self.query.bias"));
        names.push(format!("encoder.layer.{layer}.intermediate.dense.weight"));
    }
    let specs: Vec<Spec<'_>> = names
        .iter()
        .map(|name| {
            let shape: &[usize] = if name.ends_with("bias") || name.contains("LayerNorm") {
                &[16]
            } else {
                &[16, 8]
            };
            (name.as_str(), Dtype::F32, shape)
        })
        .collect();
    let path = dir.join("bert.safetensors");
    write_safetensors(&path, &specs, None);
    path
}

/// Llama-like, split over two shards with an index.json; layer 3 spans both shards.
pub fn sharded_llama(dir: &Path) -> PathBuf {
    let mut first = vec!["model.embed_tokens.weight".to_string()];
    for layer in 0..3 {
        first.push(format!("model.layers.{layer}.self_attn.q_proj.weight"));
        first.push(format!("model.layers.{layer}.mlp.down_proj.weight"));
        first.push(format!("model.layers.{layer}.input_layernorm.weight"));
    }
    first.push("model.layers.3.self_attn.q_proj.weight".to_string());
    let mut second = vec!["model.layers.3.mlp.down_proj.weight".to_string()];
    for layer in 4..6 {
        second.push(format!("model.layers.{layer}.self_attn.q_proj.weight"));
        second.push(format!("model.layers.{layer}.mlp.down_proj.weight"));
        second.push(format!("model.layers.{layer}.input_layernorm.weight"));
    }
    second.push("model.norm.weight".to_string());
    second.push("lm_head.weight".to_string());
    // One dtype, like real bf16 checkpoints: safetensors sorts by dtype before name.
    let spec_of = |name: &String| -> (String, Dtype, Vec<usize>) {
        if name.contains("norm") {
            (name.clone(), Dtype::BF16, vec![32])
        } else {
            (name.clone(), Dtype::BF16, vec![32, 16])
        }
    };
    let mut weight_map = serde_json::Map::new();
    for (file_name, names) in [
        ("model-00001-of-00002.safetensors", &first),
        ("model-00002-of-00002.safetensors", &second),
    ] {
        let owned: Vec<(String, Dtype, Vec<usize>)> = names.iter().map(spec_of).collect();
        let specs: Vec<Spec<'_>> = owned
            .iter()
            .map(|(name, dtype, shape)| (name.as_str(), *dtype, shape.as_slice()))
            .collect();
        write_safetensors(&dir.join(file_name), &specs, None);
        for name in names {
            weight_map.insert(
                name.clone(),
                serde_json::Value::String(file_name.to_string()),
            );
        }
    }
    let index = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": weight_map });
    let index_path = dir.join("model.safetensors.index.json");
    std::fs::write(
        &index_path,
        serde_json::to_vec_pretty(&index).expect("json"),
    )
    .expect("index written");
    index_path
}

/// Flux-like diffusion transformer: `double_blocks.N.`, `single_blocks.N.` and loose
/// tensors, mixed BF16/F32.
pub fn flux_like(dir: &Path) -> PathBuf {
    let names = [
        ("img_in.weight", Dtype::BF16),
        ("time_in.in_layer.weight", Dtype::BF16),
        ("double_blocks.0.img_attn.qkv.weight", Dtype::BF16),
        ("double_blocks.0.img_attn.norm.scale", Dtype::F32),
        ("double_blocks.1.img_attn.qkv.weight", Dtype::BF16),
        ("double_blocks.1.img_attn.norm.scale", Dtype::F32),
        ("single_blocks.0.linear1.weight", Dtype::BF16),
        ("single_blocks.1.linear1.weight", Dtype::BF16),
        ("single_blocks.2.linear1.weight", Dtype::BF16),
        ("final_layer.linear.weight", Dtype::BF16),
    ];
    let specs: Vec<Spec<'_>> = names
        .iter()
        .map(|(name, dtype)| {
            (
                *name,
                *dtype,
                if *dtype == Dtype::F32 {
                    &[8][..]
                } else {
                    &[24, 8][..]
                },
            )
        })
        .collect();
    let path = dir.join("flux.safetensors");
    write_safetensors(
        &path,
        &specs,
        Some(HashMap::from([("format".to_string(), "pt".to_string())])),
    );
    path
}

/// Checks what every index must satisfy: each tensor's `block_offset` points, through
/// its block's extents laid end to end, at the tensor's own bytes on disk; and the
/// bytes read through the extents equal the bytes the safetensors crate returns.
pub fn check_block_layout(index: &ModelIndex) {
    let mut total = 0u64;
    for (block_position, block) in index.blocks.iter().enumerate() {
        let extent_bytes: u64 = block.extents.iter().map(|extent| extent.length).sum();
        assert_eq!(
            extent_bytes, block.bytes,
            "block {} extents cover its bytes",
            block.name
        );
        total += block.bytes;
        let buffer = read_block(index, block_position);
        for &tensor_position in &block.tensors {
            let tensor = &index.tensors[tensor_position];
            assert_eq!(tensor.block, block_position);
            let start = tensor.block_offset as usize;
            let in_buffer = &buffer[start..start + tensor.bytes as usize];
            let on_disk = read_range(&index.files[tensor.file].path, tensor.offset, tensor.bytes);
            assert_eq!(
                in_buffer,
                on_disk.as_slice(),
                "tensor {} sits at its block_offset",
                tensor.name
            );
            let whole_file = std::fs::read(&index.files[tensor.file].path).expect("file readable");
            let parsed =
                safetensors::SafeTensors::deserialize(&whole_file).expect("fixture parses");
            let view = parsed.tensor(&tensor.name).expect("tensor exists");
            assert_eq!(
                view.data(),
                in_buffer,
                "bytes of {} match the safetensors crate",
                tensor.name
            );
        }
    }
    let tensor_total: u64 = index.tensors.iter().map(|tensor| tensor.bytes).sum();
    assert_eq!(total, tensor_total);
    assert_eq!(index.total_bytes(), tensor_total);
    assert_eq!(index.layout().total_bytes(), tensor_total);
}

/// A block's buffer: its extents read and laid end to end.
pub fn read_block(index: &ModelIndex, block: usize) -> Vec<u8> {
    let mut buffer = Vec::new();
    for extent in &index.blocks[block].extents {
        let path = &index.files[extent.file.0 as usize].path;
        buffer.extend(read_range(path, extent.offset, extent.length));
    }
    buffer
}

pub fn read_range(path: &Path, offset: u64, length: u64) -> Vec<u8> {
    let mut file = File::open(path).expect("file opens");
    file.seek(SeekFrom::Start(offset)).expect("seek");
    let mut bytes = vec![0u8; length as usize];
    file.read_exact(&mut bytes).expect("range readable");
    bytes
}

pub fn block_names(index: &ModelIndex) -> Vec<&str> {
    index
        .blocks
        .iter()
        .map(|block| block.name.as_str())
        .collect()
}

/// The built binary, with any `STAGEHAND_*` variables of the calling shell removed so
/// the test sees only what it sets.
pub fn stagehand() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_stagehand"));
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy().to_ascii_uppercase();
        // A forced CPU path reaches the binary too (scripts/test.sh's lower paths).
        if name_text.starts_with("STAGEHAND_") && name_text != stagehand::settings::CPU_PATH_ENV {
            command.env_remove(name);
        }
    }
    command
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE");
    command
}

/// Asserts a bad-input failure: exit status 2 and one clean line on stderr that
/// contains every one of `expected`.
pub fn assert_bad_input(output: &Output, expected: &[&str]) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(2),
        "exit status 2; stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "no panic: {stderr}");
    assert!(!stderr.contains("backtrace"), "no backtrace: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    for needle in expected {
        assert!(
            stderr.contains(needle),
            "stderr mentions {needle:?}: {stderr}"
        );
    }
}
