//! The actors end to end over in-memory doubles of the device and storage ports.

mod common;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use common::{config, model, MemDevice, MemStorage, BLOCK};
use stagehand_actors::{
    BlockId, BlockLayout, Extent, FileId, ModelLayout, NoObserver, ResidencyPolicy, Session,
    SessionConfig, SessionError,
};

fn run(
    blocks: u64,
    config: SessionConfig,
    steps: usize,
    fail_after: Option<u64>,
) -> (
    Result<(), SessionError>,
    stagehand_actors::StatsSnapshot,
    Arc<MemDevice>,
) {
    let (layout, file) = model(blocks);
    let device = Arc::new(MemDevice::new((blocks * BLOCK) as usize));
    let storage = Arc::new(MemStorage {
        file: file.clone(),
        reads: AtomicU64::new(0),
        fail_after,
    });
    let order: Vec<BlockId> = (0..blocks as u32).map(BlockId).collect();
    let mut session = Session::start(
        config,
        layout,
        order.clone(),
        device.clone(),
        storage,
        Arc::new(NoObserver),
    )
    .unwrap();
    let mut outcome = Ok(());
    'steps: for _ in 0..steps {
        for &block in &order {
            let handle = match session.acquire(block) {
                Ok(handle) => handle,
                Err(error) => {
                    outcome = Err(error);
                    break 'steps;
                }
            };
            let bytes = device.read(handle.ptr, handle.bytes);
            let start = block.index() * BLOCK as usize;
            assert_eq!(bytes, file[start..start + BLOCK as usize], "{block} bytes");
            session.release(handle);
        }
        session.step_done();
    }
    let stats = session.finish();
    (outcome, stats, device)
}

#[test]
fn every_step_delivers_every_block_with_the_right_bytes_within_budget() {
    let (outcome, stats, _) = run(16, config(7, 10, ResidencyPolicy::Planned), 5, None);
    outcome.unwrap();
    assert!(stats.vram.peak_used_bytes <= 7 * BLOCK);
    assert!(stats.pinned.peak_used_bytes <= 10 * BLOCK);
    assert_eq!(stats.step_seconds.len(), 5);
    assert_eq!(stats.hits + stats.misses, 16 * 5);
}

#[test]
fn budgets_return_to_zero_when_the_session_ends() {
    let (outcome, stats, _) = run(16, config(7, 10, ResidencyPolicy::Planned), 3, None);
    outcome.unwrap();
    assert_eq!(stats.vram.used_bytes, 0);
    assert_eq!(stats.pinned.used_bytes, 0);
}

#[test]
fn planned_moves_the_minimum_and_lru_moves_everything() {
    let steps = 6;
    let (_, planned, _) = run(16, config(7, 16, ResidencyPolicy::Planned), steps, None);
    let (_, lru, _) = run(16, config(7, 16, ResidencyPolicy::Lru), steps, None);
    let planned_per_step = planned.pinned_to_vram.model_bytes / steps as u64;
    let lru_per_step = lru.pinned_to_vram.model_bytes / steps as u64;
    // 16 blocks, budget 7, ring 3: 4 resident, 12 streamed.
    assert!(
        planned_per_step.abs_diff(12 * BLOCK) <= BLOCK,
        "planned {planned_per_step}"
    );
    assert!(lru_per_step >= 15 * BLOCK, "lru {lru_per_step}");
}

#[test]
fn a_failed_read_fails_the_run_and_releases_everything() {
    let (outcome, stats, _) = run(16, config(7, 10, ResidencyPolicy::Planned), 3, Some(20));
    let error = outcome.unwrap_err();
    assert!(
        error.to_string().contains("read failed on purpose"),
        "{error}"
    );
    assert_eq!(stats.vram.used_bytes, 0);
    assert_eq!(stats.pinned.used_bytes, 0);
    assert!(stats.errors >= 1);
}

#[test]
fn a_budget_below_the_ring_is_refused_at_start() {
    let (layout, file) = model(8);
    let error = Session::start(
        config(2, 10, ResidencyPolicy::Planned),
        layout,
        (0..8).map(BlockId).collect(),
        Arc::new(MemDevice::new(8 * BLOCK as usize)),
        Arc::new(MemStorage {
            file,
            reads: AtomicU64::new(0),
            fail_after: None,
        }),
        Arc::new(NoObserver),
    )
    .err()
    .unwrap();
    assert_eq!(
        error.to_string(),
        "vram_budget 8 KiB is below the 12 KiB this model needs at minimum (largest block 4 KiB × (prefetch_depth 2 + 1)): set --vram-budget 12KiB or more, or --prefetch-depth 1"
    );
}

#[test]
fn acquiring_a_block_outside_the_model_is_an_error() {
    let (layout, file) = model(4);
    let mut session = Session::start(
        config(4, 4, ResidencyPolicy::Planned),
        layout,
        (0..4).map(BlockId).collect(),
        Arc::new(MemDevice::new(4 * BLOCK as usize)),
        Arc::new(MemStorage {
            file,
            reads: AtomicU64::new(0),
            fail_after: None,
        }),
        Arc::new(NoObserver),
    )
    .unwrap();
    let error = session.acquire(BlockId(9)).unwrap_err();
    assert_eq!(
        error.to_string(),
        "block 9 is not in the model: it has 4 blocks"
    );
    session.finish();
}

#[test]
fn fast_disk_streams_chunks_straight_to_vram_within_ring_plus_ceiling() {
    let mut fast = config(7, 4, ResidencyPolicy::Planned);
    // 1000-byte chunks: unaligned to the 2048-byte extents, so chunks straddle them.
    fast.fast_disk_chunk_bytes = Some(1000);
    let (outcome, stats, _) = run(16, fast, 4, None);
    outcome.unwrap();
    assert!(
        stats.disk_to_vram.model_bytes > 0,
        "nothing streamed disk→vram"
    );
    assert!(stats.pinned.peak_used_bytes <= 4 * BLOCK + 3 * 1000);
    assert_eq!(stats.pinned.used_bytes, 0);
    assert_eq!(stats.vram.used_bytes, 0);
}

#[test]
fn a_failed_chunk_read_fails_the_fast_disk_run_cleanly() {
    let mut fast = config(7, 4, ResidencyPolicy::Planned);
    fast.fast_disk_chunk_bytes = Some(1000);
    let (outcome, stats, _) = run(16, fast, 3, Some(30));
    assert!(outcome.is_err());
    assert_eq!(stats.pinned.used_bytes, 0);
    assert_eq!(stats.vram.used_bytes, 0);
}

#[test]
fn a_block_too_large_for_the_staging_buffers_loads_in_chunks_and_stays_resident() {
    // A head three blocks long, then 12 blocks: the head stays resident (too large to
    // stream), ring slots and staging buffers are sized for one block, and the head is
    // loaded once through the staging buffers in chunks.
    let head = 3 * BLOCK;
    let count = 12u64;
    let total = head + count * BLOCK;
    let file: Vec<u8> = (0..total).map(|i| (i * 13 % 251) as u8).collect();
    let mut blocks = vec![BlockLayout::new(
        "head",
        vec![Extent {
            file: FileId(0),
            offset: 0,
            length: head,
        }],
    )];
    blocks.extend((0..count).map(|index| {
        BlockLayout::new(
            format!("blocks.{index}"),
            vec![Extent {
                file: FileId(0),
                offset: head + index * BLOCK,
                length: BLOCK,
            }],
        )
    }));
    let layout = ModelLayout { blocks };
    let device = Arc::new(MemDevice::new(total as usize));
    let storage = Arc::new(MemStorage {
        file: file.clone(),
        reads: AtomicU64::new(0),
        fail_after: None,
    });
    let order: Vec<BlockId> = (0..=count as u32).map(BlockId).collect();
    let mut session = Session::start(
        config(8, 5, ResidencyPolicy::Planned),
        layout.clone(),
        order.clone(),
        device.clone(),
        storage,
        Arc::new(NoObserver),
    )
    .unwrap();
    assert_eq!(session.plan().vram.slot_bytes, BLOCK);
    assert!(session.plan().vram.resident[0], "the head stays resident");
    assert_eq!(session.plan().pins.staging_buffer_bytes, BLOCK);
    for _ in 0..3 {
        for &block in &order {
            let handle = session.acquire(block).unwrap();
            let extent = layout.blocks[block.index()].extents[0];
            let start = extent.offset as usize;
            assert_eq!(
                device.read(handle.ptr, handle.bytes),
                file[start..start + extent.length as usize],
                "{block} bytes"
            );
            session.release(handle);
        }
        session.step_done();
    }
    let stats = session.finish();
    assert!(stats.vram.peak_used_bytes <= 8 * BLOCK);
    assert!(stats.pinned.peak_used_bytes <= 5 * BLOCK);
    assert_eq!(
        stats.disk_to_vram.model_bytes, head,
        "the head crossed once, in chunks"
    );
    assert_eq!(stats.pinned.used_bytes, 0);
}

#[test]
fn the_disk_reads_ahead_of_the_ring_and_every_read_ahead_is_used() {
    // Proves disk read-ahead runs when the ring is full (blocks read into idle staging
    // buffers before the allocator asks), the loads use them, the bytes stay right
    // (`run` checks every block), and almost nothing is read in vain: only what is in
    // flight or landed at shutdown is dropped, at most one per staging buffer.
    let steps = 5;
    let (outcome, stats, _) = run(16, config(7, 5, ResidencyPolicy::Planned), steps, None);
    outcome.unwrap();
    assert!(stats.read_ahead_used > 0, "{stats:?}");
    assert_eq!(stats.read_ahead_failed, 0);
    assert!(stats.read_ahead_dropped <= 3, "{stats:?}");
}
