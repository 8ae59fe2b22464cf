use super::*;
use crate::layout::{BlockLayout, Extent, FileId};

/// One unit of the arena's alignment, so footprints equal sizes.
const U: u64 = 256;

fn layout(sizes: &[u64]) -> ModelLayout {
    let mut offset = 0;
    ModelLayout {
        blocks: sizes
            .iter()
            .enumerate()
            .map(|(index, &bytes)| {
                let extent = Extent {
                    file: FileId(0),
                    offset,
                    length: bytes,
                };
                offset += bytes;
                BlockLayout::new(format!("blocks.{index}"), vec![extent])
            })
            .collect(),
    }
}

fn sequential(count: usize) -> StepOrder {
    StepOrder::new((0..count as u32).map(BlockId).collect(), count).unwrap()
}

fn kept_positions(order: &StepOrder, sizes: &[u64], room: u64) -> Vec<u32> {
    let mut kept: Vec<u32> = keep_by_priority(order, sizes, room, |_| true)
        .into_iter()
        .map(|block| block.0)
        .collect();
    kept.sort();
    kept
}

#[test]
fn max_scatter_matches_the_reference_examples() {
    let order = sequential(8);
    assert_eq!(kept_positions(&order, &[1; 8], 4), vec![1, 3, 5, 7]);
    assert_eq!(kept_positions(&order, &[1; 8], 2), vec![3, 7]);
    let order = sequential(40);
    let kept = kept_positions(&order, &[1; 40], 10);
    assert_eq!(kept, (0..10).map(|i| i * 4 + 3).collect::<Vec<_>>());
}

#[test]
fn next_use_distance_wraps_around_the_step() {
    let order = sequential(5);
    assert_eq!(order.distance_to_next_use(2, BlockId(2)), Some(0));
    assert_eq!(order.distance_to_next_use(2, BlockId(4)), Some(2));
    assert_eq!(order.distance_to_next_use(2, BlockId(1)), Some(4));
    assert_eq!(order.distance_to_next_use(0, BlockId(9)), None);
}

#[test]
fn the_vram_plan_streams_model_minus_budget_minus_ring() {
    let sizes = [10 * U; 10];
    let plan = VramPlan::new(
        &layout(&sizes),
        &sequential(10),
        55 * U,
        2,
        ResidencyPolicy::Planned,
    )
    .unwrap();
    assert_eq!(plan.ring_bytes(), 30 * U);
    assert_eq!(plan.resident_bytes, 20 * U);
    assert_eq!(plan.streamed_bytes_per_step, (100 - 20) * U);
    assert!(plan.resident_bytes + plan.ring_bytes() <= 55 * U);
}

#[test]
fn a_model_that_fits_is_all_resident() {
    let plan = VramPlan::new(
        &layout(&[10 * U; 4]),
        &sequential(4),
        40 * U,
        2,
        ResidencyPolicy::Planned,
    )
    .unwrap();
    assert_eq!(plan.ring_slots, 0);
    assert_eq!(plan.streamed_bytes_per_step, 0);
}

#[test]
fn a_budget_below_the_ring_is_refused_with_the_figures() {
    let error = VramPlan::new(
        &layout(&[32 << 20; 8]),
        &sequential(8),
        64 << 20,
        2,
        ResidencyPolicy::Planned,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "vram_budget 64 MiB is below the 96 MiB this model needs at minimum (largest block 32 MiB × (prefetch_depth 2 + 1)): set --vram-budget 96MiB or more, or --prefetch-depth 1"
    );
}

#[test]
fn lru_streams_everything() {
    let plan = VramPlan::new(
        &layout(&[10 * U; 10]),
        &sequential(10),
        55 * U,
        1,
        ResidencyPolicy::Lru,
    )
    .unwrap();
    assert_eq!(plan.ring_slots, 5);
    assert_eq!(plan.streamed_bytes_per_step, 100 * U);
}

#[test]
fn the_pin_plan_caches_streamed_blocks_up_to_the_ceiling() {
    let model = layout(&[10 * U; 10]);
    let order = sequential(10);
    let vram = VramPlan::new(&model, &order, 55 * U, 2, ResidencyPolicy::Planned).unwrap();
    let pins = PinPlan::new(
        &model,
        &order,
        &vram,
        70 * U,
        Staging::WholeBlocks { buffers: 3 },
    )
    .unwrap();
    assert_eq!(pins.staging_bytes(), 30 * U);
    assert_eq!(pins.cached_bytes, 40 * U);
    for (index, cached) in pins.cached.iter().enumerate() {
        assert!(
            !(*cached && vram.resident[index]),
            "resident blocks need no pin"
        );
    }
    assert_eq!(pins.disk_bytes_per_step, (80 - 40) * U);
    assert!(PinPlan::new(
        &model,
        &order,
        &vram,
        20 * U,
        Staging::WholeBlocks { buffers: 3 }
    )
    .is_err());
}

#[test]
fn on_demand_blocks_are_pinned_with_the_room_the_ordered_ones_leave() {
    // Four ordered layers of 10 units and six on-demand experts of 5 (not in the
    // order): the ordered blocks come first; experts take what is left, whole.
    let mut sizes = vec![10 * U; 4];
    sizes.extend([5 * U; 6]);
    let model = layout(&sizes);
    let order = StepOrder::new((0..4).map(BlockId).collect(), 10).unwrap();
    let vram = VramPlan::new(&model, &order, 30 * U, 2, ResidencyPolicy::Planned).unwrap();
    let staging = Staging::WholeBlocks { buffers: 3 };
    let cached = |ceiling| {
        let pins = PinPlan::new(&model, &order, &vram, ceiling, staging).unwrap();
        let experts = (4..10).filter(|&index| pins.cached[index]).count();
        let ordered = (0..4)
            .filter(|&index| pins.cached[index] || vram.resident[index])
            .count();
        (ordered, experts, pins.disk_bytes_per_step)
    };
    // Staging 30 units; everything else fits.
    assert_eq!(cached(30 * U + 40 * U + 30 * U), (4, 6, 0));
    // Room for the ordered ones and three experts (17 units: 3 whole, not 3.4).
    let (ordered, experts, disk) = cached(30 * U + 40 * U + 17 * U);
    assert_eq!((ordered, experts, disk), (4, 3, 0));
    // Less room than the ordered blocks need: no expert is kept ahead of them.
    let (ordered, experts, disk) = cached(30 * U + 10 * U);
    assert_eq!(experts, 0);
    assert!(ordered < 4 && disk > 0);
}

#[test]
fn an_oversized_block_stays_resident_so_the_ring_can_be_small() {
    // An embedding-like head of 40 units, then 20 layers of 4 units: a ring sized
    // for the head would take 120 units; sized for a layer it takes 12.
    let mut sizes = vec![40 * U];
    sizes.extend([4 * U; 20]);
    let model = layout(&sizes);
    let order = sequential(21);
    let plan = VramPlan::new(&model, &order, 100 * U, 2, ResidencyPolicy::Planned).unwrap();
    assert_eq!(plan.slot_bytes, 4 * U);
    assert!(
        plan.is_resident(BlockId(0)),
        "the head is too large to stream"
    );
    assert_eq!(plan.largest_block_bytes, 40 * U);
    // 100 − 40 (head) − 12 (ring) leaves 48 units: 12 layers resident, 8 stream.
    assert_eq!(plan.streamed_bytes_per_step, 8 * 4 * U);
    assert!(plan.resident_bytes + plan.ring_bytes() <= 100 * U);
}

#[test]
fn the_minimum_budget_counts_blocks_too_large_to_stream() {
    let mut sizes = vec![40 * U];
    sizes.extend([4 * U; 20]);
    let error = VramPlan::new(
        &layout(&sizes),
        &sequential(21),
        50 * U,
        2,
        ResidencyPolicy::Planned,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "vram_budget 12.50 KiB is below the 13 KiB this model needs at minimum (10 KiB of blocks too large to stream, kept resident, + largest streamed block 1 KiB × (prefetch_depth 2 + 1)): set --vram-budget 13KiB or more, or --prefetch-depth 1"
    );
}

#[test]
fn the_minimum_capacity_is_exactly_what_a_plan_accepts() {
    // Proves the figure an automatic budget is raised to is the least one the planner
    // takes, for both policies, with and without blocks too large to stream, and that
    // no depth advice is given when no smaller depth fits.
    let mut mixed = vec![40 * U];
    mixed.extend([4 * U; 20]);
    let cases: [(Vec<u64>, u32); 4] = [
        (vec![32 * U; 8], 2),
        (mixed, 2),
        (vec![7 * U, 3 * U, 9 * U], 0),
        (vec![5 * U, 50 * U, 5 * U, 5 * U], 3),
    ];
    for (sizes, depth) in cases {
        let layout = layout(&sizes);
        let order = sequential(sizes.len());
        for policy in [ResidencyPolicy::Planned, ResidencyPolicy::Lru] {
            let minimum = VramPlan::minimum_capacity_bytes(&layout, &order, depth, policy);
            assert!(
                VramPlan::new(&layout, &order, minimum, depth, policy).is_ok(),
                "{sizes:?} depth {depth} {policy:?}: refused its own minimum {minimum}"
            );
            let error = VramPlan::new(&layout, &order, minimum - 1, depth, policy).unwrap_err();
            assert!(
                error.to_string().contains(&Bytes(minimum).to_string()),
                "{error}"
            );
        }
    }
    let error = VramPlan::new(
        &layout(&[32 << 20; 8]),
        &sequential(8),
        20 << 20,
        2,
        ResidencyPolicy::Planned,
    )
    .unwrap_err();
    assert!(
        !error.to_string().contains("prefetch-depth"),
        "no depth fits 20 MiB, so none is advised: {error}"
    );
}
