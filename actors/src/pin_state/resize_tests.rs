use super::super::*;
use crate::layout::{BlockLayout, Extent, FileId, ModelLayout};
use crate::plan::{ResidencyPolicy, Staging, VramPlan};

const BLOCK: u64 = 4096;

fn state(blocks: u32, ceiling_blocks: u64) -> PinState {
    let layout = ModelLayout {
        blocks: (0..blocks)
            .map(|index| {
                let extent = Extent {
                    file: FileId(0),
                    offset: u64::from(index) * BLOCK,
                    length: BLOCK,
                };
                BlockLayout::new(format!("blocks.{index}"), vec![extent])
            })
            .collect(),
    };
    let order = StepOrder::new((0..blocks).map(BlockId).collect(), blocks as usize).unwrap();
    let vram = VramPlan::new(&layout, &order, 4 * BLOCK, 1, ResidencyPolicy::Planned).unwrap();
    let staging = Staging::WholeBlocks { buffers: 2 };
    let pins = PinPlan::new(&layout, &order, &vram, ceiling_blocks * BLOCK, staging).unwrap();
    let ceiling = ceiling_blocks * BLOCK;
    let mut state = PinState::new(vec![BLOCK; blocks as usize], order, pins, ceiling, 4);
    for _ in 0..2 {
        state.add_staging(HostBuffer::virtual_buffer(BLOCK as usize));
    }
    state
}

/// Registers and fills every block the plan caches, as sync points and reads would.
fn fill(state: &mut PinState, blocks: u32) {
    for block in (0..blocks).map(BlockId) {
        if state.plan().is_cached(block) {
            state.registered(block, HostBuffer::virtual_buffer(BLOCK as usize));
            state.filled(block);
        }
    }
}

#[test]
fn a_shrink_gives_back_cache_buffers_and_a_growth_plans_more() {
    // Proves the pinned cache gives way under a lower ceiling (the staging ring
    // stays), a lent-out buffer is counted in what is granted, and a higher ceiling
    // plans more blocks for the cache again.
    let blocks = 8;
    let mut state = state(blocks, 10);
    fill(&mut state, blocks);
    let streamed = vec![true; blocks as usize];
    let before = state.used_bytes();
    let lent = (0..blocks)
        .map(BlockId)
        .find(|&block| state.plan().is_cached(block))
        .unwrap();
    let Some(PinAction::Ready { buffer, .. }) = state.request(lent) else {
        panic!("a cached block is handed out ready");
    };
    let (granted, freed) = state.resize(3 * BLOCK, &streamed);
    assert!(!freed.is_empty());
    // The staging ring (2 blocks) and the lent-out buffer stay: 3 blocks.
    assert_eq!(granted, 3 * BLOCK);
    assert!(state.used_bytes() <= granted && state.used_bytes() < before);
    state.give_back(lent, buffer, BufferHome::Cache, true);
    assert!(state.used_bytes() <= state.ceiling_bytes());
    let (grown, _) = state.resize(10 * BLOCK, &streamed);
    assert_eq!(grown, 10 * BLOCK);
    let cached = (0..blocks)
        .filter(|&b| state.plan().is_cached(BlockId(b)))
        .count();
    assert_eq!(cached, 8);
    // Nothing below the staging ring is granted.
    let (floor, _) = state.resize(0, &streamed);
    assert!(floor >= 2 * BLOCK);
}
