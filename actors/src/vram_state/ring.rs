//! The streaming ring: which slot a streamed block takes, and which ready block gives
//! its slot up — the one needed furthest ahead (planned) or used longest ago (LRU),
//! never one needed sooner than the block that wants it (exhaustion prediction).

use crate::arena::align_up;
use crate::layout::BlockId;
use crate::plan::{Bytes, ResidencyPolicy};
use crate::residency::BlockState;

use super::{Decisions, Placement, VramState};

impl VramState {
    pub(super) fn place_in_ring(
        &mut self,
        block: BlockId,
        speculative: bool,
        decisions: &mut Decisions,
    ) -> Option<Placement> {
        if let Some(slot) = self.ring.iter().position(|slot| slot.block.is_none()) {
            return Some(Placement::Ring { slot });
        }
        let needed_in = self
            .order
            .distance_to_next_use(self.cursor, block)
            .unwrap_or(0);
        let victim = self.choose_victim(needed_in, speculative);
        let Some(slot) = victim else {
            if speculative && self.last_declined != Some(block) {
                decisions.declined = true;
                self.last_declined = Some(block);
            }
            return None;
        };
        let evicted = self.ring[slot].block.take()?;
        self.table.finish_evict(evicted);
        self.placement[evicted.index()] = None;
        decisions.evicted += 1;
        Some(Placement::Ring { slot })
    }

    /// Why a block the compute thread waits for found no place (called when nothing
    /// is in flight, so nothing will free one), and a budget with room for it.
    pub fn no_place(&self, block: BlockId) -> (String, Bytes) {
        let bytes = align_up(self.block_bytes[block.index()]);
        let slot = self.slot_bytes();
        let held_slots = self
            .ring
            .iter()
            .filter(|slot| slot.block.is_some_and(|held| self.table.holders(held) > 0))
            .count();
        let resident = self.plan.is_resident(block);
        let reason = if !resident && !self.ring.is_empty() && held_slots == self.ring.len() {
            format!(
                "every one of the {} ring slots holds a block the compute thread holds; release one before acquiring the next, or raise --prefetch-depth",
                self.ring.len()
            )
        } else if self.ring.is_empty() || bytes > slot {
            let room = self.budget_bytes.saturating_sub(
                self.resident_base() + self.activation_bytes + self.resident_area.used_bytes(),
            );
            format!(
                "it is planned resident and the resident area has {} left beside {} of placed blocks and LoRA regions and {} of activations, and {}",
                Bytes(room),
                Bytes(self.resident_area.used_bytes()),
                Bytes(self.activation_bytes),
                if self.ring.is_empty() {
                    "there is no streaming ring to fall back on".to_string()
                } else {
                    format!("it is larger than a ring slot ({})", Bytes(slot))
                }
            )
        } else {
            "no ring slot could be freed for it".to_string()
        };
        let needed = self.used_bytes() + bytes + self.ring_area_bytes.min(bytes);
        (reason, Bytes(needed.max(self.budget_bytes + bytes)))
    }

    /// A ring slot whose block is ready, unheld and — for the planned policy — needed
    /// later than the block we want to load (exhaustion prediction).
    fn choose_victim(&mut self, needed_in: usize, speculative: bool) -> Option<usize> {
        let mut best: Option<(usize, u64)> = None;
        for (index, slot) in self.ring.iter().enumerate() {
            let Some(block) = slot.block else { continue };
            if self.loading[block.index()] || self.table.holders(block) > 0 {
                continue;
            }
            if self.table.state(block) != BlockState::Ready {
                continue;
            }
            let distance = self
                .order
                .distance_to_next_use(self.cursor, block)
                .unwrap_or(usize::MAX);
            // Whatever the policy, a speculative load never takes the block the compute
            // thread needs next: it may be the one it is waiting for, and evicting it
            // between its copy and the acquire would starve the compute thread.
            if speculative && distance == 0 {
                continue;
            }
            let score = match self.policy {
                ResidencyPolicy::Planned => {
                    if speculative && distance <= needed_in {
                        continue;
                    }
                    distance as u64
                }
                ResidencyPolicy::Lru => u64::MAX - slot.last_use,
            };
            if best.is_none_or(|(_, best_score)| score > best_score) {
                best = Some((index, score));
            }
        }
        let (index, _) = best?;
        let block = self.ring[index].block?;
        // The holder check above and this compare-exchange race only with acquires,
        // which the compare-exchange settles: a block acquired in between stays.
        self.table.try_begin_evict(block).then_some(index)
    }
}
