//! The LoRA offloader's decisions: which adapter factors sit in which of its VRAM
//! slots. A plain state machine; [`crate::lora_offloader`] is the actor around it.
//!
//! An attached adapter owns, apart from the model's budgets:
//! - a pinned set: one pinned host buffer per block it patches, holding that block's
//!   factors (the "pack", laid out by the compute side);
//! - a VRAM region of `slot_count` slots, each large enough for its largest pack.
//!
//! Packs ride with their blocks: when the VRAM allocator starts a load of a block,
//! the offloader starts copying that block's packs into free slots (or the slot
//! loaded longest ago whose pack nobody holds). A streamed block's factors are thus
//! re-sent every step with it; a resident block's pack is used once to bake the
//! patch into the resident copy and then simply ages out. The compute thread finds a
//! pack through the LoRA table — a [`ResidencyTable`] with one entry per (adapter
//! slot, block) — with the same lock-free acquire as a block.

use std::sync::Arc;

use serde::Serialize;

use crate::arena::align_up;
use crate::device::DevicePtr;
use crate::host_buffer::HostBuffer;
use crate::layout::BlockId;
use crate::residency::{BlockState, ResidencyTable};

/// Adapters attached at once, at most. Bounds the LoRA table (allocated at start).
pub const MAX_ADAPTERS: usize = 8;

/// An attached adapter's place in the LoRA table, returned by `attach_lora`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct LoraSlot(pub(crate) u8);

impl LoraSlot {
    /// Its index among the [`MAX_ADAPTERS`] slots: the adapter dimension of the LoRA
    /// table.
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

/// An adapter's factors, as far as the budgets are concerned.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AdapterSummary {
    /// Unique among attached adapters: detach and errors name the adapter by it.
    pub name: String,
    /// The user's multiplier on the adapter (`--lora FILE:STRENGTH`), carried for
    /// summaries; the actors move bytes and never scale them.
    pub strength: f32,
    /// Bytes of its factors (all packs together).
    pub bytes: u64,
}

/// The offloader's own accounting, apart from the model's.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct LoraUsage {
    /// The adapters attached now; one still detaching is left out.
    pub adapters: Vec<AdapterSummary>,
    /// Its pinned set: every pack of every attached adapter.
    pub pinned_bytes: u64,
    /// Its VRAM regions: `slot_count × slot_bytes` per attached adapter.
    pub vram_bytes: u64,
    /// Adapters attached since the start.
    pub attached_total: u64,
    /// Adapters detached since the start.
    pub detached_total: u64,
    /// Packs copied pinned → VRAM since the start.
    pub pack_loads: u64,
    /// The bytes of those copies.
    pub pack_bytes_to_vram: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Loading { block: BlockId },
    Ready { block: BlockId, loaded_at: u64 },
}

struct Pack {
    bytes: u64,
    /// `None` while lent to a copy.
    buffer: Option<HostBuffer>,
}

struct Adapter {
    summary: AdapterSummary,
    packs: Vec<Option<Pack>>,
    region: DevicePtr,
    slot_bytes: u64,
    slots: Vec<SlotState>,
    in_flight: usize,
    detaching: bool,
    shutdown: bool,
}

impl Adapter {
    fn pinned_bytes(&self) -> u64 {
        self.packs.iter().flatten().map(|pack| pack.bytes).sum()
    }

    fn vram_bytes(&self) -> u64 {
        self.slots.len() as u64 * self.slot_bytes
    }
}

/// A pack copy the actor must start.
#[derive(Debug)]
pub struct PackLoad {
    pub slot: LoraSlot,
    pub block: BlockId,
    pub buffer: HostBuffer,
    pub bytes: u64,
    pub destination: DevicePtr,
}

/// What a detached adapter gives back: its VRAM region and its pinned buffers.
#[derive(Debug)]
pub struct Detached {
    pub slot: LoraSlot,
    pub region: DevicePtr,
    pub buffers: Vec<HostBuffer>,
}

/// What an attach needs from the budgets, computed before asking for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachPlan {
    pub pack_sizes: Vec<u64>,
    pub slot_bytes: u64,
    pub slot_count: usize,
}

impl AttachPlan {
    pub fn region_bytes(&self) -> u64 {
        self.slot_bytes * self.slot_count as u64
    }
}

pub struct LoraState {
    blocks: usize,
    table: Arc<ResidencyTable>,
    adapters: Vec<Option<Adapter>>,
    /// Indices taken by an attach in progress.
    claimed: Vec<bool>,
    /// Slots per adapter: the streamed blocks that can be in VRAM at once, plus one.
    slot_count: usize,
    clock: u64,
    attached_total: u64,
    detached_total: u64,
    pack_loads: u64,
    pack_bytes_to_vram: u64,
}

impl LoraState {
    #[cfg(test)]
    /// `ring_slots`: the VRAM plan's ring, i.e. how many streamed blocks can be on
    /// the device at once — each may need its factors there at the same time.
    pub fn new(blocks: usize, ring_slots: usize) -> Self {
        Self::with_table(Arc::new(Self::new_table(blocks)), ring_slots)
    }

    /// The LoRA table for a model of `blocks` blocks, allocated at session start.
    pub fn new_table(blocks: usize) -> ResidencyTable {
        ResidencyTable::new(vec![0; blocks * MAX_ADAPTERS])
    }

    /// As [`LoraState::new`], on a table the session already shares.
    pub fn with_table(table: Arc<ResidencyTable>, ring_slots: usize) -> Self {
        Self {
            blocks: table.len() / MAX_ADAPTERS,
            table,
            adapters: (0..MAX_ADAPTERS).map(|_| None).collect(),
            claimed: vec![false; MAX_ADAPTERS],
            slot_count: ring_slots.max(1) + 1,
            clock: 0,
            attached_total: 0,
            detached_total: 0,
            pack_loads: 0,
            pack_bytes_to_vram: 0,
        }
    }

    #[cfg(test)]
    /// The table the compute thread acquires packs from.
    pub fn table(&self) -> Arc<ResidencyTable> {
        self.table.clone()
    }

    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// The table entry of `block`'s pack of adapter `slot`.
    pub fn key(blocks: usize, slot: LoraSlot, block: BlockId) -> BlockId {
        BlockId((slot.index() * blocks + block.index()) as u32)
    }

    pub fn find(&self, name: &str) -> Option<LoraSlot> {
        self.adapters
            .iter()
            .position(|adapter| {
                adapter
                    .as_ref()
                    .is_some_and(|adapter| adapter.summary.name == name && !adapter.detaching)
            })
            .map(|index| LoraSlot(index as u8))
    }

    pub fn is_attached(&self, slot: LoraSlot) -> bool {
        self.adapters
            .get(slot.index())
            .is_some_and(|adapter| adapter.as_ref().is_some_and(|a| !a.detaching))
    }

    pub fn any_attached(&self) -> bool {
        self.adapters.iter().any(Option::is_some)
    }

    /// Sizes the pinned set and the VRAM region for packs of these sizes.
    pub fn plan_attach(&self, pack_sizes: Vec<u64>) -> AttachPlan {
        let largest = pack_sizes.iter().copied().max().unwrap_or(0);
        AttachPlan {
            pack_sizes,
            slot_bytes: align_up(largest.max(1)),
            slot_count: self.slot_count,
        }
    }

    /// Takes a free adapter index for an attach in progress.
    pub fn claim(&mut self) -> Option<LoraSlot> {
        let index = (0..MAX_ADAPTERS)
            .find(|&index| self.adapters[index].is_none() && !self.claimed[index])?;
        self.claimed[index] = true;
        Some(LoraSlot(index as u8))
    }

    pub fn unclaim(&mut self, slot: LoraSlot) {
        self.claimed[slot.index()] = false;
    }

    /// Records an attached adapter: `packs[i]` is the pinned buffer of `blocks[i]`.
    pub fn attach(
        &mut self,
        slot: LoraSlot,
        summary: AdapterSummary,
        plan: &AttachPlan,
        blocks: &[BlockId],
        buffers: Vec<HostBuffer>,
        region: DevicePtr,
    ) {
        let mut packs: Vec<Option<Pack>> = (0..self.blocks).map(|_| None).collect();
        for ((&block, buffer), &bytes) in blocks.iter().zip(buffers).zip(&plan.pack_sizes) {
            packs[block.index()] = Some(Pack {
                bytes,
                buffer: Some(buffer),
            });
        }
        self.claimed[slot.index()] = false;
        self.adapters[slot.index()] = Some(Adapter {
            summary,
            packs,
            region,
            slot_bytes: plan.slot_bytes,
            slots: vec![SlotState::Free; plan.slot_count],
            in_flight: 0,
            detaching: false,
            shutdown: false,
        });
        self.attached_total += 1;
    }

    /// Packs of `block` to load with it, for every adapter that patches it.
    pub fn prefetch(&mut self, block: BlockId) -> Vec<PackLoad> {
        (0..MAX_ADAPTERS)
            .filter_map(|index| self.start_load(LoraSlot(index as u8), block))
            .collect()
    }

    /// Whether `block`'s pack of `slot` is ready, loading, or neither.
    pub fn state(&self, slot: LoraSlot, block: BlockId) -> BlockState {
        self.table.state(Self::key(self.blocks, slot, block))
    }

    pub fn has_pack(&self, slot: LoraSlot, block: BlockId) -> bool {
        self.adapter(slot)
            .and_then(|adapter| adapter.packs.get(block.index()))
            .is_some_and(Option::is_some)
    }

    fn adapter(&self, slot: LoraSlot) -> Option<&Adapter> {
        self.adapters.get(slot.index())?.as_ref()
    }

    /// Pack copies in flight, every adapter together: what may still free a slot.
    pub fn copies_in_flight(&self) -> usize {
        self.adapters
            .iter()
            .flatten()
            .map(|adapter| adapter.in_flight)
            .sum()
    }

    /// Starts a copy of `block`'s pack of `slot` into a free slot, or into the slot
    /// loaded longest ago that nobody holds. `None` when there is no such pack, it is
    /// already there or on its way, or every slot is held or loading.
    pub fn start_load(&mut self, slot: LoraSlot, block: BlockId) -> Option<PackLoad> {
        let key = Self::key(self.blocks, slot, block);
        let blocks = self.blocks;
        let table = self.table.clone();
        let adapter = self.adapters.get_mut(slot.index())?.as_mut()?;
        if adapter.detaching || !matches!(table.state(key), BlockState::Absent) {
            return None;
        }
        let pack = adapter.packs.get_mut(block.index())?.as_mut()?;
        let bytes = pack.bytes;
        // Lent to a copy already: the pack is on its way.
        pack.buffer.as_ref()?;
        let place = match adapter.slots.iter().position(|s| *s == SlotState::Free) {
            Some(place) => place,
            None => {
                let victim = adapter
                    .slots
                    .iter()
                    .enumerate()
                    .filter_map(|(place, state)| match *state {
                        SlotState::Ready { block, loaded_at } => Some((place, block, loaded_at)),
                        _ => None,
                    })
                    .filter(|&(_, held, _)| table.holders(Self::key(blocks, slot, held)) == 0)
                    .min_by_key(|&(_, _, loaded_at)| loaded_at);
                let (place, evicted, _) = victim?;
                if !table.try_begin_evict(Self::key(blocks, slot, evicted)) {
                    return None;
                }
                table.finish_evict(Self::key(blocks, slot, evicted));
                place
            }
        };
        let buffer = adapter.packs[block.index()].as_mut()?.buffer.take()?;
        adapter.slots[place] = SlotState::Loading { block };
        adapter.in_flight += 1;
        table.mark_loading(key);
        Some(PackLoad {
            slot,
            block,
            buffer,
            bytes,
            destination: adapter.region.offset(place as u64 * adapter.slot_bytes),
        })
    }

    /// A pack copy finished (or failed): the buffer goes back to the pinned set and
    /// the pack becomes ready. Returns the adapter's leftovers when it was waiting to
    /// be detached and this was its last copy.
    pub fn loaded(
        &mut self,
        slot: LoraSlot,
        block: BlockId,
        buffer: HostBuffer,
        succeeded: bool,
    ) -> Option<Detached> {
        let key = Self::key(self.blocks, slot, block);
        self.clock += 1;
        let clock = self.clock;
        let adapter = self.adapters.get_mut(slot.index())?.as_mut()?;
        adapter.in_flight -= 1;
        let bytes = adapter.packs[block.index()].as_ref().map_or(0, |p| p.bytes);
        if let Some(pack) = adapter.packs[block.index()].as_mut() {
            pack.buffer = Some(buffer);
        }
        let place = adapter
            .slots
            .iter()
            .position(|state| *state == SlotState::Loading { block });
        if let Some(place) = place {
            if succeeded && !adapter.detaching {
                adapter.slots[place] = SlotState::Ready {
                    block,
                    loaded_at: clock,
                };
                let ptr = adapter.region.offset(place as u64 * adapter.slot_bytes);
                self.table.publish_ready(key, ptr, false);
                self.pack_loads += 1;
                self.pack_bytes_to_vram += bytes;
            } else {
                adapter.slots[place] = SlotState::Free;
                self.table.finish_evict(key);
            }
        }
        self.finish_detach(slot)
    }

    /// Starts detaching `slot`: no new copies; its leftovers come back now, or from
    /// [`LoraState::loaded`] once its copies in flight have finished.
    /// `shutdown`: the session is ending, so a pack the compute thread still holds
    /// does not keep the adapter (the arena goes with the session).
    pub fn begin_detach(&mut self, slot: LoraSlot, shutdown: bool) -> Option<Detached> {
        let adapter = self.adapters.get_mut(slot.index())?.as_mut()?;
        adapter.detaching = true;
        adapter.shutdown |= shutdown;
        self.finish_detach(slot)
    }

    fn finish_detach(&mut self, slot: LoraSlot) -> Option<Detached> {
        let adapter = self.adapters.get(slot.index())?.as_ref()?;
        if !adapter.detaching || adapter.in_flight > 0 {
            return None;
        }
        // A pack still held by the compute thread would be freed under it: wait for
        // its release (the session refuses a detach while it holds packs).
        let keys =
            (0..self.blocks).map(|block| Self::key(self.blocks, slot, BlockId(block as u32)));
        if !adapter.shutdown && keys.clone().any(|key| self.table.holders(key) > 0) {
            return None;
        }
        for key in keys {
            if self.table.state(key) == BlockState::Ready && self.table.try_begin_evict(key) {
                self.table.finish_evict(key);
            }
        }
        let adapter = self.adapters[slot.index()].take()?;
        self.detached_total += 1;
        Some(Detached {
            slot,
            region: adapter.region,
            buffers: adapter
                .packs
                .into_iter()
                .flatten()
                .filter_map(|pack| pack.buffer)
                .collect(),
        })
    }

    /// Every attached adapter, for shutdown.
    pub fn attached(&self) -> Vec<LoraSlot> {
        (0..MAX_ADAPTERS)
            .filter(|&index| self.adapters[index].is_some())
            .map(|index| LoraSlot(index as u8))
            .collect()
    }

    pub fn usage(&self) -> LoraUsage {
        let attached = self.adapters.iter().flatten().filter(|a| !a.detaching);
        let mut usage = LoraUsage {
            attached_total: self.attached_total,
            detached_total: self.detached_total,
            pack_loads: self.pack_loads,
            pack_bytes_to_vram: self.pack_bytes_to_vram,
            ..LoraUsage::default()
        };
        for adapter in attached {
            usage.adapters.push(adapter.summary.clone());
        }
        for adapter in self.adapters.iter().flatten() {
            usage.pinned_bytes += adapter.pinned_bytes();
            usage.vram_bytes += adapter.vram_bytes();
        }
        usage
    }
}

#[cfg(test)]
#[path = "lora_state_tests.rs"]
mod tests;
