//! The LoRA adapters a linear-stack run applies, laid out per block and layer.

use std::path::Path;
use std::sync::Arc;

use stagehand_actors::{AdapterSummary, BlockId, LoraAttach, LoraPack};

use super::linear_stack::LinearStack;
use super::WorkloadError;
use crate::lora::{load_adapter, Adapter, Factors, LoraError, LoraSpec};
use crate::model::ModelIndex;

/// Outputs of a run with LoRA on streamed blocks are checked against the merged
/// reference within this absolute tolerance. The low-rank path sums `x·Wᵀ + s·(x·Aᵀ)·Bᵀ`
/// where the reference sums `x·(W + s·B·A)ᵀ`: the same real number, rounded in another
/// order. Each layer's output is RMS-normalised (elements of order 1), so each layer
/// adds a few f32 ulps (~1e-7); measured worst differences on the demo stay below 1e-5
/// after 64 layers. Resident blocks bake the same `W + s·B·A` as the reference, bit for
/// bit.
pub const LORA_TOLERANCE: f32 = 1e-4;

/// Adapters in application order, and per block and layer which patches apply.
///
/// Each adapter travels through the pipeline as one pack per block it patches: the
/// f32 factors of its targets in that block, `A` then `B` per target, in target
/// order. `pack_offsets[adapter][target]` is where a target's `A` starts in its
/// block's pack.
#[derive(Debug, Clone, Default)]
pub struct LoraSet {
    adapters: Vec<Arc<Adapter>>,
    /// `[block][layer]` → (adapter, target) indices, in adapter order.
    patches: Vec<Vec<Vec<(usize, usize)>>>,
    pack_offsets: Vec<Vec<usize>>,
    /// `[adapter][block]`: bytes of that adapter's pack for the block (0: none).
    pack_bytes: Vec<Vec<usize>>,
}

/// Per layer of one block, each patch's factors and scale, in adapter order.
pub type BlockPatches<'a> = Vec<Vec<(Factors<'a>, f32)>>;

impl LoraSet {
    /// Lays the adapters out on the model's layers; refuses targets that are not
    /// linear-stack layer weights.
    pub fn new(
        model: &LinearStack,
        index: &ModelIndex,
        adapters: Vec<Arc<Adapter>>,
    ) -> Result<Self, LoraError> {
        let mut patches = vec![vec![Vec::new(); model.layers_per_block()]; model.blocks()];
        for (adapter_number, adapter) in adapters.iter().enumerate() {
            for (target_number, target) in adapter.targets.iter().enumerate() {
                let dtype = &index.tensors[target.tensor].dtype;
                if dtype != "F32" {
                    return Err(LoraError::BaseDtype {
                        path: adapter.path.clone(),
                        base: target.base.clone(),
                        dtype: dtype.clone(),
                    });
                }
                let layer = model
                    .layer_at(target.block, target.block_offset)
                    .ok_or_else(|| LoraError::Shape {
                        path: adapter.path.clone(),
                        key: target.base.clone(),
                        problem: "is not a layer weight of the linear-stack model".to_string(),
                    })?;
                patches[target.block][layer].push((adapter_number, target_number));
            }
        }
        // Per adapter: where each target starts in its block's pack, and each block's
        // pack size (the running end once every target is placed).
        let mut pack_offsets = Vec::with_capacity(adapters.len());
        let mut pack_bytes = Vec::with_capacity(adapters.len());
        for adapter in &adapters {
            let mut next_in_block = vec![0usize; model.blocks()];
            let offsets = adapter
                .targets
                .iter()
                .map(|target| {
                    let offset = next_in_block[target.block];
                    next_in_block[target.block] += target.bytes() as usize;
                    offset
                })
                .collect();
            pack_offsets.push(offsets);
            pack_bytes.push(next_in_block);
        }
        Ok(Self {
            adapters,
            patches,
            pack_offsets,
            pack_bytes,
        })
    }

    /// Loads each `FILE[:STRENGTH]` against the model, naming adapters by file stem.
    pub fn load(
        model: &LinearStack,
        index: &ModelIndex,
        specs: &[LoraSpec],
    ) -> Result<Self, LoraError> {
        let mut adapters = Vec::with_capacity(specs.len());
        for spec in specs {
            let name = unique_name(&spec.path, &adapters);
            adapters.push(Arc::new(load_adapter(
                &spec.path,
                spec.strength,
                name,
                index,
            )?));
        }
        Self::new(model, index, adapters)
    }

    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    pub fn adapters(&self) -> &[Arc<Adapter>] {
        &self.adapters
    }

    /// The set without adapter `name`.
    pub fn without(&self, model: &LinearStack, index: &ModelIndex, name: &str) -> Self {
        let kept = self
            .adapters
            .iter()
            .filter(|adapter| adapter.name != name)
            .cloned()
            .collect();
        // The kept adapters were accepted already, so laying them out cannot fail.
        Self::new(model, index, kept).unwrap_or_default()
    }

    /// The adapters (by index) that patch `block`.
    pub fn adapters_on(&self, block: usize) -> Vec<usize> {
        let mut adapters: Vec<usize> = self
            .patches
            .get(block)
            .into_iter()
            .flatten()
            .flatten()
            .map(|&(adapter, _)| adapter)
            .collect();
        adapters.sort_unstable();
        adapters.dedup();
        adapters
    }

    /// `block`'s patches with the loader's host factors (the merged reference).
    pub fn host_patches(&self, block: usize) -> BlockPatches<'_> {
        self.block_patches(block, |adapter, target| {
            Some(self.adapters[adapter].targets[target].factors())
        })
        .unwrap_or_default()
    }

    /// `block`'s patches with factors read from packs: `pack(adapter)` is the bytes of
    /// that adapter's pack for this block (in VRAM, for the pipeline). `None` if a
    /// pack is missing or too short.
    pub fn pack_patches<'a>(
        &self,
        block: usize,
        pack: impl Fn(usize) -> Option<&'a [f32]>,
    ) -> Option<BlockPatches<'a>> {
        self.block_patches(block, |adapter, target| {
            let factors = &self.adapters[adapter].targets[target];
            let start = self.pack_offsets[adapter][target] / 4;
            let (a_len, b_len) = (factors.a.len(), factors.b.len());
            let floats = pack(adapter)?.get(start..start + a_len + b_len)?;
            Some(Factors {
                a: &floats[..a_len],
                b: &floats[a_len..],
                out_features: factors.out_features,
                in_features: factors.in_features,
                rank: factors.rank,
            })
        })
    }

    fn block_patches<'a>(
        &self,
        block: usize,
        factors: impl Fn(usize, usize) -> Option<Factors<'a>>,
    ) -> Option<BlockPatches<'a>> {
        let layers = self.patches.get(block)?;
        layers
            .iter()
            .map(|patches| {
                patches
                    .iter()
                    .map(|&(adapter, target)| {
                        let strength = self.adapters[adapter].strength;
                        let scale = self.adapters[adapter].targets[target].scale(strength);
                        factors(adapter, target).map(|factors| (factors, scale))
                    })
                    .collect()
            })
            .collect()
    }

    /// Bytes of adapter `adapter`'s pack for `block` (0 if it does not patch it).
    pub fn pack_bytes(&self, adapter: usize, block: usize) -> usize {
        self.pack_bytes[adapter].get(block).copied().unwrap_or(0)
    }

    /// What the session attaches for adapter `adapter`: its name, strength, bytes, and
    /// one pack per block it patches.
    pub fn attach_request(&self, adapter: usize) -> LoraAttach {
        let source = &self.adapters[adapter];
        // Per block, the targets' A then B in target order: the layout of pack_offsets.
        let mut packs: std::collections::BTreeMap<usize, Vec<u8>> = Default::default();
        for target in &source.targets {
            let pack = packs.entry(target.block).or_default();
            for value in target.a.iter().chain(&target.b) {
                pack.extend_from_slice(&value.to_ne_bytes());
            }
        }
        let packs = packs
            .into_iter()
            .map(|(block, bytes)| LoraPack {
                block: BlockId(block as u32),
                bytes,
            })
            .collect();
        LoraAttach {
            summary: AdapterSummary {
                name: source.name.clone(),
                strength: source.strength,
                bytes: source.bytes(),
            },
            packs,
        }
    }

    pub fn touches(&self, block: usize) -> bool {
        self.patches
            .get(block)
            .is_some_and(|layers| layers.iter().any(|patches| !patches.is_empty()))
    }

    pub fn bytes(&self) -> u64 {
        self.adapters.iter().map(|adapter| adapter.bytes()).sum()
    }
}

fn unique_name(path: &Path, taken: &[Arc<Adapter>]) -> String {
    let stem = path
        .file_stem()
        .map(|stem| stem.to_string_lossy().into_owned())
        .unwrap_or_else(|| "lora".to_string());
    let mut name = stem.clone();
    let mut number = 1;
    while taken.iter().any(|adapter| adapter.name == name) {
        number += 1;
        name = format!("{stem}#{number}");
    }
    name
}

impl From<LoraError> for WorkloadError {
    fn from(error: LoraError) -> Self {
        WorkloadError::Model(error.to_string())
    }
}
