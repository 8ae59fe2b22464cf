//! The generated mixture-of-experts demo model: `layers` layers, each a dense
//! `dim × dim` linear plus an `[experts, dim]` router (one block in the step order)
//! and `experts` expert linears of `dim × dim` (each its own unit, outside the order).
//! Weights are seeded per tensor; routing is drawn from a seeded skewed distribution.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;
use stagehand_actors::SkewedRouting;

use super::demo::DemoError;

pub const MOE_FILE: &str = "moe.safetensors";
pub const MOE_KIND: &str = "moe";
const MAX_VALUES: u64 = 1 << 32;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeSpec {
    pub layers: u32,
    pub experts: u32,
    pub top_k: u32,
    pub dim: u32,
    /// Zipf exponent of the routing.
    pub skew: f64,
    /// Tokens between rotations of each layer's popular experts (0: none).
    pub drift_tokens: u32,
    pub seed: u64,
}

impl Default for MoeSpec {
    /// 8 layers × 16 experts of 256×256 f32, top-2: about 34 MiB.
    fn default() -> Self {
        Self {
            layers: 8,
            experts: 16,
            top_k: 2,
            dim: 256,
            skew: 1.1,
            drift_tokens: 64,
            seed: 0x004d_6f45,
        }
    }
}

impl MoeSpec {
    pub fn validate(&self) -> Result<(), DemoError> {
        let values = u64::from(self.layers)
            * (u64::from(self.experts) + 2)
            * u64::from(self.dim)
            * u64::from(self.dim);
        if self.layers == 0 || self.experts == 0 || self.dim == 0 {
            return Err(DemoError::InvalidSpec(
                "moe: layers, experts and dim must be at least 1".into(),
            ));
        }
        if self.top_k == 0 || self.top_k > self.experts {
            return Err(DemoError::InvalidSpec(format!(
                "moe: top-k {} must be between 1 and the {} experts",
                self.top_k, self.experts
            )));
        }
        if values > MAX_VALUES || !self.skew.is_finite() || self.skew < 0.0 {
            return Err(DemoError::InvalidSpec(format!(
                "moe: {values} values or skew {} is out of range",
                self.skew
            )));
        }
        Ok(())
    }

    pub fn routing(&self) -> SkewedRouting {
        SkewedRouting {
            layers: self.layers,
            experts: self.experts,
            top_k: self.top_k,
            skew: self.skew,
            drift_tokens: self.drift_tokens,
            seed: self.seed,
        }
    }

    pub fn expert_bytes(&self) -> u64 {
        u64::from(self.dim) * u64::from(self.dim) * 4
    }

    pub fn dense_name(layer: u32) -> String {
        format!("layers.{layer}.dense.weight")
    }

    pub fn router_name(layer: u32) -> String {
        format!("layers.{layer}.router.weight")
    }

    pub fn expert_name(layer: u32, expert: u32) -> String {
        format!("layers.{layer}.mlp.experts.{expert}.weight")
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("stagehand.kind".into(), MOE_KIND.into()),
            ("stagehand.layers".into(), self.layers.to_string()),
            ("stagehand.experts".into(), self.experts.to_string()),
            ("stagehand.top_k".into(), self.top_k.to_string()),
            ("stagehand.dim".into(), self.dim.to_string()),
            ("stagehand.skew".into(), self.skew.to_string()),
            (
                "stagehand.drift_tokens".into(),
                self.drift_tokens.to_string(),
            ),
            ("stagehand.seed".into(), self.seed.to_string()),
        ])
    }

    pub fn from_metadata(metadata: &BTreeMap<String, String>) -> Option<Self> {
        if metadata.get("stagehand.kind").map(String::as_str) != Some(MOE_KIND) {
            return None;
        }
        let field = |key: &str| metadata.get(key)?.parse::<u64>().ok();
        let spec = Self {
            layers: u32::try_from(field("stagehand.layers")?).ok()?,
            experts: u32::try_from(field("stagehand.experts")?).ok()?,
            top_k: u32::try_from(field("stagehand.top_k")?).ok()?,
            dim: u32::try_from(field("stagehand.dim")?).ok()?,
            skew: metadata.get("stagehand.skew")?.parse().ok()?,
            drift_tokens: u32::try_from(field("stagehand.drift_tokens")?).ok()?,
            seed: field("stagehand.seed")?,
        };
        spec.validate().ok().map(|()| spec)
    }

    /// Tensors in file order: per layer dense, router, then its experts.
    fn tensors(&self) -> Vec<(String, [u32; 2])> {
        let mut tensors = Vec::new();
        for layer in 0..self.layers {
            tensors.push((Self::dense_name(layer), [self.dim, self.dim]));
            tensors.push((Self::router_name(layer), [self.experts, self.dim]));
            for expert in 0..self.experts {
                tensors.push((Self::expert_name(layer, expert), [self.dim, self.dim]));
            }
        }
        tensors
    }
}

/// Writes `dir/moe.safetensors` (through a temporary name) and returns its path.
pub fn write_moe_model(dir: &Path, spec: &MoeSpec) -> Result<PathBuf, DemoError> {
    spec.validate()?;
    let io = |path: &Path, error: std::io::Error| DemoError::Io {
        path: path.to_path_buf(),
        reason: error.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(|error| io(dir, error))?;
    let path = dir.join(MOE_FILE);
    // Through a temporary file renamed into place, removed if the write fails.
    super::cache::write_atomically(&path, |temp| write_moe_file(temp, spec))
        .map_err(|error| io(&path, error))?;
    Ok(path)
}

/// Writes the whole model to `path`, with its data checksum in the header.
pub(crate) fn write_moe_file(file: &std::fs::File, spec: &MoeSpec) -> std::io::Result<()> {
    let tensors = spec.tensors();
    let mut header = serde_json::Map::new();
    let mut metadata = spec.metadata();
    metadata.insert(
        super::DATA_CHECKSUM_KEY.into(),
        super::PENDING_CHECKSUM.into(),
    );
    header.insert("__metadata__".into(), json!(metadata));
    let mut offset = 0u64;
    for (name, shape) in &tensors {
        let end = offset + u64::from(shape[0]) * u64::from(shape[1]) * 4;
        header.insert(
            name.clone(),
            json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut header = serde_json::Value::Object(header).to_string().into_bytes();
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    let mut writer = super::GeneratedWriter::new(file, &header)?;
    let bound = 1.0 / (spec.dim as f32).sqrt();
    // Values go out a chunk at a time (4 MiB): the writer hashes and polls for a stop
    // request per chunk.
    let mut chunk: Vec<u8> = Vec::with_capacity(CHUNK_BYTES);
    for (number, (_, shape)) in tensors.iter().enumerate() {
        let mut state = spec.seed ^ (number as u64).wrapping_mul(0xA24B_AED4_963E_E407);
        let values = u64::from(shape[0]) * u64::from(shape[1]);
        for _ in 0..values {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let unit = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
            chunk.extend_from_slice(&((unit * 2.0 - 1.0) * bound).to_le_bytes());
            if chunk.len() == CHUNK_BYTES {
                writer.write(&chunk)?;
                chunk.clear();
            }
        }
    }
    writer.write(&chunk)?;
    writer.finish()?;
    Ok(())
}

/// Bytes generated per write.
const CHUNK_BYTES: usize = 4 << 20;
