//! A session cleans up by type: dropped without `finish` — mid-run, on an error's `?`,
//! or while a panic in the compute closure unwinds — it still gives back every byte
//! of both budgets and leaves no thread behind. One test per binary, so no other
//! test's threads are counted.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::threads::{is_ours, settled_threads};
use common::usage::LastUsage;
use stagehand::actors::{BlockId, Observer, ResidencyPolicy, Session, SessionConfig, SessionError};
use stagehand::device::CpuDevice;
use stagehand::model::ModelIndex;
use stagehand::storage::{open_storage, StorageFile, StorageOptions};

/// A session over the small demo model that streams: VRAM for 3 of its 8 blocks.
fn start(index: &ModelIndex, observer: Arc<LastUsage>) -> Session {
    let layout = index.layout();
    let block = layout.largest_block_bytes();
    let files: Vec<StorageFile> = index
        .files
        .iter()
        .map(|file| StorageFile {
            path: file.path.clone(),
            expected_bytes: file.bytes,
        })
        .collect();
    let settings = stagehand::settings::Settings::default();
    let storage = open_storage(&files, &StorageOptions::from_settings(&settings), false)
        .expect("storage opens");
    let device = Arc::new(CpuDevice::new(3 * block).expect("device"));
    let order = (0..layout.len() as u32).map(BlockId).collect();
    Session::start(
        SessionConfig {
            vram_budget_bytes: 3 * block,
            pin_ceiling_bytes: 4 * block,
            prefetch_depth: 1,
            staging_buffers: 3,
            fast_disk_chunk_bytes: None,
            policy: ResidencyPolicy::Planned,
            max_reads_in_flight: 2,
            activation_reserve_bytes: 0,
        },
        layout,
        order,
        device,
        storage,
        observer as Arc<dyn Observer>,
    )
    .expect("session starts")
}

/// Half a step: blocks 0..4 acquired and released, with pins and VRAM in use.
fn half_a_step(session: &mut Session) -> Result<(), SessionError> {
    for block in 0..4 {
        let handle = session.acquire(BlockId(block))?;
        session.release(handle);
    }
    Ok(())
}

/// An engine's step that fails half-way and returns early with `?`.
fn failing_step(session: &mut Session) -> Result<(), SessionError> {
    half_a_step(session)?;
    let outside = session.acquire(BlockId(99))?; // outside the model: an error
    session.release(outside);
    Ok(())
}

fn assert_released(observer: &LastUsage, case: &str) {
    assert_eq!(
        observer.vram.load(Ordering::SeqCst),
        0,
        "{case}: VRAM in use"
    );
    assert_eq!(
        observer.pinned.load(Ordering::SeqCst),
        0,
        "{case}: pinned in use"
    );
    let threads = settled_threads(is_ours, 0);
    assert!(threads.is_empty(), "{case}: threads left: {threads:?}");
}

#[test]
fn a_dropped_session_releases_every_budget_and_thread() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let index = ModelIndex::open(&model, None).expect("index");
    assert!(settled_threads(is_ours, 0).is_empty());

    // Mid-run: half a step, then the owner goes away.
    let observer = Arc::new(LastUsage::default());
    let mut session = start(&index, observer.clone());
    half_a_step(&mut session).expect("half a step runs");
    assert!(
        observer.pinned.load(Ordering::SeqCst) > 0,
        "the run pinned blocks"
    );
    drop(session);
    assert_released(&observer, "dropped mid-run");

    // After an error: the `?` skips any `finish`.
    let observer = Arc::new(LastUsage::default());
    let mut session = start(&index, observer.clone());
    let failed = failing_step(&mut session);
    assert!(
        matches!(failed, Err(SessionError::UnknownBlock { .. })),
        "{failed:?}"
    );
    drop(session);
    assert_released(&observer, "dropped after an error");

    // A panic in the compute closure while it holds a block.
    let observer = Arc::new(LastUsage::default());
    let session = start(&index, observer.clone());
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let mut session = session;
        let _held = session.acquire(BlockId(0)).expect("block 0");
        panic!("the compute closure failed");
    }));
    assert!(panicked.is_err());
    assert_released(&observer, "dropped by a panic");

    // The finished path still reports the counters, and releases as before.
    let observer = Arc::new(LastUsage::default());
    let mut session = start(&index, observer.clone());
    half_a_step(&mut session).expect("half a step runs");
    let stats = session.finish();
    assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
    assert_released(&observer, "finished");
}
