//! No wait without an end: a block or a LoRA pack the compute thread asks for that
//! nothing in flight can make room for is answered with an error naming what holds the
//! room and what to change, instead of a wait that never ends. Each wait runs under a
//! stop flag raised by a watchdog, so a wait that would never end fails the test as
//! `Interrupted` instead of hanging the suite.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{config, model, MemDevice, MemStorage, BLOCK};
use stagehand_actors::{
    AdapterSummary, BlockId, LoraAttach, LoraPack, NoObserver, ResidencyPolicy, Session,
    SessionError,
};

const BLOCKS: u64 = 8;

/// A session over 8 blocks of which the budget holds 3 (a ring of 3 slots, prefetch
/// depth 2: every block streams) and 1 KiB beside them for a LoRA region, its waits
/// ended by a watchdog after a minute.
fn start() -> Session {
    let (layout, file) = model(BLOCKS);
    let device = Arc::new(MemDevice::new((BLOCKS * BLOCK) as usize));
    let storage = Arc::new(MemStorage {
        file,
        reads: AtomicU64::new(0),
        fail_after: None,
    });
    let order = (0..BLOCKS as u32).map(BlockId).collect();
    let mut config = config(3, 8, ResidencyPolicy::Planned);
    config.vram_budget_bytes += 1024;
    config.activation_reserve_bytes = 1024;
    let mut session = Session::start(config, layout, order, device, storage, Arc::new(NoObserver))
        .expect("starts");
    assert!(
        session
            .plan()
            .vram
            .resident
            .iter()
            .all(|resident| !resident),
        "every block streams"
    );
    let stop = Arc::new(AtomicBool::new(false));
    session.stop_on(stop.clone());
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        stop.store(true, Ordering::SeqCst);
    });
    session
}

#[test]
fn a_block_asked_for_while_compute_holds_every_ring_slot_is_answered_not_waited_for() {
    // Proves acquiring a 4th streamed block while holding the 3 the ring has room for
    // ends at once with NoPlace naming the held ring slots and --vram-budget (it
    // waited forever: only the waiting compute thread could free a slot), and the
    // session then goes on and drains with every byte back.
    let mut session = start();
    let held: Vec<_> = (0..3)
        .map(|block| session.acquire(BlockId(block)).expect("fits the ring"))
        .collect();
    let error = session
        .acquire(BlockId(3))
        .expect_err("no slot can free up");
    assert!(
        matches!(
            error,
            SessionError::NoPlace {
                block: BlockId(3),
                ..
            }
        ),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("ring slots") && message.contains("--vram-budget"),
        "{message}"
    );
    for handle in held {
        session.release(handle);
    }
    let handle = session.acquire(BlockId(3)).expect("a slot is free again");
    session.release(handle);
    let stats = session.finish();
    assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
}

#[test]
fn a_pack_asked_for_while_compute_holds_every_pack_slot_is_answered_not_waited_for() {
    // Proves acquiring a 5th LoRA pack while the compute thread holds the 4 its region
    // has slots for (ring 3 + 1) ends at once with a LoRA error saying the packs are
    // held (it waited forever), and the session then goes on.
    let mut session = start();
    let packs: Vec<LoraPack> = (0..BLOCKS as u32)
        .map(|block| LoraPack {
            block: BlockId(block),
            bytes: vec![block as u8 + 1; 256],
        })
        .collect();
    let adapter = LoraAttach {
        summary: AdapterSummary {
            name: "a".to_string(),
            strength: 1.0,
            bytes: BLOCKS * 256,
        },
        packs,
    };
    let slot = session.attach_lora(adapter).expect("attaches");
    let mut held = Vec::new();
    for block in 0..4 {
        let handle = session.acquire(BlockId(block)).expect("block");
        held.push(session.acquire_lora(slot, BlockId(block)).expect("pack"));
        session.release(handle);
    }
    let handle = session.acquire(BlockId(4)).expect("block 4");
    let error = session
        .acquire_lora(slot, BlockId(4))
        .expect_err("no pack slot can free up");
    assert!(
        matches!(&error, SessionError::Lora { problem, .. } if problem.contains("holds every one of its packs")),
        "{error:?}"
    );
    for pack in held {
        session.release_lora(pack);
    }
    let pack = session
        .acquire_lora(slot, BlockId(4))
        .expect("a pack slot is free again");
    session.release_lora(pack);
    session.release(handle);
    let stats = session.finish();
    assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
}
