//! The actors end to end over in-memory doubles of the device and storage ports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stagehand_actors::{
    BlockId, BlockLayout, Device, DeviceArena, DeviceError, DevicePtr, Extent, FileId, HostBuffer,
    MemoryInfo, ModelLayout, NoObserver, OpFuture, ResidencyPolicy, Session, SessionConfig,
    SessionError, Storage, StorageError,
};

/// VRAM is a Vec; copies are memcpy on the actor thread.
struct MemDevice {
    memory: Mutex<Vec<u8>>,
    pinned_bytes: AtomicU64,
}

impl MemDevice {
    fn new(bytes: usize) -> Self {
        Self {
            memory: Mutex::new(vec![0; bytes]),
            pinned_bytes: AtomicU64::new(0),
        }
    }

    fn read(&self, ptr: DevicePtr, bytes: u64) -> Vec<u8> {
        let memory = self.memory.lock().unwrap();
        memory[ptr.0 as usize..(ptr.0 + bytes) as usize].to_vec()
    }
}

impl Device for MemDevice {
    fn name(&self) -> String {
        "mem".into()
    }
    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        let total = self.memory.lock().unwrap().len() as u64;
        Ok(MemoryInfo {
            total_bytes: total,
            free_bytes: total,
        })
    }
    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        let total = self.memory.lock().unwrap().len() as u64;
        if bytes > total {
            return Err(DeviceError::OutOfMemory {
                requested_bytes: bytes,
                available_bytes: total,
            });
        }
        Ok(DeviceArena {
            base: DevicePtr(0),
            bytes,
        })
    }
    fn free_arena(&self, _arena: DeviceArena) {}
    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        self.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
        HostBuffer::allocate(bytes as usize).map_err(|error| DeviceError::PinFailed {
            bytes,
            reason: error.to_string(),
        })
    }
    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        {
            let mut memory = self.memory.lock().unwrap();
            let from = &source.as_slice().unwrap()
                [source_offset as usize..(source_offset + bytes) as usize];
            memory[destination.0 as usize..(destination.0 + bytes) as usize].copy_from_slice(from);
        }
        Box::pin(async move { Ok(source) })
    }
}

/// The "file" is a Vec; a read can be made to fail after N reads.
struct MemStorage {
    file: Vec<u8>,
    reads: AtomicU64,
    fail_after: Option<u64>,
}

impl Storage for MemStorage {
    fn name(&self) -> String {
        "mem".into()
    }
    fn read(
        &self,
        extents: Vec<Extent>,
        mut into: HostBuffer,
        into_offset: u64,
    ) -> OpFuture<HostBuffer, (StorageError, HostBuffer)> {
        let count = self.reads.fetch_add(1, Ordering::Relaxed);
        if self.fail_after.is_some_and(|limit| count >= limit) {
            return Box::pin(async move {
                Err((
                    StorageError::Injected("read failed on purpose".into()),
                    into,
                ))
            });
        }
        let mut at = into_offset as usize;
        let slice = into.as_mut_slice().unwrap();
        for extent in extents {
            let from = &self.file[extent.offset as usize..(extent.offset + extent.length) as usize];
            slice[at..at + from.len()].copy_from_slice(from);
            at += from.len();
        }
        Box::pin(async move { Ok(into) })
    }
}

const BLOCK: u64 = 4096;

fn model(blocks: u64) -> (ModelLayout, Vec<u8>) {
    let file: Vec<u8> = (0..blocks * BLOCK).map(|i| (i * 31 % 251) as u8).collect();
    let layout = ModelLayout {
        blocks: (0..blocks)
            .map(|index| {
                // Two extents per block, to check they are laid end to end.
                let half = BLOCK / 2;
                BlockLayout::new(
                    format!("blocks.{index}"),
                    vec![
                        Extent {
                            file: FileId(0),
                            offset: index * BLOCK,
                            length: half,
                        },
                        Extent {
                            file: FileId(0),
                            offset: index * BLOCK + half,
                            length: half,
                        },
                    ],
                )
            })
            .collect(),
    };
    (layout, file)
}

fn config(budget_blocks: u64, pin_blocks: u64, policy: ResidencyPolicy) -> SessionConfig {
    SessionConfig {
        vram_budget_bytes: budget_blocks * BLOCK,
        pin_ceiling_bytes: pin_blocks * BLOCK,
        prefetch_depth: 2,
        staging_buffers: 3,
        fast_disk_chunk_bytes: None,
        policy,
        max_reads_in_flight: 4,
    }
}

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
        "vram_budget 8 KiB is below the 12 KiB this model needs at minimum: largest block 4 KiB × (prefetch_depth 2 + 1)"
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
