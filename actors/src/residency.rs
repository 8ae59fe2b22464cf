//! The residency table: one atomic word per block, allocated at session start.
//!
//! This is the whole hot path. `try_acquire` on a resident block is a load and a
//! compare-exchange on the block's word — no message, no lock, no allocation. Only the
//! VRAM allocator changes a block's state; the compute thread only changes the holder
//! count. Both go through compare-exchange on the same word, so a block can never be
//! evicted while it is held: eviction requires `Ready` with zero holders, and acquiring
//! requires `Ready`.
//!
//! Word layout: bits 0..8 state, bit 8 `streamed` (its release must be reported),
//! bits 16..40 holders, bits 40..64 generation (bumped on every publish).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::device::DevicePtr;
use crate::layout::BlockId;

const STATE_MASK: u64 = 0xff;
const STREAMED_BIT: u64 = 1 << 8;
const HOLDER_SHIFT: u32 = 16;
const HOLDER_ONE: u64 = 1 << HOLDER_SHIFT;
const HOLDER_MASK: u64 = 0xff_ffff << HOLDER_SHIFT;
const GENERATION_SHIFT: u32 = 40;

/// Where a block is, as the compute thread sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BlockState {
    Absent = 0,
    Loading = 1,
    Ready = 2,
    Evicting = 3,
    Failed = 4,
}

impl BlockState {
    fn from_word(word: u64) -> Self {
        match word & STATE_MASK {
            1 => BlockState::Loading,
            2 => BlockState::Ready,
            3 => BlockState::Evicting,
            4 => BlockState::Failed,
            _ => BlockState::Absent,
        }
    }
}

/// A held block: where its bytes are on the device. Valid until released.
///
/// Move-only: it is neither `Copy` nor `Clone`, and only the residency table makes one
/// (the private field), so a hold is given back exactly once — by
/// [`ResidencyTable::release`] (through `Session::release`), which consumes it. A
/// second release of the same hold does not compile. A handle has no `Drop` that
/// releases: that would need a reference to the table in every handle, an atomic
/// reference count on the hot path.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a held block stays held (never evictable) until it is released"]
pub struct BlockHandle {
    /// The block held (for a LoRA pack, its key in the LoRA table).
    pub block: BlockId,
    /// Where its bytes start on the device: its extents laid end to end.
    pub ptr: DevicePtr,
    /// Its size as the table was made with it: the block's bytes, unaligned (0 in
    /// the LoRA table, whose pack sizes the compute side knows itself).
    pub bytes: u64,
    /// Which landing of the block this is: bumped (24 bits, wrapping) each time the
    /// block is published ready, so a compute side that patched a resident copy (a
    /// LoRA bake) can tell when it holds a fresh, unpatched one.
    pub generation: u32,
    /// The block sits in a streaming slot; releasing it frees the slot.
    pub streamed: bool,
    /// Only the table makes handles.
    _hold: Hold,
}

/// The private proof that a handle came from [`ResidencyTable::try_acquire`].
#[derive(Debug, PartialEq, Eq)]
struct Hold;

struct Entry {
    word: AtomicU64,
    ptr: AtomicU64,
    bytes: u64,
}

/// One atomic word per block, shared by the compute thread (holds) and the VRAM
/// allocator (states); sized once at session start and never grown.
pub struct ResidencyTable {
    entries: Box<[Entry]>,
}

impl ResidencyTable {
    /// A table of one entry per size in `block_bytes`, every block absent.
    pub fn new(block_bytes: impl IntoIterator<Item = u64>) -> Self {
        let entries = block_bytes
            .into_iter()
            .map(|bytes| Entry {
                word: AtomicU64::new(BlockState::Absent as u64),
                ptr: AtomicU64::new(0),
                bytes,
            })
            .collect();
        Self { entries }
    }

    /// Entries in the table: blocks of the model (or packs, for the LoRA table).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table has no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn entry(&self, block: BlockId) -> Option<&Entry> {
        self.entries.get(block.index())
    }

    /// The hot path: takes a hold on a ready block, or says it is not ready.
    #[inline]
    pub fn try_acquire(&self, block: BlockId) -> Option<BlockHandle> {
        let entry = self.entry(block)?;
        let mut word = entry.word.load(Ordering::Acquire);
        loop {
            if BlockState::from_word(word) != BlockState::Ready {
                return None;
            }
            debug_assert!(word & HOLDER_MASK != HOLDER_MASK, "holder count overflow");
            match entry.word.compare_exchange_weak(
                word,
                word + HOLDER_ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(current) => word = current,
            }
        }
        Some(BlockHandle {
            block,
            ptr: DevicePtr(entry.ptr.load(Ordering::Acquire)),
            bytes: entry.bytes,
            generation: (word >> GENERATION_SHIFT) as u32,
            streamed: word & STREAMED_BIT != 0,
            _hold: Hold,
        })
    }

    /// Drops a hold, consuming its handle. Returns the holders left.
    ///
    /// A handle is only made by `try_acquire` on a table and is consumed here, so the
    /// count cannot go below zero for handles of this table. A handle of another table
    /// (with the same block) is the one misuse the types cannot see; the count is never
    /// taken below zero for it, so the generation bits cannot be borrowed from.
    #[inline]
    pub fn release(&self, handle: BlockHandle) -> u64 {
        let Some(entry) = self.entry(handle.block) else {
            return 0;
        };
        let previous = entry.word.fetch_sub(HOLDER_ONE, Ordering::AcqRel);
        let holders = (previous & HOLDER_MASK) >> HOLDER_SHIFT;
        if holders == 0 {
            // Undo: a release without a hold must not borrow from the generation bits.
            entry.word.fetch_add(HOLDER_ONE, Ordering::AcqRel);
            debug_assert!(false, "release without a hold on {}", handle.block);
            return 0;
        }
        holders - 1
    }

    /// The size the table was made with for `block`; 0 for an unknown block.
    pub fn block_bytes(&self, block: BlockId) -> u64 {
        self.entry(block).map_or(0, |entry| entry.bytes)
    }

    /// Where `block` is now; `Absent` for an unknown block. Racy by nature: the
    /// allocator may change it right after.
    pub fn state(&self, block: BlockId) -> BlockState {
        self.entry(block).map_or(BlockState::Absent, |entry| {
            BlockState::from_word(entry.word.load(Ordering::Acquire))
        })
    }

    /// Holds on `block` not yet released; 0 for an unknown block.
    pub fn holders(&self, block: BlockId) -> u64 {
        self.entry(block).map_or(0, |entry| {
            (entry.word.load(Ordering::Acquire) & HOLDER_MASK) >> HOLDER_SHIFT
        })
    }

    // Allocator side. Only the VRAM allocator calls these.

    /// Absent/Failed → Loading.
    pub fn mark_loading(&self, block: BlockId) {
        self.set_state(block, BlockState::Loading, false);
    }

    /// Loading → Ready at `ptr`. The pointer is stored before the state flips, so a
    /// compute thread that sees `Ready` sees the pointer and the copied bytes.
    pub fn publish_ready(&self, block: BlockId, ptr: DevicePtr, streamed: bool) {
        let Some(entry) = self.entry(block) else {
            return;
        };
        entry.ptr.store(ptr.0, Ordering::Release);
        let mut word = entry.word.load(Ordering::Acquire);
        loop {
            let generation = (word >> GENERATION_SHIFT).wrapping_add(1) & 0xff_ffff;
            let next = (word & HOLDER_MASK)
                | (generation << GENERATION_SHIFT)
                | if streamed { STREAMED_BIT } else { 0 }
                | BlockState::Ready as u64;
            match entry
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(current) => word = current,
            }
        }
    }

    /// Ready with no holders → Evicting. False when someone holds the block.
    pub fn try_begin_evict(&self, block: BlockId) -> bool {
        let Some(entry) = self.entry(block) else {
            return false;
        };
        let word = entry.word.load(Ordering::Acquire);
        if BlockState::from_word(word) != BlockState::Ready || word & HOLDER_MASK != 0 {
            return false;
        }
        let next = (word & !STATE_MASK & !STREAMED_BIT) | BlockState::Evicting as u64;
        entry
            .word
            .compare_exchange(word, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Evicting → Absent.
    pub fn finish_evict(&self, block: BlockId) {
        self.set_state(block, BlockState::Absent, false);
    }

    /// Any state → Failed: its load failed, or the drain took its slot while it was
    /// still held. Not acquirable; the next miss resets it and loads it again.
    pub fn mark_failed(&self, block: BlockId) {
        self.set_state(block, BlockState::Failed, false);
    }

    fn set_state(&self, block: BlockId, state: BlockState, streamed: bool) {
        let Some(entry) = self.entry(block) else {
            return;
        };
        let mut word = entry.word.load(Ordering::Acquire);
        loop {
            let next = (word & !STATE_MASK & !STREAMED_BIT)
                | state as u64
                | if streamed { STREAMED_BIT } else { 0 };
            match entry
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return,
                Err(current) => word = current,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ready_blocks_can_be_acquired() {
        let table = ResidencyTable::new([10, 20]);
        assert!(table.try_acquire(BlockId(0)).is_none());
        table.mark_loading(BlockId(0));
        assert!(table.try_acquire(BlockId(0)).is_none());
        table.publish_ready(BlockId(0), DevicePtr(4096), true);
        let handle = table.try_acquire(BlockId(0)).unwrap();
        assert_eq!(handle.ptr, DevicePtr(4096));
        assert_eq!(handle.bytes, 10);
        assert!(handle.streamed);
        assert!(table.try_acquire(BlockId(7)).is_none(), "unknown block");
    }

    #[test]
    fn a_held_block_cannot_be_evicted() {
        let table = ResidencyTable::new([10]);
        table.publish_ready(BlockId(0), DevicePtr(1), false);
        let first = table.try_acquire(BlockId(0)).unwrap();
        let second = table.try_acquire(BlockId(0)).unwrap();
        assert_eq!(table.holders(BlockId(0)), 2);
        assert!(!table.try_begin_evict(BlockId(0)));
        assert_eq!(table.release(first), 1);
        assert!(!table.try_begin_evict(BlockId(0)));
        assert_eq!(table.release(second), 0);
        assert!(table.try_begin_evict(BlockId(0)));
        assert!(
            table.try_acquire(BlockId(0)).is_none(),
            "evicting is not ready"
        );
        table.finish_evict(BlockId(0));
        assert_eq!(table.state(BlockId(0)), BlockState::Absent);
    }

    #[test]
    fn each_publish_bumps_the_generation() {
        let table = ResidencyTable::new([10]);
        table.publish_ready(BlockId(0), DevicePtr(1), false);
        let first = table.try_acquire(BlockId(0)).unwrap();
        let first_generation = first.generation;
        table.release(first);
        assert!(table.try_begin_evict(BlockId(0)));
        table.finish_evict(BlockId(0));
        table.publish_ready(BlockId(0), DevicePtr(2), false);
        let second = table.try_acquire(BlockId(0)).unwrap();
        assert_eq!(second.generation, first_generation + 1);
        assert_eq!(second.ptr, DevicePtr(2));
        table.release(second);
    }

    #[test]
    fn releases_match_holds_one_for_one() {
        // Proves the holder count returns to zero after each hold is released once
        // (a second release of a handle does not compile: handles are move-only), and
        // the generation is untouched by holds.
        let table = ResidencyTable::new([10]);
        table.publish_ready(BlockId(0), DevicePtr(1), true);
        let holds: Vec<BlockHandle> = (0..3)
            .map(|_| table.try_acquire(BlockId(0)).unwrap())
            .collect();
        let generation = holds[0].generation;
        assert_eq!(table.holders(BlockId(0)), 3);
        for handle in holds {
            table.release(handle);
        }
        assert_eq!(table.holders(BlockId(0)), 0);
        assert!(table.try_begin_evict(BlockId(0)));
        table.finish_evict(BlockId(0));
        table.publish_ready(BlockId(0), DevicePtr(1), true);
        let again = table.try_acquire(BlockId(0)).unwrap();
        assert_eq!(again.generation, generation + 1);
        table.release(again);
    }

    #[test]
    fn concurrent_acquires_never_lose_a_hold() {
        let table = std::sync::Arc::new(ResidencyTable::new([10]));
        table.publish_ready(BlockId(0), DevicePtr(1), false);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let table = table.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        let handle = table.try_acquire(BlockId(0)).unwrap();
                        assert!(!table.try_begin_evict(BlockId(0)));
                        table.release(handle);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(table.holders(BlockId(0)), 0);
    }
}
