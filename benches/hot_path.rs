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
            table.release(&handle);
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

criterion_group!(benches, hot_path);
criterion_main!(benches);
