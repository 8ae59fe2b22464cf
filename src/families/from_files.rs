//! The fully-resident reference's block source: blocks straight from the model's
//! files — computed from their cached pages where the page cache holds a block whole,
//! else read into the compute adapter's memory — with the attached LoRA baked into
//! their F32 weights and the packs of the other patches loaded beside them.

use std::collections::HashMap;

use stagehand_actors::{BlockId, ModelLayout};

use super::blocks::{Blocks, Held, Inner};
use super::lora_set::LoraSet;
use super::FamilyError;
use crate::compute::Compute;
use crate::model::BlockReader;

/// Blocks read straight from the model's files into the compute adapter's memory:
/// the fully-resident reference. With `keep`, every block read stays loaded (for
/// workloads that use blocks out of order, such as MoE experts).
pub struct FromFiles<'a, C: Compute> {
    reader: &'a BlockReader<'a>,
    layout: &'a ModelLayout,
    lora: Option<&'a LoraSet>,
    kept: Option<HashMap<BlockId, Loaded<C::Block>>>,
    /// The file's bytes on their way into the adapter's memory where the adapter
    /// cannot take them straight ([`Compute::load_block_with`]), reused block after
    /// block: a fresh buffer a block faulted in every page of it again.
    scratch: Vec<u8>,
}

/// A reference block in memory, with the packs of the patches it applies low-rank.
struct Loaded<B> {
    memory: B,
    packs: Vec<(usize, B)>,
}

impl<'a, C: Compute> FromFiles<'a, C> {
    pub fn new(
        reader: &'a BlockReader<'a>,
        layout: &'a ModelLayout,
        lora: Option<&'a LoraSet>,
        keep: bool,
    ) -> Self {
        Self {
            reader,
            layout,
            lora: lora.filter(|set| !set.is_empty()),
            kept: keep.then(HashMap::new),
            scratch: Vec::new(),
        }
    }

    fn load(&mut self, compute: &C, block: BlockId) -> Result<Loaded<C::Block>, FamilyError> {
        let layout = self.layout.block(block).ok_or_else(|| {
            FamilyError::internal(format!("{block} is not a block of this model"))
        })?;
        let reader = self.reader;
        let lora = self.lora.filter(|set| set.touches(block.index()));
        // A block no LoRA is merged into is computed from the file's cached pages
        // where it can be: nothing copied.
        let cached = match lora {
            None => reader.cached(&layout.extents),
            Some(_) => None,
        };
        let memory = match cached {
            Some(bytes) => compute.share_block(bytes)?,
            None => compute.load_block_with(layout.bytes as usize, &mut self.scratch, |bytes| {
                reader
                    .read_once(&layout.extents, bytes)
                    .map_err(FamilyError::from)
            })?,
        };
        let Some(set) = lora else {
            return Ok(Loaded {
                memory,
                packs: Vec::new(),
            });
        };
        let mut packs = Vec::new();
        for adapter in set.adapters_on(block.index()) {
            let pack = set.pack_of(adapter, block.index());
            packs.push((adapter, compute.load_block(&pack)?));
        }
        let view = compute.block_view(&memory);
        set.bake(compute, block.index(), &view, |adapter| {
            packs
                .iter()
                .find(|(held, _)| *held == adapter)
                .map(|(_, pack)| compute.block_view(pack))
        })?;
        compute.wait(compute.fence()?)?;
        if !set.low_rank_on_resident(block.index()) {
            packs.clear();
        }
        Ok(Loaded { memory, packs })
    }
}

impl<C: Compute> Blocks<C> for FromFiles<'_, C> {
    fn acquire(&mut self, compute: &C, block: BlockId) -> Result<Held<C::Block>, FamilyError> {
        let loaded = match self.kept.as_mut().and_then(|kept| kept.remove(&block)) {
            Some(loaded) => loaded,
            None => self.load(compute, block)?,
        };
        Ok(Held(Inner::Loaded {
            block,
            memory: loaded.memory,
            packs: loaded.packs,
        }))
    }

    fn release(&mut self, compute: &C, held: Held<C::Block>) -> Result<(), FamilyError> {
        if let Inner::Loaded {
            block,
            memory,
            packs,
        } = held.0
        {
            match self.kept.as_mut() {
                Some(kept) => {
                    kept.insert(block, Loaded { memory, packs });
                }
                // The device may still read them: free them only after the stream passed.
                None => {
                    compute.wait(compute.fence()?)?;
                    drop((memory, packs));
                }
            }
        }
        Ok(())
    }

    fn lora(&self) -> Option<&LoraSet> {
        // Baked at load, but for the patches on weights narrower than F32.
        self.lora
    }
}
