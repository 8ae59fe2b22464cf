//! The VRAM allocator's decisions: where each block goes, what to prefetch, what to
//! evict. A plain state machine; [`crate::vram_allocator`] is the actor around it.
//!
//! The arena is laid out as `[ring slot 0 .. ring slot n][resident area]`. Resident
//! blocks are placed once in the resident area; streamed blocks rotate through the
//! fixed ring slots, so streaming never fragments memory. In use = resident area used +
//! occupied ring slots + activations, and that never exceeds the budget.

use std::sync::Arc;

use crate::arena::{align_up, FreeList};
use crate::layout::{BlockId, ModelLayout};
use crate::plan::{Bytes, PlanError, ResidencyPolicy, StepOrder, VramPlan};
use crate::residency::{BlockState, ResidencyTable};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    Resident {
        offset: u64,
    },
    Ring {
        slot: usize,
    },
    /// A block outside the step order (an MoE expert) in the expert cache.
    Expert {
        slot: usize,
    },
}

#[derive(Debug, Clone, Copy, Default)]
struct RingSlot {
    block: Option<BlockId>,
    last_use: u64,
}

/// A load the actor must start: fetch the block's bytes and copy them to `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub block: BlockId,
    pub offset: u64,
    pub bytes: u64,
    pub speculative: bool,
    /// The step (pass over the order, from the session's start) that uses the block:
    /// its bytes count for that step, whenever the copy lands.
    pub step: u64,
}

/// What one scheduling pass decided.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Decisions {
    pub loads: Vec<Load>,
    pub evicted: u64,
    /// A speculative load was refused because it would evict a block needed sooner.
    pub declined: bool,
    /// Streamed blocks due after the prefetch window, nearest first: their bytes may
    /// be read from disk ahead, into free staging buffers (disk read-ahead).
    pub read_ahead: Vec<BlockId>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActivationError {
    #[error("activations of {requested} do not fit: vram_budget {budget} less the streaming ring {ring} leaves {available}, and {held} of weights cannot give way (held by compute, larger than a ring slot, or no ring to stream them through); set --vram-budget {} or more", needed.flag_value_at_least())]
    DoNotFit {
        requested: Bytes,
        budget: Bytes,
        ring: Bytes,
        available: Bytes,
        held: Bytes,
        /// A budget that holds the ring, what is reserved, the request and every
        /// resident weight (an upper bound: most of those give way).
        needed: Bytes,
    },
    #[error("LoRA factors need a VRAM region of {requested} and it does not fit: vram_budget {budget} less the streaming ring {ring} leaves {available} beside activations and other adapters, and {held} of weights are held by compute or cannot stream; set --vram-budget {} or more, detach an adapter, or lower its rank", needed.flag_value_at_least())]
    LoraDoesNotFit {
        requested: Bytes,
        budget: Bytes,
        ring: Bytes,
        available: Bytes,
        held: Bytes,
        needed: Bytes,
    },
}

pub struct VramState {
    block_bytes: Vec<u64>,
    order: StepOrder,
    plan: VramPlan,
    policy: ResidencyPolicy,
    depth: u32,
    table: Arc<ResidencyTable>,
    budget_bytes: u64,
    /// The arena's size: the most a shared budget may grow this one to.
    capacity_bytes: u64,
    ring_area_bytes: u64,
    resident_area: FreeList,
    activation_bytes: u64,
    ring: Vec<RingSlot>,
    placement: Vec<Option<Placement>>,
    /// Blocks whose load was started and not finished.
    loading: Vec<bool>,
    loads_in_flight: usize,
    /// The next position the compute thread needs, counted from the session's start
    /// (position / order length is the step).
    cursor: usize,
    /// No load starts for a position at or past this one (the run's last step ends
    /// there); a demand past it lifts it.
    end: Option<usize>,
    use_clock: u64,
    last_declined: Option<BlockId>,
    peak_used_bytes: u64,
    /// VRAM held by LoRA factors: regions of the resident area, counted apart from
    /// model bytes, inside the budget.
    lora_bytes: u64,
    /// The activation room the plan keeps (the session's `activation_reserve_bytes`):
    /// a resize plans no block into it while activations have not taken it.
    activation_room_bytes: u64,
    /// `(resident-area offset, bytes)` of each LoRA region.
    lora_regions: Vec<(u64, u64)>,
    /// Streamed blocks past the prefetch window named for disk read-ahead, at most.
    read_ahead_blocks: usize,
    experts: Option<ExpertArea>,
}

impl VramState {
    pub fn new(
        layout: &ModelLayout,
        order: StepOrder,
        budget_bytes: u64,
        depth: u32,
        policy: ResidencyPolicy,
        table: Arc<ResidencyTable>,
    ) -> Result<Self, PlanError> {
        if budget_bytes == 0 {
            return Err(PlanError::Zero {
                what: "vram_budget",
            });
        }
        let plan = VramPlan::new(layout, &order, budget_bytes, depth, policy)?;
        let ring_slots = u64::from(plan.ring_slots);
        let ring_area_bytes = plan.ring_bytes();
        let resident_capacity = budget_bytes.saturating_sub(ring_area_bytes);
        let block_count = layout.blocks.len();
        Ok(Self {
            block_bytes: layout.blocks.iter().map(|block| block.bytes).collect(),
            order,
            plan,
            policy,
            depth,
            table,
            budget_bytes,
            capacity_bytes: budget_bytes,
            ring_area_bytes,
            resident_area: FreeList::new(resident_capacity),
            activation_bytes: 0,
            ring: vec![RingSlot::default(); ring_slots as usize],
            placement: vec![None; block_count],
            loading: vec![false; block_count],
            loads_in_flight: 0,
            cursor: 0,
            end: None,
            use_clock: 0,
            last_declined: None,
            peak_used_bytes: 0,
            lora_bytes: 0,
            activation_room_bytes: 0,
            lora_regions: Vec::new(),
            read_ahead_blocks: 0,
            experts: None,
        })
    }

    /// Where the resident area starts: after the ring and the expert area.
    fn resident_base(&self) -> u64 {
        self.ring_area_bytes + self.expert_area_bytes()
    }

    pub fn lora_bytes(&self) -> u64 {
        self.lora_bytes
    }

    #[cfg(test)]
    pub fn plan(&self) -> &VramPlan {
        &self.plan
    }

    pub fn order(&self) -> &StepOrder {
        &self.order
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    pub fn slot_bytes(&self) -> u64 {
        if self.ring.is_empty() {
            0
        } else {
            self.ring_area_bytes / self.ring.len() as u64
        }
    }

    pub fn cursor(&self) -> usize {
        self.cursor
    }

    pub fn loads_in_flight(&self) -> usize {
        self.loads_in_flight
    }

    /// Bytes held now: placed blocks (resident area, occupied ring slots) + activations.
    pub fn used_bytes(&self) -> u64 {
        self.resident_area.used_bytes()
            + self.occupied_ring_bytes()
            + self.occupied_expert_bytes()
            + self.activation_bytes
    }

    /// Model bytes of blocks placed (loading or ready) and how many.
    pub fn placed_model(&self) -> (u64, u64) {
        self.placement
            .iter()
            .enumerate()
            .filter(|(_, placement)| placement.is_some())
            .fold((0, 0), |(bytes, count), (index, _)| {
                (bytes + self.block_bytes[index], count + 1)
            })
    }

    pub fn activation_bytes(&self) -> u64 {
        self.activation_bytes
    }

    /// The bytes the plan copies to VRAM per step now (rises as resident blocks give
    /// way and stream).
    pub fn streamed_bytes_per_step(&self) -> u64 {
        self.plan.streamed_bytes_per_step
    }

    fn occupied_ring_bytes(&self) -> u64 {
        self.ring.iter().filter(|slot| slot.block.is_some()).count() as u64 * self.slot_bytes()
    }

    fn record_peak(&mut self) {
        let used = self.used_bytes();
        assert!(
            used <= self.budget_bytes,
            "VRAM in use {used} exceeds the budget {}",
            self.budget_bytes
        );
        self.peak_used_bytes = self.peak_used_bytes.max(used);
    }

    /// Decides which loads to start: `demand` first (the compute thread waits on it),
    /// then up to `depth` not-yet-ready blocks ahead of the cursor.
    pub fn schedule(&mut self, demand: Option<BlockId>) -> Decisions {
        let mut decisions = Decisions::default();
        self.retry_pending_experts(&mut decisions);
        if let Some(block) = demand {
            if let Some(area) = self.experts.as_mut() {
                area.touched_round[block.index()] = area.round;
            }
            if self.needs_load(block)
                && !self.try_start(block, false, &mut decisions)
                && !self.order.contains(block)
            {
                if let Some(area) = self.experts.as_mut() {
                    area.pending.push(block);
                }
            }
        }
        let mut ahead = 0;
        // The planned policy looks past resident blocks to the next `depth` streamed
        // ones; exhaustion prediction bounds how far. The LRU baseline has no such
        // bound, so it looks exactly `depth` positions ahead (one group ahead, as
        // diffusers' group offloading does) — otherwise it would evict its own
        // prefetches all the way round the step.
        let window = match self.policy {
            ResidencyPolicy::Planned => self.order.len(),
            ResidencyPolicy::Lru => (self.depth as usize + 1).min(self.order.len()),
        };
        for step in 0..window {
            if ahead >= self.depth || self.end.is_some_and(|end| self.cursor + step >= end) {
                break;
            }
            let block = self.order.at(self.cursor + step);
            match self.table.state(block) {
                BlockState::Ready => continue,
                BlockState::Failed => break,
                _ => ahead += 1,
            }
            if !self.needs_load(block) {
                continue;
            }
            if !self.try_start(block, true, &mut decisions) {
                // Later blocks are needed even later: they would be declined too.
                break;
            }
        }
        decisions.read_ahead = self.read_ahead();
        self.record_peak();
        decisions
    }

    /// The next streamed blocks neither on the device nor loading, nearest first: the
    /// VRAM ring cannot take them yet (or declined to), but their disk reads can start.
    fn read_ahead(&self) -> Vec<BlockId> {
        if self.read_ahead_blocks == 0 {
            return Vec::new();
        }
        let left = self
            .end
            .map_or(self.order.len(), |end| end.saturating_sub(self.cursor));
        (0..self.order.len().min(left))
            .map(|step| self.order.at(self.cursor + step))
            .filter(|&block| {
                !self.plan.is_resident(block)
                    && self.needs_load(block)
                    && self.table.state(block) == BlockState::Absent
            })
            .take(self.read_ahead_blocks)
            .collect()
    }

    /// Names up to `blocks` streamed blocks past the prefetch window in each pass, for
    /// disk read-ahead (0: none — the naive and LRU baselines).
    pub fn with_read_ahead(mut self, blocks: usize) -> Self {
        self.read_ahead_blocks = blocks;
        self
    }

    fn needs_load(&self, block: BlockId) -> bool {
        self.placement[block.index()].is_none() && !self.loading[block.index()]
    }

    fn try_start(&mut self, block: BlockId, speculative: bool, decisions: &mut Decisions) -> bool {
        let bytes = self.block_bytes[block.index()];
        let placement = if self.experts.is_some() && !self.order.contains(block) {
            self.place_expert(block, speculative, decisions)
        } else if self.plan.is_resident(block) {
            let fits_a_slot = align_up(bytes) <= self.slot_bytes();
            self.place_resident(bytes).or_else(|| {
                fits_a_slot
                    .then(|| self.place_in_ring(block, speculative, decisions))
                    .flatten()
            })
        } else {
            self.place_in_ring(block, speculative, decisions)
        };
        let Some(placement) = placement else {
            return false;
        };
        let offset = match placement {
            Placement::Resident { offset } => self.resident_base() + offset,
            Placement::Expert { slot } => self.expert_offset(slot),
            Placement::Ring { slot } => {
                // A load counts as a use: LRU must not take a block it just prefetched
                // for one released earlier.
                self.use_clock += 1;
                self.ring[slot].block = Some(block);
                self.ring[slot].last_use = self.use_clock;
                slot as u64 * self.slot_bytes()
            }
        };
        self.placement[block.index()] = Some(placement);
        self.loading[block.index()] = true;
        self.loads_in_flight += 1;
        self.table.mark_loading(block);
        let step = self.step_of_next_use(block);
        decisions.loads.push(Load {
            block,
            offset,
            bytes,
            speculative,
            step,
        });
        true
    }

    fn place_resident(&mut self, bytes: u64) -> Option<Placement> {
        let limit = self.budget_bytes.saturating_sub(
            self.ring_area_bytes + self.expert_area_bytes() + self.activation_bytes,
        );
        if self.resident_area.used_bytes() + align_up(bytes) > limit {
            return None;
        }
        self.resident_area
            .allocate(bytes)
            .map(|offset| Placement::Resident { offset })
    }

    /// A load finished: returns the block's arena offset and whether it streams.
    pub fn loaded(&mut self, block: BlockId) -> Option<(u64, bool)> {
        if !self.loading[block.index()] {
            return None;
        }
        self.loading[block.index()] = false;
        self.loads_in_flight -= 1;
        self.last_declined = None;
        match self.placement[block.index()]? {
            Placement::Resident { offset } => Some((self.resident_base() + offset, false)),
            // Streamed: its release comes back as a message, which counts the use.
            Placement::Expert { slot } => Some((self.expert_offset(slot), true)),
            Placement::Ring { slot } => Some((slot as u64 * self.slot_bytes(), true)),
        }
    }

    /// A load failed or was abandoned: frees its place.
    pub fn abandon(&mut self, block: BlockId, failed: bool) {
        if self.loading[block.index()] {
            self.loading[block.index()] = false;
            self.loads_in_flight -= 1;
        }
        self.unplace(block);
        if failed {
            self.table.mark_failed(block);
        } else {
            self.table.finish_evict(block);
        }
    }

    fn unplace(&mut self, block: BlockId) {
        match self.placement[block.index()].take() {
            Some(Placement::Resident { offset }) => {
                self.resident_area
                    .free(offset, self.block_bytes[block.index()]);
            }
            Some(Placement::Ring { slot }) => self.ring[slot].block = None,
            Some(Placement::Expert { slot }) => {
                if let Some(area) = self.experts.as_mut() {
                    area.slots[slot] = None;
                }
            }
            None => {}
        }
    }

    /// Evicts every placed block at shutdown, held or not (see below). Returns how
    /// many.
    pub fn evict_all(&mut self) -> u64 {
        let mut evicted = 0;
        for index in 0..self.placement.len() {
            let block = BlockId(index as u32);
            if self.placement[index].is_none() || self.loading[index] {
                continue;
            }
            if self.table.try_begin_evict(block) {
                self.unplace(block);
                self.table.finish_evict(block);
            } else {
                // Still held: the session that held it is ending (dropped while a
                // panic unwound its compute), so the hold is void and the block
                // goes with the arena; a late acquire finds it failed.
                self.unplace(block);
                self.table.mark_failed(block);
            }
            evicted += 1;
        }
        evicted
    }
}

mod cursor;
mod experts;
mod reservations;
mod resize;
mod ring;

use experts::ExpertArea;

#[cfg(test)]
#[path = "vram_state_tests.rs"]
mod tests;
