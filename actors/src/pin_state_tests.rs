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

fn read_of(action: Option<PinAction>) -> (BlockId, HostBuffer, BufferHome) {
    match action {
        Some(PinAction::Read {
            block,
            buffer,
            home,
        }) => (block, buffer, home),
        other => panic!("expected a read, got {other:?}"),
    }
}

#[test]
fn read_ahead_uses_idle_staging_buffers_one_read_at_a_time() {
    // Proves read-ahead starts one read at a time into idle staging buffers, always
    // leaves one for a request, and a request for a landed block is served without a
    // new read.
    let mut state = state(16, 7, 3);
    let mut actions = state.read_ahead(&[BlockId(5), BlockId(6), BlockId(7)]);
    assert_eq!(actions.len(), 1, "one read at a time");
    let (block, buffer, home) = read_of(actions.pop());
    assert_eq!((block, home), (BlockId(5), BufferHome::Ahead));
    assert!(state.next_read_ahead().is_none(), "a read is in flight");
    assert!(matches!(
        state.ahead_done(block, buffer, true),
        AheadDone::Kept(None)
    ));
    let (next, _buffer, _) = read_of(state.next_read_ahead());
    assert_eq!(next, BlockId(6));
    assert!(state.next_read_ahead().is_none());
    assert!(matches!(
        state.request(BlockId(5)),
        Some(PinAction::Ready {
            block: BlockId(5),
            home: BufferHome::Staging,
            ..
        })
    ));
    // The last idle buffer is the request's, not read-ahead's.
    let (_, _, home) = read_of(state.request(BlockId(9)));
    assert_eq!(home, BufferHome::Staging);
}

#[test]
fn a_request_during_a_read_ahead_gets_it_when_it_lands() {
    // Proves a block asked for while its read-ahead is in flight is handed over when
    // the read lands, and a read for a request holds read-ahead back until it lands.
    let mut state = state(16, 7, 3);
    let (block, buffer, _) = read_of(state.read_ahead(&[BlockId(5)]).pop());
    assert!(
        state.request(BlockId(5)).is_none(),
        "waits for the read-ahead"
    );
    let AheadDone::Wanted(PinAction::Ready { buffer, home, .. }) =
        state.ahead_done(block, buffer, true)
    else {
        panic!("the waiting request gets the landed read");
    };
    // The allocator copies it on to VRAM and gives the buffer back.
    assert!(state.give_back(block, buffer, home, true).is_none());
    let _request = read_of(state.request(BlockId(1)));
    assert!(
        state.read_ahead(&[BlockId(6)]).is_empty(),
        "the disk is busy"
    );
    state.request_read_done();
    let (next, _, _) = read_of(state.next_read_ahead());
    assert_eq!(next, BlockId(6));
}

#[test]
fn a_failed_read_ahead_is_not_retried_and_drain_gets_every_buffer_back() {
    // Proves a failing read-ahead does not spin on a failing disk, the request reads
    // the block itself, and a drain returns every read-ahead buffer.
    let mut state = state(16, 7, 3);
    let (block, buffer, _) = read_of(state.read_ahead(&[BlockId(5), BlockId(6)]).pop());
    assert!(matches!(
        state.ahead_done(block, buffer, false),
        AheadDone::Kept(None)
    ));
    let (next, buffer, _) = read_of(state.next_read_ahead());
    assert_eq!(next, BlockId(6), "block 5 is not read ahead again");
    let (_, _, home) = read_of(state.request(BlockId(5)));
    assert_eq!(
        home,
        BufferHome::Staging,
        "the request reads block 5 itself"
    );
    assert!(state.cancel_read_ahead().is_empty());
    assert!(matches!(
        state.ahead_done(next, buffer, true),
        AheadDone::Kept(None)
    ));
    assert_eq!(state.read_ahead_blocks(), 0);
    assert_eq!(state.lent_out(), 1, "only the request's buffer is out");
}
