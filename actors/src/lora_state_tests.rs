use super::*;

fn summary(name: &str, bytes: u64) -> AdapterSummary {
    AdapterSummary {
        name: name.to_string(),
        strength: 1.0,
        bytes,
    }
}

/// Attaches an adapter with packs of `bytes` for `blocks`, region at `region`.
fn attach(state: &mut LoraState, name: &str, blocks: &[u32], bytes: u64, region: u64) -> LoraSlot {
    let slot = state.claim().expect("a free adapter index");
    let plan = state.plan_attach(vec![bytes; blocks.len()]);
    let buffers = blocks
        .iter()
        .map(|_| HostBuffer::allocate(bytes as usize).unwrap())
        .collect();
    let blocks: Vec<BlockId> = blocks.iter().map(|&b| BlockId(b)).collect();
    let total = bytes * blocks.len() as u64;
    state.attach(
        slot,
        summary(name, total),
        &plan,
        &blocks,
        buffers,
        DevicePtr(region),
    );
    slot
}

fn land(state: &mut LoraState, load: PackLoad) -> Option<Detached> {
    state.loaded(load.slot, load.block, load.buffer, true)
}

#[test]
fn packs_ride_with_their_blocks_and_age_out_oldest_first() {
    // Proves a prefetch loads only the packs of adapters that patch the block, into
    // distinct slots, and a full region reuses the slot loaded longest ago.
    let mut state = LoraState::new(8, 2);
    let slot = attach(&mut state, "a", &[0, 1, 2, 3, 4], 1000, 1 << 20);
    assert_eq!(state.usage().vram_bytes, 3 * align_up(1000));
    assert_eq!(state.usage().pinned_bytes, 5000);
    assert!(state.prefetch(BlockId(7)).is_empty(), "no pack for block 7");
    let mut destinations = Vec::new();
    for block in 0..3 {
        let mut loads = state.prefetch(BlockId(block));
        assert_eq!(loads.len(), 1);
        let load = loads.pop().unwrap();
        destinations.push(load.destination);
        land(&mut state, load);
        assert_eq!(state.state(slot, BlockId(block)), BlockState::Ready);
    }
    destinations.sort_by_key(|ptr| ptr.0);
    destinations.dedup();
    assert_eq!(destinations.len(), 3, "three distinct slots");
    // Block 3 takes block 0's slot (loaded first).
    let load = state.prefetch(BlockId(3)).pop().unwrap();
    assert_eq!(state.state(slot, BlockId(0)), BlockState::Absent);
    land(&mut state, load);
    assert_eq!(state.usage().pack_loads, 4);
    assert_eq!(state.usage().pack_bytes_to_vram, 4000);
}

#[test]
fn held_packs_are_never_evicted() {
    // Proves a slot whose pack the compute thread holds is not reused, and a load
    // with every slot held or loading waits (None) instead of evicting.
    let mut state = LoraState::new(8, 1);
    let slot = attach(&mut state, "a", &[0, 1, 2], 64, 0);
    let table = state.table();
    for block in 0..2 {
        let load = state.start_load(slot, BlockId(block)).unwrap();
        land(&mut state, load);
    }
    let first = table
        .try_acquire(LoraState::key(8, slot, BlockId(0)))
        .unwrap();
    let second = table
        .try_acquire(LoraState::key(8, slot, BlockId(1)))
        .unwrap();
    assert!(state.start_load(slot, BlockId(2)).is_none());
    let first_ptr = first.ptr;
    table.release(first);
    let load = state
        .start_load(slot, BlockId(2))
        .expect("block 0's slot is free now");
    assert_eq!(load.destination, first_ptr);
    assert_eq!(state.state(slot, BlockId(1)), BlockState::Ready);
    table.release(second);
    land(&mut state, load);
}

#[test]
fn detach_waits_for_copies_in_flight_and_gives_everything_back() {
    // Proves a detach during a copy hands back the region and every pinned buffer
    // only once the copy has landed, and the table holds nothing of it afterwards.
    let mut state = LoraState::new(4, 2);
    let slot = attach(&mut state, "a", &[0, 1], 128, 4096);
    let ready = state.start_load(slot, BlockId(0)).unwrap();
    land(&mut state, ready);
    let in_flight = state.start_load(slot, BlockId(1)).unwrap();
    assert!(
        state.begin_detach(slot, false).is_none(),
        "a copy is in flight"
    );
    assert!(
        state.find("a").is_none(),
        "a detaching adapter is not found"
    );
    assert!(state.start_load(slot, BlockId(0)).is_none());
    let detached = land(&mut state, in_flight).expect("last copy landed");
    assert_eq!(detached.region, DevicePtr(4096));
    assert_eq!(detached.buffers.len(), 2);
    assert_eq!(state.state(slot, BlockId(0)), BlockState::Absent);
    assert_eq!(state.state(slot, BlockId(1)), BlockState::Absent);
    let usage = state.usage();
    assert_eq!((usage.pinned_bytes, usage.vram_bytes), (0, 0));
    assert_eq!((usage.attached_total, usage.detached_total), (1, 1));
    // The index is free for the next adapter.
    assert_eq!(attach(&mut state, "b", &[0], 8, 0), slot);
}

#[test]
fn a_held_pack_delays_a_detach_but_not_a_shutdown() {
    // Proves a detach never frees a pack the compute thread holds, while shutdown
    // (the arena goes anyway) does not wait for it.
    let mut state = LoraState::new(2, 1);
    let slot = attach(&mut state, "a", &[0], 32, 0);
    let load = state.start_load(slot, BlockId(0)).unwrap();
    land(&mut state, load);
    let table = state.table();
    let _held = table
        .try_acquire(LoraState::key(2, slot, BlockId(0)))
        .unwrap();
    assert!(state.begin_detach(slot, false).is_none());
    assert!(state.begin_detach(slot, true).is_some());
}

#[test]
fn adapters_are_bounded() {
    // Proves the table's bound: at most MAX_ADAPTERS attach at once.
    let mut state = LoraState::new(1, 1);
    for number in 0..MAX_ADAPTERS {
        attach(&mut state, &format!("a{number}"), &[0], 4, 0);
    }
    assert!(state.claim().is_none());
}
