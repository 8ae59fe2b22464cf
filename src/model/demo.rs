//! The "linear-stack" demo model: N blocks of L bias-free `dim × dim` f32 linear layers
//! with seeded weights, written as a safetensors file that `stagehand run` streams.
//!
//! Every weight comes from a splitmix64 stream seeded per tensor, so any tensor can be
//! regenerated on its own ([`DemoSpec::fill_weight`]) without reading the file.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use serde_json::json;

/// File name `write_linear_stack` writes inside its output folder.
pub const LINEAR_STACK_FILE: &str = "linear-stack.safetensors";
/// `__metadata__` value of `stagehand.kind` that marks a generated model.
pub const LINEAR_STACK_KIND: &str = "linear-stack";

/// Upper bounds that keep a typo from writing terabytes.
const MAX_DIM: u32 = 65_536;
const MAX_TOTAL_BYTES: u64 = 1 << 40;
/// Values generated and written per chunk: bounds the writer's memory to 4 MiB.
const CHUNK_VALUES: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DemoSpec {
    pub blocks: u32,
    pub layers_per_block: u32,
    pub dim: u32,
    pub seed: u64,
}

impl Default for DemoSpec {
    /// 16 blocks × 4 layers × 1024×1024 f32 = 256 MiB.
    fn default() -> Self {
        Self {
            blocks: 16,
            layers_per_block: 4,
            dim: 1024,
            seed: 0x5747_4e44,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("demo model: {0}")]
    InvalidSpec(String),
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
}

impl DemoSpec {
    pub fn validate(&self) -> Result<(), DemoError> {
        if self.blocks == 0 || self.layers_per_block == 0 || self.dim == 0 {
            return Err(DemoError::InvalidSpec(format!(
                "blocks ({}), layers per block ({}) and dim ({}) must all be at least 1",
                self.blocks, self.layers_per_block, self.dim
            )));
        }
        if self.dim > MAX_DIM {
            return Err(DemoError::InvalidSpec(format!(
                "dim {} is over the {MAX_DIM} limit",
                self.dim
            )));
        }
        if self.total_bytes() > MAX_TOTAL_BYTES {
            return Err(DemoError::InvalidSpec(format!(
                "{} blocks x {} layers x {}^2 f32 is {} bytes, over the 1 TiB limit",
                self.blocks,
                self.layers_per_block,
                self.dim,
                self.total_bytes()
            )));
        }
        Ok(())
    }

    /// Bytes of one weight matrix.
    pub fn layer_bytes(&self) -> u64 {
        u64::from(self.dim) * u64::from(self.dim) * 4
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> u64 {
        self.layer_bytes() * u64::from(self.layers_per_block)
    }

    /// Bytes of all weights (saturates instead of overflowing).
    pub fn total_bytes(&self) -> u64 {
        self.block_bytes().saturating_mul(u64::from(self.blocks))
    }

    pub fn tensor_name(block: u32, layer: u32) -> String {
        format!("blocks.{block}.linear{layer}.weight")
    }

    /// Bound of the uniform weights, ±1/sqrt(dim): keeps activations of the same
    /// order through any depth.
    pub fn weight_bound(&self) -> f32 {
        1.0 / (self.dim as f32).sqrt()
    }

    /// Fills `out` (row-major, `dim * dim` values) with the weights of one layer.
    /// Panics if `out` has the wrong length, which is a caller bug.
    pub fn fill_weight(&self, block: u32, layer: u32, out: &mut [f32]) {
        let expected = self.dim as usize * self.dim as usize;
        assert_eq!(
            out.len(),
            expected,
            "weight buffer must hold dim*dim values"
        );
        let mut generator = self.generator(block, layer);
        let bound = self.weight_bound();
        for value in out.iter_mut() {
            *value = generator.next_uniform(bound);
        }
    }

    fn generator(&self, block: u32, layer: u32) -> SplitMix64 {
        let tensor_number = (u64::from(block) << 32) | u64::from(layer);
        SplitMix64::new(self.seed ^ SplitMix64::new(tensor_number).next_u64())
    }

    pub fn metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("stagehand.kind".to_string(), LINEAR_STACK_KIND.to_string()),
            ("stagehand.blocks".to_string(), self.blocks.to_string()),
            (
                "stagehand.layers_per_block".to_string(),
                self.layers_per_block.to_string(),
            ),
            ("stagehand.dim".to_string(), self.dim.to_string()),
            ("stagehand.seed".to_string(), self.seed.to_string()),
        ])
    }

    /// Recognises a model written by [`write_linear_stack`] from its `__metadata__`.
    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Option<DemoSpec> {
        if metadata.get("stagehand.kind").map(String::as_str) != Some(LINEAR_STACK_KIND) {
            return None;
        }
        let field = |key: &str| metadata.get(key)?.parse::<u64>().ok();
        let spec = DemoSpec {
            blocks: u32::try_from(field("stagehand.blocks")?).ok()?,
            layers_per_block: u32::try_from(field("stagehand.layers_per_block")?).ok()?,
            dim: u32::try_from(field("stagehand.dim")?).ok()?,
            seed: field("stagehand.seed")?,
        };
        spec.validate().ok().map(|()| spec)
    }
}

/// splitmix64: tiny, fast, and good enough for test weights; stable across platforms.
struct SplitMix64(u64);

impl SplitMix64 {
    fn new(seed: u64) -> Self {
        Self(seed)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-bound, bound): 24 random bits are exact in an f32.
    fn next_uniform(&mut self, bound: f32) -> f32 {
        let unit = (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32;
        (unit * 2.0 - 1.0) * bound
    }
}

/// Writes `dir/linear-stack.safetensors` and returns its path. The bytes go to a
/// temporary file in `dir` (`.linear-stack.safetensors.<pid>.tmp`) that is renamed
/// into place only when complete, so a killed run never leaves a half-written file
/// under the real name; a failed or interrupted write removes its temporary file, and
/// temporary files of processes that no longer exist are removed first.
pub fn write_linear_stack(dir: &Path, spec: &DemoSpec) -> Result<PathBuf, DemoError> {
    spec.validate()?;
    let io_error = |path: &Path, error: std::io::Error| DemoError::Io {
        path: path.to_path_buf(),
        reason: error.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|error| io_error(dir, error))?;
    super::cache::remove_stale_temporaries(dir);
    let final_path = dir.join(LINEAR_STACK_FILE);
    super::cache::write_atomically(&final_path, |temp| write_linear_stack_file(temp, spec))
        .map_err(|error| io_error(&final_path, error))?;
    Ok(final_path)
}

fn header_json(spec: &DemoSpec) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut metadata = spec.metadata();
    metadata.insert(
        super::checksum::DATA_CHECKSUM_KEY.to_string(),
        super::checksum::PENDING_CHECKSUM.to_string(),
    );
    header.insert("__metadata__".to_string(), json!(metadata));
    let mut offset = 0u64;
    for block in 0..spec.blocks {
        for layer in 0..spec.layers_per_block {
            let end = offset + spec.layer_bytes();
            header.insert(
                DemoSpec::tensor_name(block, layer),
                json!({
                    "dtype": "F32",
                    "shape": [spec.dim, spec.dim],
                    "data_offsets": [offset, end],
                }),
            );
            offset = end;
        }
    }
    let mut bytes = serde_json::Value::Object(header).to_string().into_bytes();
    // Pad with spaces so the data section starts 8-byte aligned, as safetensors does.
    while bytes.len() % 8 != 0 {
        bytes.push(b' ');
    }
    bytes
}

/// Writes the whole model to `path` (no temporary name: see `write_linear_stack`),
/// with its data checksum in the header.
pub(crate) fn write_linear_stack_file(file: &File, spec: &DemoSpec) -> std::io::Result<()> {
    let mut writer = super::checksum::GeneratedWriter::new(file, &header_json(spec))?;

    let values_per_layer = spec.dim as usize * spec.dim as usize;
    let mut chunk = vec![0u8; values_per_layer.min(CHUNK_VALUES) * 4];
    let bound = spec.weight_bound();
    for block in 0..spec.blocks {
        for layer in 0..spec.layers_per_block {
            // Same stream as `fill_weight`, produced a chunk at a time.
            let mut generator = spec.generator(block, layer);
            let mut remaining = values_per_layer;
            while remaining > 0 {
                let count = remaining.min(chunk.len() / 4);
                for out in chunk[..count * 4].chunks_exact_mut(4) {
                    out.copy_from_slice(&generator.next_uniform(bound).to_le_bytes());
                }
                writer.write(&chunk[..count * 4])?;
                remaining -= count;
            }
        }
    }
    writer.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_to_the_same_spec() {
        // Proves a generated model is recognised from its metadata with the same spec.
        let spec = DemoSpec {
            blocks: 3,
            layers_per_block: 2,
            dim: 8,
            seed: 42,
        };
        assert_eq!(DemoSpec::from_metadata(&spec.metadata()), Some(spec));
        let mut other = spec.metadata();
        other.insert("stagehand.kind".to_string(), "other".to_string());
        assert_eq!(DemoSpec::from_metadata(&other), None);
    }

    #[test]
    fn weights_are_bounded_and_seed_dependent() {
        // Proves weights stay within ±1/sqrt(dim) and differ between seeds and layers.
        let spec = DemoSpec {
            blocks: 2,
            layers_per_block: 2,
            dim: 16,
            seed: 7,
        };
        let mut first = vec![0f32; 256];
        let mut second = vec![0f32; 256];
        spec.fill_weight(0, 0, &mut first);
        spec.fill_weight(0, 1, &mut second);
        assert!(first.iter().all(|value| value.abs() <= spec.weight_bound()));
        assert_ne!(first, second);
        let reseeded = DemoSpec { seed: 8, ..spec };
        reseeded.fill_weight(0, 0, &mut second);
        assert_ne!(first, second);
    }

    #[test]
    fn default_is_256_mib() {
        // Proves the default demo model is the documented 256 MiB.
        assert_eq!(DemoSpec::default().total_bytes(), 256 << 20);
    }
}
