//! Writes seeded tensors as safetensors, sharded with a `model.safetensors.index.json`
//! when they exceed one shard, the way Hugging Face lays large checkpoints out. Every
//! file is written to a temporary name and renamed when complete, so a reader never
//! sees half a file.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::compute::DType;

/// Values generated and written per chunk: bounds the writer's memory.
const CHUNK_VALUES: usize = 1 << 20;

/// One tensor to write: its values come from `fill(first_index, out)`.
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Values,
    /// Its own storage dtype, instead of the checkpoint's (FP8 scales stay F32).
    pub dtype: Option<DType>,
}

/// How a tensor's values are made.
#[derive(Debug, Clone)]
pub enum Values {
    /// Uniform in `[center − spread, center + spread)` from a seeded stream.
    Uniform { seed: u64, center: f32, spread: f32 },
    /// Every value the same.
    Constant(f32),
    /// [`Values::Uniform`]'s stream from position `first` on: a slice of a tensor
    /// written whole elsewhere (one of the pieces a fused weight is stored as).
    UniformFrom {
        seed: u64,
        center: f32,
        spread: f32,
        first: u64,
    },
    /// [`Values::Uniform`]'s stream with its two halves (of `half` values each) in
    /// the other order: a weight one layout stores halves-swapped (diffusers' Flux
    /// `norm_out.linear`).
    Swapped {
        seed: u64,
        center: f32,
        spread: f32,
        half: u64,
    },
    /// Bytes written as they are, under the safetensors dtype named (quantized
    /// codes, their scales, ComfyUI's `comfy_quant` JSON): the tensor's `dtype` is
    /// ignored and its shape must hold the bytes.
    Raw {
        bytes: std::sync::Arc<[u8]>,
        dtype: &'static str,
    },
}

impl TensorSpec {
    pub fn elements(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// Uniform values stored in the checkpoint's dtype.
    pub fn uniform(name: String, shape: Vec<usize>, seed: u64, center: f32, spread: f32) -> Self {
        Self {
            name,
            shape,
            values: Values::Uniform {
                seed,
                center,
                spread,
            },
            dtype: None,
        }
    }

    /// Bytes written, the checkpoint's storage dtype being `dtype`.
    pub fn bytes(&self, dtype: DType) -> u64 {
        if let Values::Raw { bytes, .. } = &self.values {
            return bytes.len() as u64;
        }
        self.elements() * self.dtype.unwrap_or(dtype).size_bytes() as u64
    }

    /// The safetensors dtype name written in the header.
    fn stored_name(&self, dtype: DType) -> &'static str {
        match &self.values {
            Values::Raw { dtype, .. } => dtype,
            _ => self.dtype.unwrap_or(dtype).safetensors_name(),
        }
    }
}

impl Values {
    /// Values `first .. first + out.len()` of the stream (`Raw` bytes have none: zeros).
    pub fn fill(&self, first: u64, out: &mut [f32]) {
        match *self {
            Values::Uniform {
                seed,
                center,
                spread,
            } => {
                for (offset, value) in out.iter_mut().enumerate() {
                    let unit = unit_interval(seed, first + offset as u64);
                    *value = center + (unit * 2.0 - 1.0) * spread;
                }
            }
            Values::Constant(constant) => out.fill(constant),
            Values::Raw { .. } => out.fill(0.0),
            Values::UniformFrom {
                seed,
                center,
                spread,
                first: skipped,
            } => Values::Uniform {
                seed,
                center,
                spread,
            }
            .fill(skipped + first, out),
            Values::Swapped {
                seed,
                center,
                spread,
                half,
            } => {
                for (offset, value) in out.iter_mut().enumerate() {
                    let at = first + offset as u64;
                    let source = if at < half { at + half } else { at - half };
                    *value = center + (unit_interval(seed, source) * 2.0 - 1.0) * spread;
                }
            }
        }
    }
}

/// A value in [0, 1) for position `index` of the stream `seed` (splitmix64 of the
/// pair), so any part of a tensor can be regenerated alone.
fn unit_interval(seed: u64, index: u64) -> f32 {
    let mut z = seed
        .wrapping_add(index.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
}

/// Writes `tensors` in `dtype` into `dir`: one `model.safetensors`, or shards of at
/// most `shard_bytes` (a tensor is never split) plus the index. Returns the paths
/// written, the index last.
pub fn write_checkpoint(
    dir: &Path,
    tensors: &[TensorSpec],
    dtype: DType,
    metadata: &BTreeMap<String, String>,
    shard_bytes: u64,
) -> std::io::Result<Vec<PathBuf>> {
    let size = |tensor: &TensorSpec| tensor.bytes(dtype);
    let mut shards: Vec<Vec<&TensorSpec>> = vec![Vec::new()];
    let mut filled = 0u64;
    for tensor in tensors {
        let bytes = size(tensor);
        if filled > 0 && filled + bytes > shard_bytes {
            shards.push(Vec::new());
            filled = 0;
        }
        if let Some(shard) = shards.last_mut() {
            shard.push(tensor);
        }
        filled += bytes;
    }
    let count = shards.len();
    let mut written = Vec::with_capacity(count + 1);
    let mut weight_map = BTreeMap::new();
    for (number, shard) in shards.iter().enumerate() {
        let name = if count == 1 {
            "model.safetensors".to_string()
        } else {
            format!("model-{:05}-of-{count:05}.safetensors", number + 1)
        };
        let path = dir.join(&name);
        write_atomically(&path, |file| write_shard(file, shard, dtype, metadata))?;
        for tensor in shard {
            weight_map.insert(tensor.name.clone(), name.clone());
        }
        written.push(path);
    }
    if count > 1 {
        let total: u64 = tensors.iter().map(size).sum();
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join("model.safetensors.index.json");
        write_atomically(&path, |file| {
            file.write_all(serde_json::to_string_pretty(&index)?.as_bytes())
        })?;
        written.push(path);
    }
    Ok(written)
}

/// Writes `tensors` in `dtype` as one safetensors file at `path`.
pub fn write_single(
    path: &Path,
    tensors: &[TensorSpec],
    dtype: DType,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    let all: Vec<&TensorSpec> = tensors.iter().collect();
    write_atomically(path, |file| write_shard(file, &all, dtype, metadata))
}

/// A model folder as Hugging Face libraries save one: `folder` with `config` as
/// `config.json` and `tensors` in `dtype` as `file` (F32, F16 or BF16: a demo's
/// `what` written in another is refused), PyTorch's `format` metadata; returns
/// `folder`.
pub fn write_model_folder(
    folder: &Path,
    config: &serde_json::Value,
    (file, tensors): (&str, &[TensorSpec]),
    (dtype, what): (DType, &str),
) -> std::io::Result<PathBuf> {
    if !matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) {
        return Err(std::io::Error::other(format!(
            "a {what} demo is written in F32, F16 or BF16, not {dtype}"
        )));
    }
    std::fs::create_dir_all(folder)?;
    let text = serde_json::to_string_pretty(config).map_err(std::io::Error::other)?;
    write_atomically(&folder.join("config.json"), |writer| {
        writer.write_all(text.as_bytes())
    })?;
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_single(&folder.join(file), tensors, dtype, &metadata)?;
    Ok(folder.to_path_buf())
}

/// Writes `path` through an unnamed file named once complete
/// ([`crate::os::write_atomically`]), buffered.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<&File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    crate::os::write_atomically(path, |file| {
        let mut writer = BufWriter::with_capacity(1 << 20, file);
        write(&mut writer)?;
        writer.flush()
    })
}

fn write_shard(
    writer: &mut BufWriter<&File>,
    tensors: &[&TensorSpec],
    dtype: DType,
    metadata: &BTreeMap<String, String>,
) -> std::io::Result<()> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), json!(metadata));
    let mut offset = 0u64;
    for tensor in tensors {
        let end = offset + tensor.bytes(dtype);
        header.insert(
            tensor.name.clone(),
            json!({"dtype": tensor.stored_name(dtype), "shape": tensor.shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    writer.write_all(&(header.len() as u64).to_le_bytes())?;
    writer.write_all(&header)?;
    let mut values = vec![0f32; CHUNK_VALUES];
    let mut bytes = vec![0u8; CHUNK_VALUES * 4];
    for tensor in tensors {
        if let Values::Raw { bytes, .. } = &tensor.values {
            writer.write_all(bytes)?;
            continue;
        }
        let stored = tensor.dtype.unwrap_or(dtype);
        let total = tensor.elements();
        let mut first = 0u64;
        while first < total {
            let count = (total - first).min(CHUNK_VALUES as u64) as usize;
            tensor.values.fill(first, &mut values[..count]);
            let encoded = &mut bytes[..count * stored.size_bytes()];
            stored.narrow(&values[..count], encoded);
            writer.write_all(encoded)?;
            first += count as u64;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ModelIndex;

    #[test]
    fn large_checkpoints_are_sharded_with_an_index_that_reads_back() {
        // Proves tensors land whole in shards under the limit, the index names each
        // tensor's shard, and the model index reads the set as one checkpoint.
        let dir = tempfile::tempdir().unwrap();
        let tensors: Vec<TensorSpec> = (0..5)
            .map(|number| {
                TensorSpec::uniform(
                    format!("layers.{number}.weight"),
                    vec![64, 64],
                    number,
                    0.0,
                    1.0,
                )
            })
            .collect();
        let written =
            write_checkpoint(dir.path(), &tensors, DType::Bf16, &BTreeMap::new(), 20_000).unwrap();
        assert_eq!(
            written.len(),
            4,
            "3 shards of ≤ 2 tensors (8 KiB each) + the index"
        );
        let index = ModelIndex::open(written.last().unwrap(), None).unwrap();
        assert_eq!(index.files.len(), 3);
        assert_eq!(index.tensors.len(), 5);
        assert!(index.tensors.iter().all(|tensor| tensor.dtype == "BF16"));
        let leftovers = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|entry| {
                entry
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".tmp")
            })
            .count();
        assert_eq!(leftovers, 0, "no temporary file is left behind");
    }
}
