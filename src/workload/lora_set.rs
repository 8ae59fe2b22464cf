//! The LoRA adapters a linear-stack run applies, laid out per block and layer.

use std::path::Path;
use std::sync::Arc;

use stagehand_actors::AdapterSummary;

use super::linear_stack::LinearStack;
use super::WorkloadError;
use crate::lora::{load_adapter, Adapter, LoraError, LoraSpec, LoraTarget};
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
#[derive(Debug, Clone, Default)]
pub struct LoraSet {
    adapters: Vec<Arc<Adapter>>,
    /// `[block][layer]` → (adapter, target) indices, in adapter order.
    patches: Vec<Vec<Vec<(usize, usize)>>>,
}

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
        Ok(Self { adapters, patches })
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

    /// `(factors, scale)` of every patch on one layer, in adapter order.
    pub fn patches(
        &self,
        block: usize,
        layer: usize,
    ) -> impl Iterator<Item = (&LoraTarget, f32)> + '_ {
        self.patches
            .get(block)
            .and_then(|layers| layers.get(layer))
            .into_iter()
            .flatten()
            .map(|&(adapter, target)| {
                let adapter = &self.adapters[adapter];
                let target = &adapter.targets[target];
                (target, target.scale(adapter.strength))
            })
    }

    pub fn touches(&self, block: usize) -> bool {
        self.patches
            .get(block)
            .is_some_and(|layers| layers.iter().any(|patches| !patches.is_empty()))
    }

    /// What the LoRA offloader accounts for each adapter.
    pub fn summaries(&self) -> Vec<AdapterSummary> {
        self.adapters
            .iter()
            .map(|adapter| AdapterSummary {
                name: adapter.name.clone(),
                strength: adapter.strength,
                bytes: adapter.bytes(),
            })
            .collect()
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
