//! Model descriptions: what the simulator and the fit check know of a model.
//!
//! A description is the model's blocks in forward order, each with its bytes and the
//! FLOPs one token costs in it, plus how many tokens one step processes. It comes from
//! a small TOML (the shipped ones in `config/models/*.toml`, embedded in the binary,
//! carry their arithmetic in comments), from a bare checkpoint's header (`from_index`),
//! or from a folder of a family stagehand computes (`from_folder`).

use serde::{Deserialize, Serialize};
use stagehand_actors::{BlockLayout, Extent, FileId, ModelLayout};

use super::described_reserve::ActivationsFile;
use super::output::StepOutput;
use crate::families::{Activations, KvCache};
use crate::sim::SimError;

const BUILTIN_MODELS: &[(&str, &str)] = &[
    (
        "flux1-dev",
        include_str!("../../config/models/flux1-dev.toml"),
    ),
    (
        "wan2.2-14b",
        include_str!("../../config/models/wan2.2-14b.toml"),
    ),
    (
        "sdxl-unet",
        include_str!("../../config/models/sdxl-unet.toml"),
    ),
    (
        "llama3-8b",
        include_str!("../../config/models/llama3-8b.toml"),
    ),
    (
        "llama3-70b",
        include_str!("../../config/models/llama3-70b.toml"),
    ),
    (
        "mixtral-8x7b",
        include_str!("../../config/models/mixtral-8x7b.toml"),
    ),
];

/// Most blocks a description may have (a bound, and far above any real model).
const MAX_BLOCKS: u64 = 100_000;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelDescription {
    pub name: String,
    /// "built-in", a TOML path, or the checkpoint path.
    pub source: String,
    pub dtype: String,
    /// Tokens one step pushes through every block: image/video latent tokens (× 2
    /// with classifier-free guidance) for diffusion, the batch size for decode.
    pub tokens_per_step: u64,
    /// In forward order.
    pub blocks: Vec<BlockDesc>,
    pub experts: Option<ExpertDesc>,
    /// What a step produces (`[output]`), for figures in the model's unit.
    pub output: Option<StepOutput>,
    /// A decoder's KV cache, reserved beside the weights as the run grows it (a
    /// description made from a decoder folder, or a description's `[activations]`).
    pub kv_cache: Option<KvCache>,
    /// The activation tensors a step reserves beside the weights, and each kind of
    /// block's working set, from the family's own shapes (a Flux checkpoint, or a
    /// description's `[activations]`).
    pub activations: Option<Activations>,
    /// Where the reserve beside the weights (`kv_cache`, `activations`) comes from, in
    /// words, for the fit verdict; `None`: the description gives none.
    pub reserve_basis: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockDesc {
    pub name: String,
    pub bytes: u64,
    pub flops_per_token: f64,
    /// Tensors in the block (extents in the simulated file).
    #[serde(default = "one")]
    pub tensors: u32,
    /// The kernels of one step, for a checkpoint (never in a description file).
    #[serde(skip)]
    pub work: Option<crate::compute::work::Work>,
    /// The kernels of the first step when they differ from `work` (a decoder's
    /// prefill of its prompt); `None`: the first step runs `work` too.
    #[serde(skip)]
    pub first_step_work: Option<crate::compute::work::Work>,
}

/// Mixture-of-experts layers: each block holds `per_layer` experts of `bytes_each`,
/// of which a token uses `top_k`. Block bytes include every expert; block FLOPs only
/// the active ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertDesc {
    pub per_layer: u32,
    pub top_k: u32,
    pub bytes_each: u64,
}

/// The TOML format. Blocks come from exactly one of: `[[blocks]]`, `[[groups]]`, or
/// the uniform `block_count` + `bytes_per_block` + `flops_per_token_per_block`;
/// `[head]` and `[tail]` wrap any of them.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelFile {
    name: Option<String>,
    dtype: String,
    tokens_per_step: u64,
    blocks: Option<Vec<BlockDesc>>,
    groups: Option<Vec<GroupDesc>>,
    block_count: Option<u64>,
    bytes_per_block: Option<u64>,
    flops_per_token_per_block: Option<f64>,
    tensors_per_block: Option<u32>,
    head: Option<BlockDesc>,
    tail: Option<BlockDesc>,
    experts: Option<ExpertDesc>,
    output: Option<StepOutput>,
    activations: Option<ActivationsFile>,
}

/// `count` equal blocks named `name.0`, `name.1`, ...
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupDesc {
    name: String,
    count: u64,
    bytes_per_block: u64,
    flops_per_token_per_block: f64,
    #[serde(default = "one")]
    tensors_per_block: u32,
}

fn one() -> u32 {
    1
}

impl ModelDescription {
    /// Loads a shipped description by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Self, SimError> {
        let (name, source, text) =
            crate::sim::shipped_or_file("model", name_or_path, BUILTIN_MODELS)?;
        Self::parse(&name, &source, &text)
    }

    pub fn builtin_names() -> Vec<&'static str> {
        BUILTIN_MODELS.iter().map(|(name, _)| *name).collect()
    }

    /// Parses a description; `source` names it in errors.
    pub fn parse(default_name: &str, source: &str, text: &str) -> Result<Self, SimError> {
        let error = |message: String| SimError::Profile {
            file: source.to_string(),
            message,
        };
        let file: ModelFile = toml::from_str(text).map_err(|e| error(e.to_string()))?;
        let body = body_blocks(&file).map_err(error)?;
        let mut blocks = Vec::with_capacity(body.len() + 2);
        blocks.extend(file.head);
        blocks.extend(body);
        blocks.extend(file.tail);
        let (kv_cache, activations, reserve_basis) = match file.activations {
            Some(reserve) => {
                let (kv_cache, activations, basis) = reserve.reserve().map_err(error)?;
                (kv_cache, activations, Some(basis))
            }
            None => (None, None, None),
        };
        let description = Self {
            name: file.name.unwrap_or_else(|| default_name.to_string()),
            source: source.to_string(),
            dtype: file.dtype,
            tokens_per_step: file.tokens_per_step,
            blocks,
            experts: file.experts,
            output: file.output,
            kv_cache,
            activations,
            reserve_basis,
        };
        description.checked()
    }

    /// The description, if it holds together; if not, an error naming its source.
    pub(super) fn checked(self) -> Result<Self, SimError> {
        match self.validate() {
            Ok(()) => Ok(self),
            Err(message) => Err(SimError::Profile {
                file: self.source.clone(),
                message,
            }),
        }
    }

    /// Device bytes a run reserves beside the weights before its first block, kept
    /// out of the plan: a decoder's first KV pages, a family's activation tensors.
    pub fn activation_reserve_bytes(&self) -> u64 {
        let kv = self.kv_cache.map_or(0, |kv| kv.start_reserve_bytes());
        kv + self
            .activations
            .as_ref()
            .map_or(0, |acts| acts.reserved_bytes)
    }

    pub fn total_bytes(&self) -> u64 {
        self.blocks.iter().map(|block| block.bytes).sum()
    }

    pub fn largest_block_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .map(|block| block.bytes)
            .max()
            .unwrap_or(0)
    }

    /// FLOPs of one block for one step.
    pub fn block_step_flops(&self, block: &BlockDesc) -> f64 {
        block.flops_per_token * self.tokens_per_step as f64
    }

    /// FLOPs of the whole model for one step.
    pub fn step_flops(&self) -> f64 {
        self.blocks
            .iter()
            .map(|block| self.block_step_flops(block))
            .sum()
    }

    pub fn tensor_count(&self) -> u64 {
        self.blocks
            .iter()
            .map(|block| u64::from(block.tensors))
            .sum()
    }

    /// A layout for the simulated disk: one file holding the blocks end to end in
    /// forward order, each block split into its tensors' extents (equal parts).
    pub fn layout(&self) -> ModelLayout {
        let mut offset = 0;
        let blocks = self
            .blocks
            .iter()
            .map(|block| {
                let parts = u64::from(block.tensors.max(1)).min(block.bytes.max(1));
                let extents = (0..parts)
                    .map(|part| {
                        let start = block.bytes * part / parts;
                        let end = block.bytes * (part + 1) / parts;
                        Extent {
                            file: FileId(0),
                            offset: offset + start,
                            length: end - start,
                        }
                    })
                    .collect();
                offset += block.bytes;
                BlockLayout::new(block.name.clone(), extents)
            })
            .collect();
        ModelLayout { blocks }
    }

    pub(super) fn validate(&self) -> Result<(), String> {
        if self.blocks.is_empty() {
            return Err("no blocks".to_string());
        }
        if self.tokens_per_step == 0 {
            return Err("tokens_per_step: must be at least 1".to_string());
        }
        if let Some(output) = &self.output {
            output.validate()?;
        }
        for block in &self.blocks {
            if block.bytes == 0 {
                return Err(format!("block `{}`: bytes must be more than 0", block.name));
            }
            if !(block.flops_per_token.is_finite() && block.flops_per_token >= 0.0) {
                return Err(format!(
                    "block `{}`: flops_per_token = {} must be zero or positive",
                    block.name, block.flops_per_token
                ));
            }
        }
        if let Some(experts) = self.experts {
            if experts.per_layer == 0 || experts.top_k == 0 || experts.top_k > experts.per_layer {
                return Err(format!(
                    "experts: top_k = {} must be between 1 and per_layer = {}",
                    experts.top_k, experts.per_layer
                ));
            }
            let all_experts = experts
                .bytes_each
                .saturating_mul(u64::from(experts.per_layer));
            if all_experts > self.largest_block_bytes() {
                return Err(format!(
                    "experts: {} × {} bytes do not fit in the largest block ({} bytes); block bytes include every expert",
                    experts.per_layer,
                    experts.bytes_each,
                    self.largest_block_bytes()
                ));
            }
        }
        Ok(())
    }
}

/// The blocks between head and tail, from whichever form the file uses.
fn body_blocks(file: &ModelFile) -> Result<Vec<BlockDesc>, String> {
    let uniform = file.block_count.is_some()
        || file.bytes_per_block.is_some()
        || file.flops_per_token_per_block.is_some()
        || file.tensors_per_block.is_some();
    let forms = [file.blocks.is_some(), file.groups.is_some(), uniform];
    if forms.iter().filter(|&&used| used).count() != 1 {
        return Err(
            "give the blocks exactly one way: [[blocks]], [[groups]], or block_count + bytes_per_block + flops_per_token_per_block"
                .to_string(),
        );
    }
    if let Some(blocks) = &file.blocks {
        return Ok(blocks.clone());
    }
    let groups = match &file.groups {
        Some(groups) => groups.iter().collect::<Vec<_>>(),
        None => Vec::new(),
    };
    let uniform_group;
    let groups = if uniform {
        let missing = |key: &str| format!("{key}: required with block_count");
        uniform_group = GroupDesc {
            name: "blocks".to_string(),
            count: file.block_count.ok_or_else(|| missing("block_count"))?,
            bytes_per_block: file
                .bytes_per_block
                .ok_or_else(|| missing("bytes_per_block"))?,
            flops_per_token_per_block: file
                .flops_per_token_per_block
                .ok_or_else(|| missing("flops_per_token_per_block"))?,
            tensors_per_block: file.tensors_per_block.unwrap_or(1),
        };
        vec![&uniform_group]
    } else {
        groups
    };
    let total: u64 = groups.iter().map(|group| group.count).sum();
    if total > MAX_BLOCKS {
        return Err(format!(
            "{total} blocks is more than the {MAX_BLOCKS} supported"
        ));
    }
    let mut blocks = Vec::new();
    for group in groups {
        if group.count == 0 {
            return Err(format!("group `{}`: count must be at least 1", group.name));
        }
        for index in 0..group.count {
            let name = if group.count == 1 {
                group.name.clone()
            } else {
                format!("{}.{index}", group.name)
            };
            blocks.push(BlockDesc {
                name,
                bytes: group.bytes_per_block,
                flops_per_token: group.flops_per_token_per_block,
                tensors: group.tensors_per_block,
                work: None,
                first_step_work: None,
            });
        }
    }
    Ok(blocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uniform_form_wraps_head_and_tail() {
        let text = r#"
dtype = "bf16"
tokens_per_step = 10
block_count = 3
bytes_per_block = 100
flops_per_token_per_block = 200.0
tensors_per_block = 4
[head]
name = "embed"
bytes = 50
flops_per_token = 0.0
"#;
        let model = ModelDescription::parse("tiny", "tiny.toml", text).unwrap();
        let names: Vec<_> = model
            .blocks
            .iter()
            .map(|block| block.name.as_str())
            .collect();
        assert_eq!(names, ["embed", "blocks.0", "blocks.1", "blocks.2"]);
        assert_eq!(model.total_bytes(), 350);
        assert_eq!(model.step_flops(), 6000.0);
        let layout = model.layout();
        assert_eq!(layout.total_bytes(), 350);
        assert_eq!(layout.blocks[1].extents.len(), 4);
        assert_eq!(layout.blocks[1].extents[0].offset, 50);
    }

    #[test]
    fn two_block_forms_at_once_are_refused() {
        let text = "dtype = \"bf16\"\ntokens_per_step = 1\nblock_count = 2\nbytes_per_block = 1\nflops_per_token_per_block = 1.0\n[[blocks]]\nname = \"a\"\nbytes = 1\nflops_per_token = 1.0\n";
        let message = ModelDescription::parse("x", "x.toml", text)
            .unwrap_err()
            .to_string();
        assert!(
            message.contains("x.toml") && message.contains("exactly one way"),
            "{message}"
        );
    }

    #[test]
    fn a_missing_uniform_key_is_named() {
        let text = "dtype = \"bf16\"\ntokens_per_step = 1\nblock_count = 2\nbytes_per_block = 1\n";
        let message = ModelDescription::parse("x", "x.toml", text)
            .unwrap_err()
            .to_string();
        assert!(message.contains("flops_per_token_per_block"), "{message}");
    }
}
