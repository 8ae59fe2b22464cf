use proptest::prelude::*;

use super::*;

const MIB: u64 = 1 << 20;

/// The same cases on every run (a recorded seed, or `PROPTEST_RNG_SEED`), the
/// seed printed when a case fails, failures saved beside this file.
fn replayable(cases: u32, recorded_seed: u64) -> ProptestConfig {
    use proptest::test_runner::{FileFailurePersistence, RngAlgorithm, RngSeed};
    let base = ProptestConfig::default();
    let seed = match base.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => recorded_seed,
    };
    eprintln!("proptest seed {seed}: `PROPTEST_RNG_SEED={seed}` replays these cases");
    ProptestConfig {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..base
    }
}

#[test]
fn chunk_size_is_rounded_up_to_the_granularity() {
    // Proves a chunk hint that is not a whole number of granules is rounded up, and a
    // zero hint still gives one granule.
    let plan = ChunkPlan::new(2 * MIB, 15 * MIB, 1024 * MIB).unwrap();
    assert_eq!(plan.chunk_bytes(), 16 * MIB);
    assert_eq!(plan.max_chunks(), 64);
    assert_eq!(
        ChunkPlan::new(2 * MIB, 0, 8 * MIB).unwrap().chunk_bytes(),
        2 * MIB
    );
}

#[test]
fn the_reservation_is_whole_chunks_and_at_least_one() {
    // Proves a ragged reservation is rounded down and one below a chunk is refused.
    let plan = ChunkPlan::new(2 * MIB, 16 * MIB, 100 * MIB).unwrap();
    assert_eq!(plan.reservation_bytes(), 96 * MIB);
    assert_eq!(
        ChunkPlan::new(2 * MIB, 16 * MIB, 15 * MIB).unwrap_err(),
        ChunkPlanError::ReservationBelowOneChunk {
            reservation_bytes: 15 * MIB,
            chunk_bytes: 16 * MIB
        }
    );
    assert_eq!(
        ChunkPlan::new(0, MIB, MIB).unwrap_err(),
        ChunkPlanError::ZeroGranularity
    );
}

#[test]
fn growing_maps_only_the_new_chunks_in_order() {
    // Proves a grow plans exactly the chunks after the mapped prefix, and a grow to a
    // size already covered plans nothing.
    let mut plan = ChunkPlan::new(2 * MIB, 16 * MIB, 256 * MIB).unwrap();
    let change = plan.plan_grow(40 * MIB).unwrap();
    assert_eq!(change.map, 0..3);
    assert!(change.unmap.is_empty());
    for index in change.map {
        plan.record_mapped(index).unwrap();
    }
    assert_eq!(plan.mapped_bytes(), 48 * MIB);
    assert!(plan.plan_grow(48 * MIB).unwrap().is_empty());
    assert!(plan.plan_grow(1).unwrap().is_empty());
    assert_eq!(plan.plan_grow(49 * MIB).unwrap().map, 3..4);
    assert_eq!(plan.chunk_offset(3), 48 * MIB);
}

#[test]
fn growing_past_the_reservation_is_refused_with_both_sizes() {
    // Proves a request beyond the reserved address space is an error, not a remap.
    let plan = ChunkPlan::new(2 * MIB, 16 * MIB, 64 * MIB).unwrap();
    assert!(plan.plan_grow(64 * MIB).is_ok());
    let error = plan.plan_grow(64 * MIB + 1).unwrap_err();
    assert_eq!(
        error,
        ChunkPlanError::ExceedsReservation {
            requested_bytes: 64 * MIB + 1,
            reservation_bytes: 64 * MIB
        }
    );
    assert!(error.to_string().contains("maximum size"));
}

#[test]
fn shrinking_unmaps_from_the_top_and_keeps_what_is_asked() {
    // Proves a shrink keeps the chunks holding keep_bytes and unmaps the rest, top down.
    let mut plan = ChunkPlan::new(2 * MIB, 16 * MIB, 256 * MIB).unwrap();
    for index in plan.plan_grow(100 * MIB).unwrap().map {
        plan.record_mapped(index).unwrap();
    }
    assert_eq!(plan.mapped_chunks(), 7);
    let change = plan.plan_shrink(20 * MIB);
    assert_eq!(change.unmap, 2..7);
    assert!(change.map.is_empty());
    for index in change.unmap.rev() {
        plan.record_unmapped(index).unwrap();
    }
    assert_eq!(plan.mapped_bytes(), 32 * MIB);
    assert!(plan.plan_shrink(32 * MIB).is_empty());
    assert!(plan.plan_shrink(u64::MAX).is_empty());
    assert_eq!(plan.plan_shrink(0).unmap, 0..2);
}

#[test]
fn out_of_order_records_are_refused() {
    // Proves the bookkeeping refuses a record that would leave a hole in the prefix.
    let mut plan = ChunkPlan::new(MIB, MIB, 4 * MIB).unwrap();
    assert_eq!(
        plan.record_mapped(1).unwrap_err(),
        ChunkPlanError::OutOfOrder {
            expected: 0,
            got: 1
        }
    );
    assert!(plan.record_unmapped(0).is_err());
    for index in 0..4 {
        plan.record_mapped(index).unwrap();
    }
    assert!(plan.record_mapped(4).is_err(), "beyond the reservation");
    assert!(plan.record_unmapped(0).is_err(), "not the top chunk");
    plan.record_unmapped(3).unwrap();
    assert_eq!(plan.mapped_chunks(), 3);
}

#[derive(Debug, Clone)]
enum Operation {
    Grow(u64),
    Shrink(u64),
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        (0..300 * MIB).prop_map(Operation::Grow),
        (0..300 * MIB).prop_map(Operation::Shrink),
    ]
}

proptest! {
    #![proptest_config(replayable(256, 0xc4a2c))]

    #[test]
    fn any_sequence_keeps_a_prefix_and_never_remaps(
        granularity_mib in 1u64..4,
        chunk_hint_mib in 0u64..40,
        reservation_mib in 40u64..260,
        operations in proptest::collection::vec(operation(), 1..40),
    ) {
        // Proves, for random grow/shrink sequences, that mapped chunks stay a prefix
        // within the reservation, a grow never replaces a chunk already mapped, a grow
        // leaves enough room, and a shrink leaves less than one chunk of slack.
        let mut plan = ChunkPlan::new(
            granularity_mib * MIB,
            chunk_hint_mib * MIB,
            reservation_mib * MIB,
        ).unwrap();
        prop_assert_eq!(plan.chunk_bytes() % (granularity_mib * MIB), 0);
        // The "physical handle" behind each mapped chunk: a serial that must not change
        // while the chunk stays mapped.
        let mut handles: Vec<u64> = Vec::new();
        let mut next_serial = 0u64;
        for operation in operations {
            let before = handles.clone();
            match operation {
                Operation::Grow(bytes) => match plan.plan_grow(bytes) {
                    Ok(change) => {
                        prop_assert!(change.unmap.is_empty());
                        prop_assert_eq!(change.map.start, handles.len());
                        for index in change.map {
                            plan.record_mapped(index).unwrap();
                            handles.push(next_serial);
                            next_serial += 1;
                        }
                        prop_assert!(plan.mapped_bytes() >= bytes);
                        prop_assert_eq!(&handles[..before.len()], &before[..]);
                    }
                    Err(ChunkPlanError::ExceedsReservation { .. }) => {
                        prop_assert!(bytes > plan.reservation_bytes());
                    }
                    Err(other) => prop_assert!(false, "unexpected {other}"),
                },
                Operation::Shrink(bytes) => {
                    let change = plan.plan_shrink(bytes);
                    prop_assert!(change.map.is_empty());
                    for index in change.unmap.rev() {
                        plan.record_unmapped(index).unwrap();
                        handles.pop();
                    }
                    if bytes < before.len() as u64 * plan.chunk_bytes() {
                        prop_assert!(plan.mapped_bytes() >= bytes);
                        prop_assert!(plan.mapped_bytes() < bytes + plan.chunk_bytes());
                    } else {
                        prop_assert_eq!(&handles, &before);
                    }
                }
            }
            prop_assert_eq!(plan.mapped_chunks(), handles.len());
            prop_assert!(plan.mapped_bytes() <= plan.reservation_bytes());
            prop_assert!(plan.reservation_bytes() <= reservation_mib * MIB);
        }
    }
}
