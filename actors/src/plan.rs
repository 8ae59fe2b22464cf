//! Which blocks stay resident in a tier and which stream through it.
//!
//! On a cyclic access order with a cache smaller than the working set, LRU evicts every
//! block just before it is needed again. The optimal policy for a known future (Belady)
//! keeps a fixed subset resident and streams the rest through a small ring of slots.
//! Which blocks stream matters too: spreading them evenly over the order lets each
//! streamed copy hide behind the compute of the resident blocks around it. A block's
//! *max-scatter* priority is the bit-reversal of its position in the order; keeping the
//! highest priorities leaves the streamed ones evenly spaced (8 blocks, room for 4 →
//! positions {1, 3, 5, 7} stay; room for 2 → {3, 7}).

use crate::arena::align_up;
use crate::layout::{BlockId, ModelLayout};

mod pins;

pub use pins::{PinPlan, Staging};

/// Max-scatter priority of an order position: its 16-bit bit-reversal.
pub fn max_scatter_priority(position: usize) -> u16 {
    (position as u16).reverse_bits()
}

/// The step's access order and, for each block, where it occurs in it.
#[derive(Debug, Clone)]
pub struct StepOrder {
    order: Vec<BlockId>,
    positions: Vec<Vec<usize>>,
}

impl StepOrder {
    /// `block_count` is the model's number of blocks; every id in `order` must be below it.
    pub fn new(order: Vec<BlockId>, block_count: usize) -> Result<Self, PlanError> {
        if order.is_empty() {
            return Err(PlanError::EmptyOrder);
        }
        let mut positions = vec![Vec::new(); block_count];
        for (position, block) in order.iter().enumerate() {
            let Some(slot) = positions.get_mut(block.index()) else {
                return Err(PlanError::UnknownBlock {
                    block: *block,
                    block_count,
                });
            };
            slot.push(position);
        }
        Ok(Self { order, positions })
    }

    /// Positions in one pass (a block used twice counts twice); never 0.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Always false: [`StepOrder::new`] refuses an empty order.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The blocks in the order one step uses them.
    pub fn blocks(&self) -> &[BlockId] {
        &self.order
    }

    /// The block at `position`, counted across steps (the order repeats).
    pub fn at(&self, position: usize) -> BlockId {
        self.order[position % self.order.len()]
    }

    /// Where `block` is first used in a pass; `None` outside the order (an expert).
    pub fn first_position(&self, block: BlockId) -> Option<usize> {
        self.positions.get(block.index())?.first().copied()
    }

    /// Whether one pass uses `block` at all.
    pub fn contains(&self, block: BlockId) -> bool {
        self.first_position(block).is_some()
    }

    /// How many times one pass over the order uses `block`.
    pub fn uses(&self, block: BlockId) -> usize {
        self.positions.get(block.index()).map_or(0, Vec::len)
    }

    /// How many positions after `cursor` the block is next used (the order repeats);
    /// `None` for a block not in the order. A block at `cursor` itself is `0`.
    pub fn distance_to_next_use(&self, cursor: usize, block: BlockId) -> Option<usize> {
        let positions = self.positions.get(block.index())?;
        let cursor = cursor % self.order.len();
        let first = *positions.first()?;
        let next = match positions.binary_search(&cursor) {
            Ok(_) => return Some(0),
            Err(index) => positions.get(index).copied(),
        };
        Some(match next {
            Some(position) => position - cursor,
            None => first + self.order.len() - cursor,
        })
    }

    /// Blocks by descending max-scatter priority of their first position.
    pub(crate) fn by_priority(&self) -> Vec<BlockId> {
        let mut blocks: Vec<(u16, usize, BlockId)> = self
            .positions
            .iter()
            .enumerate()
            .filter_map(|(index, positions)| {
                let first = *positions.first()?;
                Some((max_scatter_priority(first), first, BlockId(index as u32)))
            })
            .collect();
        blocks.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        blocks.into_iter().map(|(_, _, block)| block).collect()
    }
}

/// Why no plan exists for these budgets, layout and order; each message names a fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The step order names no block.
    #[error("the step order is empty: declare at least one block")]
    EmptyOrder,
    /// The step order names a block the layout does not have.
    #[error("{block} is not in the model (it has {block_count} blocks)")]
    UnknownBlock {
        /// The id in the order.
        block: BlockId,
        /// Blocks the layout has: valid ids are below this.
        block_count: usize,
    },
    /// The VRAM budget cannot hold the ring, or the set-asides leave none to plan in.
    #[error("vram_budget {budget} is below the {needed} this model needs at minimum (largest block {largest} × (prefetch_depth {depth} + 1)): {}", raise_vram_budget(*needed, *fits_at_depth))]
    VramBudgetTooSmall {
        /// The budget checked: the VRAM budget, less any expert cache and reserve.
        budget: Bytes,
        /// The least budget the plan needs (if none is left: what the set-asides take).
        needed: Bytes,
        /// One ring slot: the largest block's aligned footprint (or the expert slot).
        largest: Bytes,
        /// The prefetch depth asked for (0 when none of the budget is left to plan in).
        depth: u32,
        /// The deepest smaller prefetch depth this budget does fit, if any.
        fits_at_depth: Option<u32>,
    },
    /// As above, where even the cheapest plan (too-large blocks resident) does not fit.
    #[error("vram_budget {budget} is below the {needed} this model needs at minimum ({oversized} of blocks too large to stream, kept resident, + largest streamed block {slot} × (prefetch_depth {depth} + 1)): {}", raise_vram_budget(*needed, *fits_at_depth))]
    VramBudgetTooSmallForLargeBlocks {
        /// The budget checked: the VRAM budget, less any expert cache and reserve.
        budget: Bytes,
        /// The least budget that would do: `oversized + slot × (depth + 1)`.
        needed: Bytes,
        /// The blocks larger than a slot, kept resident, together.
        oversized: Bytes,
        /// One ring slot: the largest streamed block's aligned footprint.
        slot: Bytes,
        /// The prefetch depth asked for.
        depth: u32,
        /// The deepest smaller prefetch depth this budget does fit, if any.
        fits_at_depth: Option<u32>,
    },
    /// The pin ceiling cannot hold the staging ring, or it has < 2 or empty buffers.
    #[error("pin_ceiling {ceiling} is below the {needed} the staging ring needs (largest block {largest} × {buffers} staging buffers): set --pin-ceiling {} or more", needed.flag_value_at_least())]
    PinCeilingTooSmall {
        /// The pin ceiling asked for.
        ceiling: Bytes,
        /// The least ring that would do: `largest × buffers`, and 2 buffers at least.
        needed: Bytes,
        /// One staging buffer: the largest streamed block (or the `--fast-disk` chunk).
        largest: Bytes,
        /// Staging buffers in the ring (2 at least).
        buffers: u32,
    },
    /// A setting that must be positive was 0.
    #[error("{what} must be greater than zero")]
    Zero {
        /// The setting's name, as the user knows it.
        what: &'static str,
    },
}

pub use crate::bytes::Bytes;

/// What to do about a VRAM budget below the plan's minimum: the flag and a value that
/// works, and a smaller prefetch depth when one fits the budget as it is.
fn raise_vram_budget(needed: Bytes, fits_at_depth: Option<u32>) -> String {
    let raise = format!("set --vram-budget {} or more", needed.flag_value_at_least());
    match fits_at_depth {
        Some(depth) => format!("{raise}, or --prefetch-depth {depth}"),
        None => raise,
    }
}

/// How a tier decides what to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ResidencyPolicy {
    /// A fixed, max-scatter-chosen resident set plus a ring of `depth + 1` slots
    /// (Belady-optimal on a cyclic order). Speculative loads that would evict a block
    /// needed sooner are declined.
    #[default]
    Planned,
    /// Baseline: every block competes for slots, LRU, no exhaustion prediction.
    Lru,
}

/// The VRAM tier's split: which blocks stay resident, and the streaming ring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VramPlan {
    /// Per block: kept resident for the whole run.
    pub resident: Vec<bool>,
    /// The resident blocks' aligned footprint, together.
    pub resident_bytes: u64,
    /// Streaming slots: `depth + 1` (0: all resident, no room); LRU: as many as fit.
    pub ring_slots: u32,
    /// Each slot's size: the largest streamed block's aligned footprint.
    pub slot_bytes: u64,
    /// The largest block's aligned footprint (what a whole-block staging buffer holds).
    pub largest_block_bytes: u64,
    /// Bytes that must cross to VRAM every steady-state step.
    pub streamed_bytes_per_step: u64,
}

impl VramPlan {
    /// The streaming ring's share of the budget: `ring_slots × slot_bytes`.
    pub fn ring_bytes(&self) -> u64 {
        u64::from(self.ring_slots) * self.slot_bytes
    }

    /// Whether the plan keeps `block` resident; false for an unknown block.
    pub fn is_resident(&self, block: BlockId) -> bool {
        self.resident.get(block.index()).copied().unwrap_or(false)
    }

    /// Plans the VRAM tier in `capacity_bytes`: the budget less activation reservations.
    pub fn new(
        layout: &ModelLayout,
        order: &StepOrder,
        capacity_bytes: u64,
        depth: u32,
        policy: ResidencyPolicy,
    ) -> Result<Self, PlanError> {
        let block_bytes: Vec<u64> = layout.blocks.iter().map(|block| block.bytes).collect();
        // Capacity decisions use each block's footprint in the arena (aligned).
        let footprint: Vec<u64> = block_bytes.iter().map(|&bytes| align_up(bytes)).collect();
        let ordered_bytes: u64 = distinct_order_bytes(order, &footprint);
        let largest = order
            .blocks()
            .iter()
            .map(|block| footprint[block.index()])
            .max()
            .unwrap_or(0);
        if policy == ResidencyPolicy::Planned && ordered_bytes <= capacity_bytes {
            let resident: Vec<bool> = (0..footprint.len())
                .map(|index| order.contains(BlockId(index as u32)))
                .collect();
            // Spare room still gets a ring, so activation pressure can turn resident
            // blocks into streamed ones later; without room, everything just stays.
            let spare_ring = ordered_bytes + largest * u64::from(depth + 1) <= capacity_bytes;
            return Ok(Self {
                resident,
                resident_bytes: ordered_bytes,
                ring_slots: if spare_ring { depth + 1 } else { 0 },
                slot_bytes: largest,
                largest_block_bytes: largest,
                streamed_bytes_per_step: 0,
            });
        }
        let minimum_slots = depth + 1;
        let mut resident = vec![false; block_bytes.len()];
        let (ring_slots, slot_bytes, resident_bytes) = match policy {
            ResidencyPolicy::Planned => {
                let choice = choose_slot_size(order, &footprint, capacity_bytes, minimum_slots)
                    .map_err(|minimum| {
                        let fits_at_depth = (0..depth).rev().find(|&smaller| {
                            minimum_need(order, &footprint, smaller, policy) <= capacity_bytes
                        });
                        minimum.into_error(capacity_bytes, largest, depth, fits_at_depth)
                    })?;
                for &block in &choice.resident {
                    resident[block.index()] = true;
                }
                (minimum_slots, choice.slot_bytes, choice.resident_bytes)
            }
            // Every block competes: as many slots as the budget holds.
            ResidencyPolicy::Lru => {
                let needed = largest * u64::from(minimum_slots);
                if capacity_bytes < needed || largest == 0 {
                    let fits_at_depth = (0..depth)
                        .rev()
                        .find(|&smaller| largest * u64::from(smaller + 1) <= capacity_bytes);
                    return Err(PlanError::VramBudgetTooSmall {
                        budget: Bytes(capacity_bytes),
                        needed: Bytes(needed),
                        largest: Bytes(largest),
                        depth,
                        fits_at_depth,
                    });
                }
                ((capacity_bytes / largest) as u32, largest, 0)
            }
        };
        let streamed_bytes_per_step = order
            .blocks()
            .iter()
            .filter(|block| !resident[block.index()])
            .map(|block| block_bytes[block.index()])
            .sum();
        Ok(Self {
            resident,
            resident_bytes,
            ring_slots,
            slot_bytes,
            largest_block_bytes: largest,
            streamed_bytes_per_step,
        })
    }
}

/// A ring slot size and the resident set it leaves room for.
struct SlotChoice {
    slot_bytes: u64,
    resident: Vec<BlockId>,
    resident_bytes: u64,
}

/// The least VRAM any slot size needs: blocks larger than the slot (resident) + ring.
struct MinimumNeed {
    needed_bytes: u64,
    slot_bytes: u64,
    oversized_bytes: u64,
}

impl MinimumNeed {
    fn into_error(
        self,
        capacity_bytes: u64,
        largest: u64,
        depth: u32,
        fits_at_depth: Option<u32>,
    ) -> PlanError {
        if self.oversized_bytes == 0 || self.slot_bytes == largest {
            PlanError::VramBudgetTooSmall {
                budget: Bytes(capacity_bytes),
                needed: Bytes(self.needed_bytes),
                largest: Bytes(self.slot_bytes),
                depth,
                fits_at_depth,
            }
        } else {
            PlanError::VramBudgetTooSmallForLargeBlocks {
                budget: Bytes(capacity_bytes),
                needed: Bytes(self.needed_bytes),
                oversized: Bytes(self.oversized_bytes),
                slot: Bytes(self.slot_bytes),
                depth,
                fits_at_depth,
            }
        }
    }
}

/// Ring slots are sized for the largest *streamed* block. Sizing them for the largest
/// block of all wastes `depth + 1` times its size when one block is much larger than the
/// rest (an embedding table): keeping such blocks resident and streaming the rest
/// through smaller slots leaves more room for resident blocks. Every distinct block
/// size is a candidate slot size; the one that keeps the most bytes resident wins.
fn choose_slot_size(
    order: &StepOrder,
    footprint: &[u64],
    capacity_bytes: u64,
    slots: u32,
) -> Result<SlotChoice, MinimumNeed> {
    let in_order: Vec<BlockId> = (0..footprint.len() as u32)
        .map(BlockId)
        .filter(|&block| order.contains(block))
        .collect();
    let mut sizes: Vec<u64> = in_order
        .iter()
        .map(|block| footprint[block.index()])
        .filter(|&bytes| bytes > 0)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    let mut best: Option<SlotChoice> = None;
    let mut minimum: Option<MinimumNeed> = None;
    for &slot_bytes in &sizes {
        let oversized: Vec<BlockId> = in_order
            .iter()
            .copied()
            .filter(|block| footprint[block.index()] > slot_bytes)
            .collect();
        let oversized_bytes: u64 = oversized.iter().map(|block| footprint[block.index()]).sum();
        let needed_bytes = oversized_bytes + slot_bytes * u64::from(slots);
        if minimum
            .as_ref()
            .is_none_or(|minimum| needed_bytes < minimum.needed_bytes)
        {
            minimum = Some(MinimumNeed {
                needed_bytes,
                slot_bytes,
                oversized_bytes,
            });
        }
        if needed_bytes > capacity_bytes {
            continue;
        }
        let room = capacity_bytes - needed_bytes;
        let kept = keep_by_priority(order, footprint, room, |block| {
            footprint[block.index()] <= slot_bytes
        });
        let kept_bytes: u64 = kept.iter().map(|block| footprint[block.index()]).sum();
        let resident_bytes = oversized_bytes + kept_bytes;
        if best
            .as_ref()
            .is_none_or(|best| resident_bytes > best.resident_bytes)
        {
            let mut resident = oversized;
            resident.extend(kept);
            best = Some(SlotChoice {
                slot_bytes,
                resident,
                resident_bytes,
            });
        }
    }
    best.ok_or(minimum.unwrap_or(MinimumNeed {
        needed_bytes: 0,
        slot_bytes: 0,
        oversized_bytes: 0,
    }))
}

/// The least capacity [`VramPlan::new`] accepts for this order, depth and policy.
fn minimum_need(order: &StepOrder, footprint: &[u64], depth: u32, policy: ResidencyPolicy) -> u64 {
    let largest = order
        .blocks()
        .iter()
        .map(|block| footprint[block.index()])
        .max()
        .unwrap_or(0);
    let ring = largest * u64::from(depth + 1);
    match policy {
        ResidencyPolicy::Lru => ring,
        ResidencyPolicy::Planned => {
            // Everything resident needs no ring; otherwise the cheapest slot size.
            let everything = distinct_order_bytes(order, footprint);
            let streaming = match choose_slot_size(order, footprint, 0, depth + 1) {
                Ok(_) => 0,
                Err(minimum) => minimum.needed_bytes,
            };
            everything.min(streaming)
        }
    }
}

impl VramPlan {
    /// The least capacity [`VramPlan::new`] accepts: the floor for an automatic budget.
    pub fn minimum_capacity_bytes(
        layout: &ModelLayout,
        order: &StepOrder,
        depth: u32,
        policy: ResidencyPolicy,
    ) -> u64 {
        let footprint: Vec<u64> = layout
            .blocks
            .iter()
            .map(|block| align_up(block.bytes))
            .collect();
        minimum_need(order, &footprint, depth, policy)
    }
}

fn distinct_order_bytes(order: &StepOrder, block_bytes: &[u64]) -> u64 {
    (0..block_bytes.len())
        .filter(|&index| order.contains(BlockId(index as u32)))
        .map(|index| block_bytes[index])
        .sum()
}

/// Greedy by max-scatter priority: keeps each eligible block that still fits in `room`.
pub fn keep_by_priority(
    order: &StepOrder,
    block_bytes: &[u64],
    room_bytes: u64,
    eligible: impl Fn(BlockId) -> bool,
) -> Vec<BlockId> {
    let mut left = room_bytes;
    let mut kept = Vec::new();
    for block in order.by_priority() {
        let bytes = block_bytes[block.index()];
        if eligible(block) && bytes <= left {
            left -= bytes;
            kept.push(block);
        }
    }
    kept
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
