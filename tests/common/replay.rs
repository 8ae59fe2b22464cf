//! Replayable property tests: a recorded seed, a persisted failure file, and the seed
//! printed when a case fails.
//!
//! Every proptest in this workspace runs the same cases on every run (CI included),
//! from a seed recorded next to the test. `PROPTEST_RNG_SEED=<n>` explores other
//! cases; a failing case is saved beside the test file (`*.proptest-regressions`) and
//! replayed first on the next run, whatever the seed.

use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, RngSeed};

/// `cases` cases drawn from `recorded_seed`, or from `PROPTEST_RNG_SEED` when set.
/// The seed goes to stderr, which the test harness shows only for a failing test.
pub fn replayable(cases: u32, recorded_seed: u64) -> Config {
    // `Config::default()` reads PROPTEST_RNG_SEED (and the other PROPTEST_* variables).
    let base = Config::default();
    let seed = match base.rng_seed {
        RngSeed::Fixed(seed) => seed,
        RngSeed::Random => recorded_seed,
    };
    eprintln!(
        "proptest seed {seed} (ChaCha): `PROPTEST_RNG_SEED={seed}` replays these cases; \
         a failing case is also saved in the test's .proptest-regressions file"
    );
    Config {
        cases,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..base
    }
}
