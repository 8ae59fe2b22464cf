//! The resident hot path: `acquire` + `release` of a ready block, beside the obvious
//! alternative of a `Mutex<HashMap>` residency map. Run: `cargo bench --bench hot_path`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;

use criterion::{criterion_group, criterion_main, Criterion};
use stagehand::actors::{BlockId, DevicePtr, ResidencyTable};

const BLOCKS: u32 = 80;

fn hot_path(c: &mut Criterion) {
    let table = ResidencyTable::new((0..BLOCKS).map(|_| 1 << 20));
    for block in 0..BLOCKS {
        table.publish_ready(BlockId(block), DevicePtr(u64::from(block) << 20), false);
    }
    let mut group = c.benchmark_group("resident acquire+release");
    let mut next = 0u32;
    group.bench_function("stagehand residency table", |b| {
        b.iter(|| {
            next = (next + 1) % BLOCKS;
            let handle = table.try_acquire(BlockId(next)).expect("resident");
            black_box(handle.ptr);
            table.release(handle);
        })
    });

    let map: Mutex<HashMap<u32, (u64, u32)>> = Mutex::new(
        (0..BLOCKS)
            .map(|block| (block, (u64::from(block) << 20, 0)))
            .collect(),
    );
    group.bench_function("Mutex<HashMap> baseline", |b| {
        b.iter(|| {
            next = (next + 1) % BLOCKS;
            let pointer = {
                let mut guard = map.lock().expect("not poisoned");
                let entry = guard.get_mut(&next).expect("resident");
                entry.1 += 1;
                entry.0
            };
            black_box(pointer);
            let mut guard = map.lock().expect("not poisoned");
            if let Some(entry) = guard.get_mut(&next) {
                entry.1 -= 1;
            }
        })
    });
    group.finish();
}

/// The same path through a real session: the compute thread's `acquire` (residency
/// word, position tracking, hit counter) and `release` on a fully resident model.
fn session_hot_path(c: &mut Criterion) {
    use stagehand::actors::{NoObserver, ResidencyPolicy, Session, SessionConfig};
    use stagehand::device::CpuDevice;
    use stagehand::model::demo::{write_linear_stack, DemoSpec};
    use stagehand::model::ModelIndex;
    use stagehand::storage::{PreadStorage, StorageFile, StorageOptions};
    use std::sync::Arc;

    let dir = std::env::temp_dir().join(format!("stagehand-hot-path-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let spec = DemoSpec {
        blocks: 16,
        layers_per_block: 1,
        dim: 64,
        seed: 1,
    };
    let path = write_linear_stack(&dir, &spec).expect("demo model");
    let index = ModelIndex::open(&path, None).expect("index");
    let layout = index.layout();
    let files: Vec<StorageFile> = index
        .files
        .iter()
        .map(|file| StorageFile {
            path: file.path.clone(),
            expected_bytes: file.bytes,
        })
        .collect();
    let storage =
        Arc::new(PreadStorage::open(&files, &StorageOptions::default()).expect("storage"));
    let budget = layout.total_bytes() * 2;
    let device = Arc::new(CpuDevice::new(budget).expect("device"));
    let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
    let mut session = Session::start(
        SessionConfig {
            vram_budget_bytes: budget,
            pin_ceiling_bytes: budget,
            prefetch_depth: 2,
            staging_buffers: 3,
            fast_disk_chunk_bytes: None,
            policy: ResidencyPolicy::Planned,
            max_reads_in_flight: 4,
            activation_reserve_bytes: 0,
        },
        layout,
        order.clone(),
        device,
        storage,
        Arc::new(NoObserver),
    )
    .expect("session");
    for &block in &order {
        let handle = session.acquire(block).expect("warm-up acquire");
        session.release(handle);
    }
    let mut position = 0usize;
    c.bench_function("session acquire+release (resident)", |b| {
        b.iter(|| {
            let block = order[position];
            position = (position + 1) % order.len();
            let handle = session.try_acquire(block).expect("resident");
            black_box(handle.ptr);
            session.release(handle);
        })
    });
    session.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, hot_path, session_hot_path);
criterion_main!(benches);
