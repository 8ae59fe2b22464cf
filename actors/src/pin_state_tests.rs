use super::*;
use crate::layout::{BlockLayout, Extent, FileId, ModelLayout};
use crate::plan::{ResidencyPolicy, Staging, VramPlan};

const BLOCK: u64 = 4096;

fn state(blocks: u32, vram_blocks: u64, ceiling_blocks: u64) -> PinState {
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
    let vram = VramPlan::new(
        &layout,
        &order,
        vram_blocks * BLOCK,
        2,
        ResidencyPolicy::Planned,
    )
    .unwrap();
    let pins = PinPlan::new(
        &layout,
        &order,
        &vram,
        ceiling_blocks * BLOCK,
        Staging::WholeBlocks { buffers: 3 },
    )
    .unwrap();
    let mut state = PinState::new(
        vec![BLOCK; blocks as usize],
        order,
        pins,
        ceiling_blocks * BLOCK,
        4,
    );
    for _ in 0..3 {
        state.add_staging(HostBuffer::virtual_buffer(BLOCK as usize));
    }
    state
}

fn first_cached(state: &PinState, blocks: u32) -> BlockId {
    (0..blocks)
        .map(BlockId)
        .find(|&block| state.plan().is_cached(block))
        .unwrap()
}

#[test]
fn requests_never_register_memory_sync_points_do() {
    let mut state = state(16, 7, 8);
    let cached = first_cached(&state, 16);
    let before = state.used_bytes();
    let action = state.request(cached).unwrap();
    assert!(
        matches!(
            action,
            PinAction::Read {
                home: BufferHome::Staging,
                ..
            }
        ),
        "an unregistered block goes through staging"
    );
    assert_eq!(state.used_bytes(), before, "no registration mid-block");
    let due = state.registrations_due(0);
    assert!(due.iter().any(|(block, _)| *block == cached));
    for (block, bytes) in due {
        state.registered(block, HostBuffer::virtual_buffer(bytes as usize));
    }
    assert!(state.used_bytes() <= state.ceiling_bytes());
}

#[test]
fn a_filled_cache_buffer_is_served_without_disk() {
    let mut state = state(16, 7, 8);
    let cached = first_cached(&state, 16);
    state.registered(cached, HostBuffer::virtual_buffer(BLOCK as usize));
    let PinAction::Read { buffer, home, .. } = state.request(cached).unwrap() else {
        panic!("the first use reads into the cache buffer");
    };
    assert_eq!(home, BufferHome::Cache);
    state.filled(cached);
    assert!(state.give_back(cached, buffer, home, true).is_none());
    assert!(matches!(
        state.request(cached).unwrap(),
        PinAction::Ready {
            home: BufferHome::Cache,
            ..
        }
    ));
}

#[test]
fn requests_wait_for_a_staging_buffer_and_resume_in_order() {
    let mut state = state(16, 7, 3);
    let mut lent = Vec::new();
    for index in 0..3 {
        match state.request(BlockId(index)).unwrap() {
            PinAction::Read {
                block,
                buffer,
                home,
            } => lent.push((block, buffer, home)),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        state.request(BlockId(3)).is_none(),
        "ring exhausted: it waits"
    );
    assert_eq!(state.lent_out(), 3);
    let (block, buffer, home) = lent.remove(0);
    let next = state.give_back(block, buffer, home, true).unwrap();
    assert!(matches!(
        next,
        PinAction::Read {
            block: BlockId(3),
            ..
        }
    ));
}

#[test]
fn registrations_stop_at_the_ceiling() {
    let mut state = state(16, 7, 5);
    let due = state.registrations_due(0);
    let bytes: u64 = due.iter().map(|(_, bytes)| bytes).sum();
    assert!(state.used_bytes() + bytes <= state.ceiling_bytes());
}
