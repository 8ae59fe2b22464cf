//! The LoRA adapters a run applies, placed on the blocks the session streams.
//!
//! Each adapter travels through the pipeline as one pack per block it patches: the
//! f32 factors of its targets in that block, `A` then `B` per target, in target
//! order. A target is found by where its base weight sits in its block (the
//! [`TensorSlot`] a model family placed it at), so any family gets LoRA the same way.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use stagehand_actors::{AdapterSummary, BlockId, LoraAttach, LoraPack};

use super::FamilyError;
use crate::compute::{BlockView, Compute, DType, LowRank, TensorSlot};
use crate::lora::{load_adapter, Adapter, LoraAlias, LoraError, LoraSpec};
use crate::model::ModelIndex;

/// Outputs of a run with LoRA on streamed blocks are checked against the merged
/// reference within this absolute tolerance. The low-rank path sums `x·Wᵀ + s·(x·Aᵀ)·Bᵀ`
/// where the reference sums `x·(W + s·B·A)ᵀ`: the same real number, rounded in another
/// order. Each linear-stack layer's output is RMS-normalised (elements of order 1), so
/// each layer adds a few f32 ulps (~1e-7); measured worst differences on the demo stay
/// below 1e-5 after 64 layers. Resident blocks bake the same `W + s·B·A` as the
/// reference, bit for bit; a patch on a weight narrower than F32 is applied low-rank
/// in both and on streamed blocks alike ([`merges`]), bit for bit too.
pub const LORA_TOLERANCE: f32 = 1e-4;

/// Where a model family placed a tensor of the index: its block in the session's
/// layout and its slot there. `None`: the tensor is not streamed (LoRA cannot patch it).
pub type Placement<'a> = dyn Fn(usize) -> Option<(usize, TensorSlot)> + 'a;

/// One target of one adapter, placed.
#[derive(Debug, Clone, Copy)]
struct Placed {
    block: usize,
    /// The base weight in its block.
    slot: TensorSlot,
    /// The weight's output rows `first_row .. first_row + rows` are patched (`B`'s rows).
    first_row: usize,
    rows: usize,
    rank: usize,
    /// Where this target's `A` starts in the adapter's pack for `block`.
    pack_offset: u64,
}

/// One patch on one weight: which adapter, its scale, the weight's output rows it
/// patches (`first_row ..` for `rows`: all of them unless the adapter named a piece
/// of a fused weight), whether resident copies hold it baked in ([`merges`]), and
/// where its factors sit in that adapter's pack of the block.
#[derive(Debug, Clone, Copy)]
pub struct Patch {
    pub adapter: usize,
    pub scale: f32,
    pub first_row: usize,
    pub rows: usize,
    /// Baked into the weight of a resident block and of the reference; otherwise
    /// applied low-rank wherever its block is.
    pub merged: bool,
    a: TensorSlot,
    b: TensorSlot,
}

impl Patch {
    /// The factors, read from the adapter's pack of this block.
    pub fn factors<'a>(&self, pack: &BlockView<'a>) -> Result<LowRank<'a>, FamilyError> {
        Ok(LowRank::new(pack.weight(&self.a)?, pack.weight(&self.b)?)?)
    }

    /// Where the weight's output rows `rows`, computed together, start in this
    /// patch's `B`; `None` when the patch leaves them alone. A patch that covers only
    /// some of them is refused: its update would land in part of an output the pass
    /// computes at once.
    pub fn local_row(&self, rows: &Range<usize>) -> Result<Option<usize>, FamilyError> {
        let (start, end) = (self.first_row, self.first_row + self.rows);
        if end <= rows.start || rows.end <= start {
            return Ok(None);
        }
        if rows.start < start || end < rows.end {
            return Err(FamilyError::request("lora", format!(
                "a LoRA patch of rows {start}..{end} covers part of the rows {rows:?} computed together"
            )));
        }
        Ok(Some(rows.start - start))
    }
}

/// Whether a patch on a weight stored as `dtype` is baked into resident copies (and
/// the reference): only into F32 weights. Baked into a narrower weight, `W + s·B·A`
/// would be rounded to its storage (BF16 keeps 8 significant bits: about 0.6% of the
/// tiny Flux fixture's latent moved against diffusers, which adds the update
/// unmerged, and a streamed block's exact low-rank pass no longer met the merged
/// reference); such a patch is applied low-rank on resident blocks and in the
/// reference too, the same arithmetic as on a streamed block, so a run with it
/// resident or streamed gives the same bits.
pub fn merges(dtype: DType) -> bool {
    dtype == DType::F32
}

/// Adapters in application order, placed on the session's blocks.
#[derive(Debug, Clone, Default)]
pub struct LoraSet {
    adapters: Vec<Arc<Adapter>>,
    /// `[adapter][target]`.
    placed: Vec<Vec<Placed>>,
    /// `[block]` → (adapter, target), in adapter then target order.
    by_block: Vec<Vec<(usize, usize)>>,
    /// `[adapter][block]`: bytes of that adapter's pack for the block (0: none).
    pack_bytes: Vec<Vec<u64>>,
}

impl LoraSet {
    /// Places the adapters on `blocks` blocks with `place`; refuses targets the family
    /// does not stream or whose dtype it cannot patch.
    pub fn new(
        adapters: Vec<Arc<Adapter>>,
        blocks: usize,
        place: &Placement<'_>,
    ) -> Result<Self, LoraError> {
        let mut by_block = vec![Vec::new(); blocks];
        let mut placed = Vec::with_capacity(adapters.len());
        let mut pack_bytes = Vec::with_capacity(adapters.len());
        for (adapter_number, adapter) in adapters.iter().enumerate() {
            let mut next_in_block = vec![0u64; blocks];
            let mut targets = Vec::with_capacity(adapter.targets.len());
            for (target_number, target) in adapter.targets.iter().enumerate() {
                let (block, slot) = place(target.tensor)
                    .filter(|(block, _)| *block < blocks)
                    .ok_or_else(|| LoraError::Shape {
                        path: adapter.path.clone(),
                        key: target.base.clone(),
                        problem: "is not a weight this model's forward pass streams".to_string(),
                    })?;
                if matches!(slot.dtype, DType::I8 | DType::U4) {
                    // Refused since a baked patch rounded away in integer codes; such
                    // a weight is no longer baked ([`merges`]), but LoRA on one is
                    // untested (see `lora::targets`).
                    return Err(LoraError::Shape {
                        path: adapter.path.clone(),
                        key: target.base.clone(),
                        problem: "patches an integer-quantized (int8_tensorwise or awq_w4a16) weight, which stagehand does not patch with a LoRA; use a BF16 or FP8 checkpoint".to_string(),
                    });
                }
                if target.first_row + target.out_features > slot.rows {
                    return Err(LoraError::Shape {
                        path: adapter.path.clone(),
                        key: target.base.clone(),
                        problem: format!(
                            "patches rows {}..{} of a weight of {} rows",
                            target.first_row,
                            target.first_row + target.out_features,
                            slot.rows
                        ),
                    });
                }
                targets.push(Placed {
                    block,
                    slot,
                    first_row: target.first_row,
                    rows: target.out_features,
                    rank: target.rank,
                    pack_offset: next_in_block[block],
                });
                next_in_block[block] += target.bytes();
                by_block[block].push((adapter_number, target_number));
            }
            placed.push(targets);
            pack_bytes.push(next_in_block);
        }
        Ok(Self {
            adapters,
            placed,
            by_block,
            pack_bytes,
        })
    }

    /// Loads each `FILE[:STRENGTH]` against the model (or the `aliases` its family
    /// lists for another layout of its weights), naming adapters by file stem.
    pub fn load(
        index: &ModelIndex,
        aliases: &[LoraAlias],
        specs: &[LoraSpec],
        blocks: usize,
        place: &Placement<'_>,
    ) -> Result<Self, LoraError> {
        let mut adapters = Vec::with_capacity(specs.len());
        for spec in specs {
            let name = unique_name(&spec.path, &adapters);
            adapters.push(Arc::new(load_adapter(
                &spec.path,
                spec.strength,
                name,
                index,
                aliases,
            )?));
        }
        Self::new(adapters, blocks, place)
    }

    pub fn is_empty(&self) -> bool {
        self.adapters.is_empty()
    }

    pub fn adapters(&self) -> &[Arc<Adapter>] {
        &self.adapters
    }

    pub fn bytes(&self) -> u64 {
        self.adapters.iter().map(|adapter| adapter.bytes()).sum()
    }

    pub fn touches(&self, block: usize) -> bool {
        self.by_block
            .get(block)
            .is_some_and(|patches| !patches.is_empty())
    }

    /// Whether a patch on `block` is baked into its resident copy (an F32 weight).
    pub fn merges_on(&self, block: usize) -> bool {
        self.placed_on(block)
            .any(|placed| merges(placed.slot.dtype))
    }

    /// Whether a patch on `block` is applied low-rank even where the block is
    /// resident (a weight narrower than F32).
    pub fn low_rank_on_resident(&self, block: usize) -> bool {
        self.placed_on(block)
            .any(|placed| !merges(placed.slot.dtype))
    }

    fn placed_on(&self, block: usize) -> impl Iterator<Item = &Placed> + '_ {
        self.by_block
            .get(block)
            .into_iter()
            .flatten()
            .map(|&(adapter, target)| &self.placed[adapter][target])
    }

    /// The adapters (by index) that patch `block`.
    pub fn adapters_on(&self, block: usize) -> Vec<usize> {
        let mut adapters: Vec<usize> = self
            .by_block
            .get(block)
            .into_iter()
            .flatten()
            .map(|&(adapter, _)| adapter)
            .collect();
        adapters.dedup();
        adapters
    }

    fn patch(&self, adapter: usize, target: usize) -> Patch {
        let source = &self.adapters[adapter].targets[target];
        let placed = self.placed[adapter][target];
        let a = TensorSlot {
            offset: placed.pack_offset,
            dtype: DType::F32,
            rows: placed.rank,
            cols: placed.slot.cols,
            scale: None,
            groups: None,
        };
        let b = TensorSlot {
            offset: placed.pack_offset + a.bytes(),
            dtype: DType::F32,
            rows: placed.rows,
            cols: placed.rank,
            scale: None,
            groups: None,
        };
        Patch {
            adapter,
            scale: source.scale(self.adapters[adapter].strength),
            first_row: placed.first_row,
            rows: placed.rows,
            merged: merges(placed.slot.dtype),
            a,
            b,
        }
    }

    /// The patches on the weight that starts at `offset` of `block`, in adapter order.
    pub fn patches_at(&self, block: usize, offset: u64) -> impl Iterator<Item = Patch> + '_ {
        self.by_block
            .get(block)
            .into_iter()
            .flatten()
            .filter(move |&&(adapter, target)| self.placed[adapter][target].slot.offset == offset)
            .map(|&(adapter, target)| self.patch(adapter, target))
    }

    /// Bakes every patch of `block` that [`merges`] into its weights in place
    /// (`W ← W + s·B·A`, in adapter order): the resident path and the merged
    /// reference. `pack(adapter)` is that adapter's pack of the block.
    pub fn bake<'p, C: Compute>(
        &self,
        compute: &C,
        block: usize,
        weights: &BlockView<'_>,
        pack: impl Fn(usize) -> Option<BlockView<'p>>,
    ) -> Result<(), FamilyError> {
        for &(adapter, target) in self.by_block.get(block).into_iter().flatten() {
            if !merges(self.placed[adapter][target].slot.dtype) {
                continue;
            }
            let pack = pack(adapter).ok_or_else(|| {
                FamilyError::internal(format!(
                    "block {block}: the pack of LoRA adapter {adapter} is missing"
                ))
            })?;
            let patch = self.patch(adapter, target);
            let rows = self.placed[adapter][target]
                .slot
                .sub_rows(patch.first_row, patch.rows);
            let weight = weights.weight(&rows)?;
            compute.merge_low_rank(&weight, &patch.factors(&pack)?, patch.scale)?;
        }
        Ok(())
    }

    /// Bytes of adapter `adapter`'s pack for `block` (0 if it does not patch it).
    pub fn pack_bytes(&self, adapter: usize, block: usize) -> u64 {
        self.pack_bytes[adapter].get(block).copied().unwrap_or(0)
    }

    /// Adapter `adapter`'s pack of `block`: its targets' `A` then `B` in target order
    /// (empty if it does not patch the block).
    pub fn pack_of(&self, adapter: usize, block: usize) -> Vec<u8> {
        let source = &self.adapters[adapter];
        let mut pack = Vec::with_capacity(self.pack_bytes(adapter, block) as usize);
        for (target, placed) in source.targets.iter().zip(&self.placed[adapter]) {
            if placed.block == block {
                for value in target.a.iter().chain(&target.b) {
                    pack.extend_from_slice(&value.to_le_bytes());
                }
            }
        }
        pack
    }

    /// What the session attaches for adapter `adapter`: its name, strength, bytes, and
    /// one pack per block it patches.
    pub fn attach_request(&self, adapter: usize) -> LoraAttach {
        let source = &self.adapters[adapter];
        let packs = (0..self.by_block.len())
            .filter(|&block| self.pack_bytes(adapter, block) > 0)
            .map(|block| LoraPack {
                block: BlockId(block as u32),
                bytes: self.pack_of(adapter, block),
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
