//! Expert-cache policies on a seeded, skewed, drifting routing trace: hit rate and
//! bytes moved for LRU, LFU and LFU with aging, against Belady's MIN. Prints the table
//! recorded in BENCHMARKS.md (`cargo test -p stagehand-actors --test experts -- --nocapture`).

use stagehand_actors::{replay, replay_optimal, CacheFigures, ExpertPolicy, SkewedRouting};

const EXPERT_BYTES: u64 = 256 << 10;
/// The trace and cache sizes of the BENCHMARKS.md table: kept, since the claim is about
/// that trace (a shorter one could rank the policies differently).
const TOKENS: u64 = 2000;
const SLOTS: [usize; 3] = [16, 32, 48];
const SEEDS: [u64; 2] = [1, 2];

/// The policies measured, the default among them.
fn policies() -> [ExpertPolicy; 7] {
    [
        ExpertPolicy::Lru,
        ExpertPolicy::Lfu,
        ExpertPolicy::LfuAging {
            half_life_accesses: 32,
        },
        ExpertPolicy::LfuAging {
            half_life_accesses: 64,
        },
        ExpertPolicy::default(),
        ExpertPolicy::LfuAging {
            half_life_accesses: 256,
        },
        ExpertPolicy::LfuAging {
            half_life_accesses: 512,
        },
    ]
}

fn routing(seed: u64) -> SkewedRouting {
    SkewedRouting {
        layers: 8,
        experts: 16,
        top_k: 2,
        skew: 1.1,
        drift_tokens: 64,
        seed,
    }
}

/// One seed and cache size: every policy's figures (in `policies()` order) and MIN's.
struct Replayed {
    seed: u64,
    slots: usize,
    figures: Vec<(ExpertPolicy, CacheFigures)>,
    best: CacheFigures,
}

/// Replays every (seed, slots) pair on its own thread: the replays are independent and
/// deterministic, and a debug build spends tens of seconds on them one after another.
fn replay_all() -> Vec<Replayed> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = SEEDS
            .iter()
            .flat_map(|&seed| SLOTS.iter().map(move |&slots| (seed, slots)))
            .map(|(seed, slots)| {
                scope.spawn(move || {
                    let visits = routing(seed).trace(TOKENS);
                    let figures = policies()
                        .into_iter()
                        .map(|policy| (policy, replay(&visits, slots, EXPERT_BYTES, policy)))
                        .collect();
                    let best = replay_optimal(&visits, slots, EXPERT_BYTES);
                    Replayed {
                        seed,
                        slots,
                        figures,
                        best,
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.join().expect("replay thread"))
            .collect()
    })
}

#[test]
fn the_default_policy_is_the_best_measured_and_the_table_prints() {
    // Proves the default expert policy has the best hit rate of the online policies on
    // the skewed, drifting trace at every cache size measured (seeded: reproducible).
    println!("| slots (of 128) | policy | hit rate | MiB moved | vs MIN hit rate |");
    println!("|---|---|---|---|---|");
    for replayed in replay_all() {
        let Replayed {
            seed,
            slots,
            figures,
            best,
        } = replayed;
        if seed == 1 {
            for (policy, result) in &figures {
                println!(
                    "| {slots} | {} | {:.3} | {:.0} | {:.3} |",
                    policy.label(),
                    result.hit_rate(),
                    result.bytes_moved as f64 / (1 << 20) as f64,
                    best.hit_rate()
                );
            }
            println!(
                "| {slots} | MIN (offline bound) | {:.3} | {:.0} | — |",
                best.hit_rate(),
                best.bytes_moved as f64 / (1 << 20) as f64
            );
        }
        let default = figures
            .iter()
            .find(|(policy, _)| *policy == ExpertPolicy::default())
            .map(|(_, result)| *result)
            .expect("the default policy was replayed");
        for (policy, result) in &figures {
            assert!(
                default.hits >= result.hits,
                "seed {seed}, {slots} slots: {policy:?} ({}) beats the default ({})",
                result.hits,
                default.hits
            );
        }
    }
}
