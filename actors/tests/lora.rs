//! The LoRA offloader end to end over in-memory doubles: packs ride with their blocks
//! into VRAM byte for byte, inside their own pinned and VRAM accounting, and bad
//! attaches are refused without stopping the session or leaking a byte.

mod common;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use common::{config, model, MemDevice, MemStorage, BLOCK};
use stagehand_actors::{
    AdapterSummary, BlockId, LoraAttach, LoraPack, NoObserver, ResidencyPolicy, Session,
    SessionConfig, SessionError, MAX_ADAPTERS,
};

const BLOCKS: u64 = 16;

fn start(config: SessionConfig) -> (Session, Arc<MemDevice>) {
    let (layout, file) = model(BLOCKS);
    let device = Arc::new(MemDevice::new((BLOCKS * BLOCK) as usize));
    let storage = Arc::new(MemStorage {
        file,
        reads: AtomicU64::new(0),
        fail_after: None,
    });
    let order = (0..BLOCKS as u32).map(BlockId).collect();
    let session = Session::start(
        config,
        layout,
        order,
        device.clone(),
        storage,
        Arc::new(NoObserver),
    )
    .unwrap();
    (session, device)
}

/// An adapter with a pack of `pack_bytes` distinct bytes for each block in `blocks`.
fn adapter(name: &str, blocks: &[u32], pack_bytes: usize) -> LoraAttach {
    let packs: Vec<LoraPack> = blocks
        .iter()
        .map(|&block| LoraPack {
            block: BlockId(block),
            bytes: (0..pack_bytes)
                .map(|i| (i as u32 * 7 + block * 13 + name.len() as u32) as u8)
                .collect(),
        })
        .collect();
    LoraAttach {
        summary: AdapterSummary {
            name: name.to_string(),
            strength: 1.0,
            bytes: (blocks.len() * pack_bytes) as u64,
        },
        packs,
    }
}

/// One step that acquires every block and, where the adapter has one, its pack,
/// checking the pack's bytes on the device.
fn step(
    session: &mut Session,
    device: &MemDevice,
    lora: &LoraAttach,
    slot: stagehand_actors::LoraSlot,
) {
    for block in 0..BLOCKS as u32 {
        let handle = session.acquire(BlockId(block)).unwrap();
        if let Some(pack) = lora.packs.iter().find(|pack| pack.block == BlockId(block)) {
            let factors = session.acquire_lora(slot, BlockId(block)).unwrap();
            assert_eq!(
                device.read(factors.ptr, pack.bytes.len() as u64),
                pack.bytes,
                "block {block} pack"
            );
            session.release_lora(factors);
        }
        session.release(handle);
    }
    session.step_done();
}

#[test]
fn packs_ride_with_their_blocks_inside_their_own_budgets() {
    // Proves every pack reaches VRAM byte for byte, streamed blocks' packs are re-sent
    // each step, the offloader holds ring+1 slots in VRAM and every pack pinned, both
    // inside the budgets, and every byte is back at the end.
    let mut session_config = config(8, 16, ResidencyPolicy::Planned);
    session_config.pin_ceiling_bytes = 20 * BLOCK;
    let (mut session, device) = start(session_config);
    let plan = session.plan().clone();
    let lora = adapter("a", &(0..BLOCKS as u32).collect::<Vec<_>>(), 512);
    let slot = session.attach_lora(lora.clone()).unwrap();
    let usage = session.lora_usage().unwrap();
    assert_eq!(usage.pinned_bytes, 16 * 512);
    assert_eq!(
        usage.vram_bytes,
        (u64::from(plan.vram.ring_slots) + 1) * 512
    );
    let steps = 4;
    let mut after_first = 0;
    for number in 0..steps {
        step(&mut session, &device, &lora, slot);
        if number == 0 {
            after_first = session.stats().pinned_to_vram.lora_bytes;
        }
    }
    let stats = session.stats();
    let resent_per_step = (stats.pinned_to_vram.lora_bytes - after_first) / (steps - 1);
    let streamed = plan
        .vram
        .resident
        .iter()
        .filter(|resident| !**resident)
        .count() as u64;
    // This test acquires every block's pack every step; the region holds ring+1
    // packs, so at least the streamed blocks' packs are re-sent each step.
    assert!(resent_per_step >= streamed * 512, "{resent_per_step}");
    assert!(stats.vram.peak_used_bytes <= 8 * BLOCK);
    assert!(stats.pinned.peak_used_bytes <= 20 * BLOCK);
    assert!(session.detach_lora("a").unwrap());
    let usage = session.lora_usage().unwrap();
    assert_eq!((usage.pinned_bytes, usage.vram_bytes), (0, 0));
    assert!(!session.detach_lora("a").unwrap(), "already detached");
    let stats = session.finish();
    assert_eq!(stats.vram.used_bytes, 0);
    assert_eq!(stats.pinned.used_bytes, 0);
    assert_eq!(stats.pinned.lora_bytes, 0);
    assert_eq!(stats.vram.lora_bytes, 0);
}

#[test]
fn an_adapter_beyond_the_pin_ceiling_is_refused_and_the_session_goes_on() {
    // Proves an attach whose packs cannot fit under the pin ceiling (after the model's
    // pinned cache gives way) is a clear error, leaves nothing held, and the session
    // keeps running and can attach a smaller adapter.
    let (mut session, device) = start(config(8, 5, ResidencyPolicy::Planned));
    let huge = adapter(
        "huge",
        &(0..BLOCKS as u32).collect::<Vec<_>>(),
        BLOCK as usize,
    );
    let error = session.attach_lora(huge).unwrap_err();
    assert!(
        matches!(error, SessionError::LoraPinCeiling { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("--pin-ceiling"), "{error}");
    let usage = session.lora_usage().unwrap();
    assert_eq!((usage.pinned_bytes, usage.vram_bytes), (0, 0));
    let small = adapter("small", &[1, 5, 9], 256);
    let slot = session.attach_lora(small.clone()).unwrap();
    step(&mut session, &device, &small, slot);
    let stats = session.finish();
    assert_eq!(stats.pinned.used_bytes, 0);
    assert_eq!(stats.vram.used_bytes, 0);
}

#[test]
fn attaches_are_bounded_named_uniquely_and_checked() {
    // Proves at most MAX_ADAPTERS attach at once, a second adapter of the same name
    // and packs for blocks outside the model are refused, and a detach frees a place.
    let (mut session, _device) = start(config(8, 16, ResidencyPolicy::Planned));
    for number in 0..MAX_ADAPTERS {
        session
            .attach_lora(adapter(&format!("a{number}"), &[0], 64))
            .unwrap();
    }
    let error = session.attach_lora(adapter("extra", &[0], 64)).unwrap_err();
    assert_eq!(error, SessionError::TooManyAdapters { max: MAX_ADAPTERS });
    assert!(session.detach_lora("a3").unwrap());
    let error = session.attach_lora(adapter("a1", &[0], 64)).unwrap_err();
    assert!(error.to_string().contains("already attached"), "{error}");
    let error = session
        .attach_lora(adapter("outside", &[BLOCKS as u32 + 2], 64))
        .unwrap_err();
    assert!(error.to_string().contains("16 blocks"), "{error}");
    session.attach_lora(adapter("a3", &[0], 64)).unwrap();
    assert_eq!(session.lora_usage().unwrap().adapters.len(), MAX_ADAPTERS);
    let stats = session.finish();
    assert_eq!(stats.pinned.used_bytes, 0);
    assert_eq!(stats.vram.used_bytes, 0);
}

#[test]
fn a_held_pack_blocks_its_detach_with_a_clear_error() {
    // Proves the session refuses to detach while the compute thread holds a pack (its
    // VRAM would be freed under it) and detaches once it is released.
    let (mut session, _device) = start(config(8, 16, ResidencyPolicy::Planned));
    let slot = session.attach_lora(adapter("a", &[2], 128)).unwrap();
    let held = session.acquire_lora(slot, BlockId(2)).unwrap();
    let error = session.detach_lora("a").unwrap_err();
    assert!(error.to_string().contains("release them first"), "{error}");
    session.release_lora(held);
    assert!(session.detach_lora("a").unwrap());
    session.finish();
}
