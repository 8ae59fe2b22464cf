//! Seeded jitter and fault injection for simulated reads and copies.
//!
//! Every non-deterministic input of a simulated run comes from here, drawn from a
//! splitmix64 stream seeded by the user: the same seed gives the same durations and
//! the same failures, so a failing run reproduces exactly from its seed.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::SimError;

/// splitmix64 (Steele, Lea, Flood 2014): tiny, fast, and good enough to perturb
/// durations. Not for anything cryptographic.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1), from the top 53 bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// What to perturb, and how much. The default perturbs nothing.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FaultPlan {
    pub seed: u64,
    /// Each read and copy takes its nominal duration × a uniform factor in
    /// [1 − jitter, 1 + jitter]. 0 = exact.
    pub jitter: f64,
    /// Chance that a read is slow (a hiccup: another process, a GC pause in the SSD).
    pub slow_read_probability: f64,
    /// How much slower a slow read is.
    pub slow_read_factor: f64,
    /// Reads after this many successful ones fail with an injected error.
    pub fail_read_after: Option<u64>,
}

impl FaultPlan {
    pub fn validate(&self) -> Result<(), SimError> {
        let invalid = |key: &str, message: String| SimError::InvalidFaults {
            key: key.to_string(),
            message,
        };
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(invalid(
                "jitter",
                format!("{} is outside [0, 1)", self.jitter),
            ));
        }
        if !(0.0..=1.0).contains(&self.slow_read_probability) {
            return Err(invalid(
                "slow_read_probability",
                format!("{} is outside [0, 1]", self.slow_read_probability),
            ));
        }
        if self.slow_read_probability > 0.0 && self.slow_read_factor < 1.0 {
            return Err(invalid(
                "slow_read_factor",
                format!(
                    "{} must be at least 1 when slow_read_probability is set",
                    self.slow_read_factor
                ),
            ));
        }
        Ok(())
    }

    /// The perturbation stream of one resource. Each resource draws from its own
    /// stream, so the copies' durations do not depend on how many reads happened.
    pub(crate) fn perturber(&self, stream: u64) -> Perturber {
        let mut mixer = SplitMix64::new(self.seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        Perturber {
            rng: SplitMix64::new(mixer.next_u64()),
            plan: self.clone(),
            operations: 0,
        }
    }
}

/// What happens to one operation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Outcome {
    Completes(Duration),
    Fails { operation: u64 },
}

#[derive(Debug, Clone)]
pub(crate) struct Perturber {
    rng: SplitMix64,
    plan: FaultPlan,
    operations: u64,
}

impl Perturber {
    /// Perturbs a copy: jitter only.
    pub(crate) fn copy(&mut self, nominal: Duration) -> Duration {
        self.operations += 1;
        self.jittered(nominal)
    }

    /// Perturbs a read: jitter, maybe slow, maybe failed.
    pub(crate) fn read(&mut self, nominal: Duration) -> Outcome {
        let operation = self.operations;
        self.operations += 1;
        if self
            .plan
            .fail_read_after
            .is_some_and(|successful| operation >= successful)
        {
            return Outcome::Fails { operation };
        }
        let mut duration = self.jittered(nominal);
        if self.plan.slow_read_probability > 0.0
            && self.rng.next_f64() < self.plan.slow_read_probability
        {
            duration = duration.mul_f64(self.plan.slow_read_factor);
        }
        Outcome::Completes(duration)
    }

    fn jittered(&mut self, nominal: Duration) -> Duration {
        if self.plan.jitter == 0.0 {
            return nominal;
        }
        let factor = 1.0 + self.plan.jitter * (2.0 * self.rng.next_f64() - 1.0);
        nominal.mul_f64(factor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix64_matches_the_reference_sequence() {
        // First outputs of the reference implementation for seed 1234567.
        let mut rng = SplitMix64::new(1_234_567);
        assert_eq!(rng.next_u64(), 6_457_827_717_110_365_317);
        assert_eq!(rng.next_u64(), 3_203_168_211_198_807_973);
    }

    #[test]
    fn jitter_stays_in_its_band() {
        let plan = FaultPlan {
            seed: 9,
            jitter: 0.1,
            ..FaultPlan::default()
        };
        let mut perturber = plan.perturber(1);
        let nominal = Duration::from_millis(100);
        for _ in 0..1000 {
            let duration = perturber.copy(nominal);
            assert!(
                duration >= Duration::from_millis(90) && duration <= Duration::from_millis(110)
            );
        }
    }

    #[test]
    fn reads_fail_after_the_configured_count() {
        let plan = FaultPlan {
            fail_read_after: Some(2),
            ..FaultPlan::default()
        };
        let mut perturber = plan.perturber(0);
        let nominal = Duration::from_millis(1);
        assert_eq!(perturber.read(nominal), Outcome::Completes(nominal));
        assert_eq!(perturber.read(nominal), Outcome::Completes(nominal));
        assert_eq!(perturber.read(nominal), Outcome::Fails { operation: 2 });
    }

    #[test]
    fn invalid_plans_name_their_key() {
        let plan = FaultPlan {
            jitter: 1.5,
            ..FaultPlan::default()
        };
        let message = plan.validate().unwrap_err().to_string();
        assert!(message.contains("jitter"), "{message}");
    }
}
