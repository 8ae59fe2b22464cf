//! Picking the next token from the logits: greedy (the default), or temperature and
//! top-p (nucleus) sampling from a seeded stream, so a streamed run and its reference
//! pick the same tokens from the same logits.

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// 0: greedy (the most likely token).
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches this.
    pub top_p: f32,
    pub seed: u64,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl Sampling {
    /// Checks the ranges; says which flag is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 || self.temperature > 100.0 {
            return Err(format!(
                "--temperature {} is out of range: 0 (greedy) up to 100",
                self.temperature
            ));
        }
        if !self.top_p.is_finite() || self.top_p <= 0.0 || self.top_p > 1.0 {
            return Err(format!(
                "--top-p {} is out of range: above 0, at most 1",
                self.top_p
            ));
        }
        Ok(())
    }

    /// The next token; `state` is the run's random stream (splitmix64).
    pub fn pick(&self, logits: &[f32], state: &mut u64) -> u32 {
        if self.temperature == 0.0 {
            return argmax(logits);
        }
        let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut weighted: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(id, &logit)| (id as u32, f64::from((logit - top) / self.temperature).exp()))
            .collect();
        // Most likely first; ties by id, so the order never depends on the sort.
        weighted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let total: f64 = weighted.iter().map(|(_, weight)| weight).sum();
        let mut kept = 0.0;
        let mut cut = weighted.len();
        for (index, (_, weight)) in weighted.iter().enumerate() {
            kept += weight / total;
            if kept >= f64::from(self.top_p) {
                cut = index + 1;
                break;
            }
        }
        let nucleus = &weighted[..cut];
        let mass: f64 = nucleus.iter().map(|(_, weight)| weight).sum();
        let mut target = next_unit(state) * mass;
        for &(id, weight) in nucleus {
            if target < weight {
                return id;
            }
            target -= weight;
        }
        nucleus.last().map_or(0, |(id, _)| *id)
    }
}

/// The index of the largest value (the first of equals).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (index, value) in values.iter().enumerate() {
        if *value > values[best] {
            best = index;
        }
    }
    best as u32
}

/// A value in [0, 1) from a splitmix64 stream.
fn next_unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_top_and_sampling_stays_in_the_nucleus() {
        // Proves greedy is argmax, a seed reproduces its choices, and top-p never
        // picks a token outside the nucleus.
        let logits = [0.1f32, 3.0, 2.9, -1.0, 0.0];
        let mut state = 7;
        assert_eq!(Sampling::default().pick(&logits, &mut state), 1);
        let sampling = Sampling {
            temperature: 1.0,
            top_p: 0.6,
            seed: 7,
        };
        let draw = |seed: u64| {
            let mut state = seed;
            (0..200)
                .map(|_| sampling.pick(&logits, &mut state))
                .collect::<Vec<_>>()
        };
        let picks = draw(7);
        assert_eq!(picks, draw(7), "same seed, same tokens");
        assert!(picks.iter().all(|&id| id == 1 || id == 2), "{picks:?}");
        assert!(picks.contains(&1) && picks.contains(&2));
        assert!(Sampling {
            top_p: 0.0,
            ..sampling
        }
        .validate()
        .is_err());
        assert!(Sampling {
            temperature: -1.0,
            ..sampling
        }
        .validate()
        .is_err());
    }
}
