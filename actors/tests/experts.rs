//! Expert-cache policies on a seeded, skewed, drifting routing trace: hit rate and
//! bytes moved for LRU, LFU and LFU with aging, against Belady's MIN. Prints the table
//! recorded in BENCHMARKS.md (`cargo test -p stagehand-actors --test experts -- --nocapture`).

use stagehand_actors::{replay, replay_optimal, ExpertPolicy, SkewedRouting};

const EXPERT_BYTES: u64 = 256 << 10;

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

#[test]
fn the_default_policy_is_the_best_measured_and_the_table_prints() {
    // Proves the default expert policy has the best hit rate of the online policies on
    // the skewed, drifting trace at every cache size measured (seeded: reproducible).
    let policies = [
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
    ];
    println!("| slots (of 128) | policy | hit rate | MiB moved | vs MIN hit rate |");
    println!("|---|---|---|---|---|");
    for seed in [1u64, 2] {
        let visits = routing(seed).trace(2000);
        for slots in [16usize, 32, 48] {
            let best = replay_optimal(&visits, slots, EXPERT_BYTES);
            let mut figures = Vec::new();
            for policy in policies {
                let result = replay(&visits, slots, EXPERT_BYTES, policy);
                if seed == 1 {
                    println!(
                        "| {slots} | {} | {:.3} | {:.0} | {:.3} |",
                        policy.label(),
                        result.hit_rate(),
                        result.bytes_moved as f64 / (1 << 20) as f64,
                        best.hit_rate()
                    );
                }
                figures.push((policy, result));
            }
            if seed == 1 {
                println!(
                    "| {slots} | MIN (offline bound) | {:.3} | {:.0} | — |",
                    best.hit_rate(),
                    best.bytes_moved as f64 / (1 << 20) as f64
                );
            }
            let default = replay(&visits, slots, EXPERT_BYTES, ExpertPolicy::default());
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
}
