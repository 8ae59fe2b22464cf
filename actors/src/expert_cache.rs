//! Which mixture-of-experts experts stay in VRAM: the eviction policy of the expert
//! cache, and a seeded skewed routing trace to measure policies on.
//!
//! An MoE layer's experts are known only once its router has run, so they cannot be
//! planned like the step order. Routing is skewed (a few experts per layer take most
//! tokens) and drifts slowly, so the policy should weigh how often an expert is used
//! (LFU) while forgetting old popularity (aging). A plain struct with a clock counted
//! in accesses, so a trace gives the same figures on every machine.

use std::collections::HashMap;

/// How the cache picks a victim among unheld, ready experts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ExpertPolicy {
    /// Least recently used.
    Lru,
    /// Least frequently used, counting every use since the start (ties: least recent).
    Lfu,
    /// LFU whose counts halve every `half_life_accesses` accesses, so experts that
    /// were popular long ago give way to today's (frequency-aware with recency).
    LfuAging {
        /// Accesses (to any expert) after which an untouched count is worth half;
        /// 0 is taken as 1.
        half_life_accesses: u32,
    },
}

impl Default for ExpertPolicy {
    /// The best on the measured skewed, drifting trace (BENCHMARKS.md, "LoRA and MoE").
    fn default() -> Self {
        ExpertPolicy::LfuAging {
            half_life_accesses: 128,
        }
    }
}

impl ExpertPolicy {
    /// A short name for tables and logs ("lru", "lfu", "lfu-aging(half-life 128)").
    pub fn label(&self) -> String {
        match self {
            ExpertPolicy::Lru => "lru".to_string(),
            ExpertPolicy::Lfu => "lfu".to_string(),
            ExpertPolicy::LfuAging { half_life_accesses } => {
                format!("lfu-aging(half-life {half_life_accesses})")
            }
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    frequency: f64,
    last_use: u64,
}

/// Use counts of every expert seen (cached or not: a returning expert keeps its
/// history), and the policy that ranks them.
#[derive(Debug, Clone)]
pub struct ExpertCache {
    policy: ExpertPolicy,
    clock: u64,
    entries: HashMap<u32, Entry>,
}

impl ExpertCache {
    pub fn new(policy: ExpertPolicy) -> Self {
        Self {
            policy,
            clock: 0,
            entries: HashMap::new(),
        }
    }

    /// One use of `expert`.
    pub fn touch(&mut self, expert: u32) {
        self.clock += 1;
        let now = self.clock;
        let decayed = self.decayed(expert, now);
        let entry = self.entries.entry(expert).or_default();
        entry.frequency = decayed + 1.0;
        entry.last_use = now;
    }

    fn decayed(&self, expert: u32, now: u64) -> f64 {
        let Some(entry) = self.entries.get(&expert) else {
            return 0.0;
        };
        match self.policy {
            ExpertPolicy::LfuAging { half_life_accesses } => {
                let age = (now - entry.last_use) as f64;
                entry.frequency * (-age / f64::from(half_life_accesses.max(1))).exp2()
            }
            _ => entry.frequency,
        }
    }

    /// Keep-worthiness: the lowest is evicted first. Ties go to the least recent.
    fn score(&self, expert: u32) -> (f64, u64) {
        let last_use = self.entries.get(&expert).map_or(0, |entry| entry.last_use);
        match self.policy {
            ExpertPolicy::Lru => (0.0, last_use),
            ExpertPolicy::Lfu | ExpertPolicy::LfuAging { .. } => {
                (self.decayed(expert, self.clock), last_use)
            }
        }
    }

    /// The candidate to evict, if any.
    pub fn victim(&self, candidates: impl IntoIterator<Item = u32>) -> Option<u32> {
        // Each candidate scored once (a lookup and, with aging, an exp2), not once per
        // comparison; the first of equal scores wins, as before.
        candidates
            .into_iter()
            .map(|expert| (self.score(expert), expert))
            .min_by(|(a, _), (b, _)| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|(_, expert)| expert)
    }
}

/// Hits, misses and bytes moved of one policy over a trace.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct CacheFigures {
    /// Uses that found the expert resident.
    pub hits: u64,
    /// Uses that had to load the expert.
    pub misses: u64,
    /// Bytes those loads copied: `misses × expert_bytes`.
    pub bytes_moved: u64,
}

impl CacheFigures {
    /// Hits over all uses; 0 for an empty trace.
    pub fn hit_rate(&self) -> f64 {
        let total = self.hits + self.misses;
        if total == 0 {
            0.0
        } else {
            self.hits as f64 / total as f64
        }
    }
}

/// Replays `trace` (one expert id per use; `layer_visits` groups uses that must be
/// resident together) through a cache of `slots` experts of `expert_bytes` each. The
/// experts of the current visit are never evicted for each other.
pub fn replay(
    visits: &[Vec<u32>],
    slots: usize,
    expert_bytes: u64,
    policy: ExpertPolicy,
) -> CacheFigures {
    let mut cache = ExpertCache::new(policy);
    let mut resident: Vec<u32> = Vec::with_capacity(slots);
    let mut figures = CacheFigures::default();
    for visit in visits {
        for &expert in visit {
            if resident.contains(&expert) {
                figures.hits += 1;
            } else {
                figures.misses += 1;
                figures.bytes_moved += expert_bytes;
                if resident.len() >= slots {
                    let candidates = resident.iter().copied().filter(|e| !visit.contains(e));
                    if let Some(victim) = cache.victim(candidates) {
                        resident.retain(|&e| e != victim);
                    }
                }
                if resident.len() < slots {
                    resident.push(expert);
                }
            }
            cache.touch(expert);
        }
    }
    figures
}

/// Belady's MIN on the same trace: evict the expert used furthest in the future. The
/// bound no online policy can beat, for the table.
pub fn replay_optimal(visits: &[Vec<u32>], slots: usize, expert_bytes: u64) -> CacheFigures {
    let flat: Vec<u32> = visits.iter().flatten().copied().collect();
    // next_use[i]: the next position after i where flat[i] is used again.
    let mut next_use = vec![usize::MAX; flat.len()];
    let mut last_seen: HashMap<u32, usize> = HashMap::new();
    for (position, &expert) in flat.iter().enumerate().rev() {
        next_use[position] = last_seen.get(&expert).copied().unwrap_or(usize::MAX);
        last_seen.insert(expert, position);
    }
    let mut resident: HashMap<u32, usize> = HashMap::new();
    let mut figures = CacheFigures::default();
    let mut position = 0;
    for visit in visits {
        for &expert in visit {
            if resident.contains_key(&expert) {
                figures.hits += 1;
            } else {
                figures.misses += 1;
                figures.bytes_moved += expert_bytes;
                if resident.len() >= slots {
                    let victim = resident
                        .iter()
                        .filter(|(e, _)| !visit.contains(e))
                        .max_by_key(|(_, &next)| next)
                        .map(|(&e, _)| e);
                    if let Some(victim) = victim {
                        resident.remove(&victim);
                    }
                }
            }
            if resident.len() < slots || resident.contains_key(&expert) {
                resident.insert(expert, next_use[position]);
            }
            position += 1;
        }
    }
    figures
}

/// Seeded top-k routing with Zipf-skewed expert popularity, different per layer, that
/// drifts: every `drift_tokens` tokens each layer's popularity ranking rotates by one.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SkewedRouting {
    /// MoE layers each token passes through.
    pub layers: u32,
    /// Experts per layer.
    pub experts: u32,
    /// Experts each token is routed to per layer (clamped to `1..=experts`).
    pub top_k: u32,
    /// Zipf exponent: the expert of popularity rank r is picked ∝ 1/(r+1)^s.
    pub skew: f64,
    /// Tokens between two rotations of each layer's ranking; 0: no drift.
    pub drift_tokens: u32,
    /// Seeds every pick, so one seed gives one trace on every machine.
    pub seed: u64,
}

impl SkewedRouting {
    /// The experts (within the layer, `0..experts`) that `token` is routed to at `layer`.
    pub fn route(&self, token: u64, layer: u32) -> Vec<u32> {
        let experts = self.experts.max(1);
        let top_k = self.top_k.clamp(1, experts);
        let mut random = SplitMix(
            self.seed ^ token.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (u64::from(layer) << 48),
        );
        let shift = if self.drift_tokens == 0 {
            0
        } else {
            (token / u64::from(self.drift_tokens)) as u32
        };
        // Per-layer popularity: rank r is expert (r · stride + offset + drift) mod E,
        // with a stride coprime to E, so every layer has its own hot set.
        let stride = coprime_stride(experts, layer);
        let offset = SplitMix(self.seed ^ u64::from(layer)).next() as u32 % experts;
        let weights: Vec<f64> = (0..experts)
            .map(|rank| 1.0 / f64::from(rank + 1).powf(self.skew))
            .collect();
        let mut chosen_ranks: Vec<u32> = Vec::with_capacity(top_k as usize);
        while chosen_ranks.len() < top_k as usize {
            let left: f64 = (0..experts)
                .filter(|rank| !chosen_ranks.contains(rank))
                .map(|rank| weights[rank as usize])
                .sum();
            let mut pick = random.unit() * left;
            let mut chosen = experts - 1;
            for rank in (0..experts).filter(|rank| !chosen_ranks.contains(rank)) {
                pick -= weights[rank as usize];
                if pick <= 0.0 {
                    chosen = rank;
                    break;
                }
            }
            if chosen_ranks.contains(&chosen) {
                // Rounding left `pick` above zero: take the last unchosen rank.
                chosen = (0..experts)
                    .rev()
                    .find(|r| !chosen_ranks.contains(r))
                    .unwrap_or(0);
            }
            chosen_ranks.push(chosen);
        }
        chosen_ranks
            .into_iter()
            .map(|rank| (rank * stride + offset + shift) % experts)
            .collect()
    }

    /// Layer visits of `tokens` tokens, experts numbered globally as `layer · E + e`.
    pub fn trace(&self, tokens: u64) -> Vec<Vec<u32>> {
        let mut visits = Vec::with_capacity((tokens * u64::from(self.layers)) as usize);
        for token in 0..tokens {
            for layer in 0..self.layers {
                let experts = self.route(token, layer);
                visits.push(
                    experts
                        .into_iter()
                        .map(|expert| layer * self.experts + expert)
                        .collect(),
                );
            }
        }
        visits
    }
}

fn coprime_stride(experts: u32, layer: u32) -> u32 {
    let gcd = |mut a: u32, mut b: u32| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    (1 + layer * 2..)
        .take(experts as usize + 1)
        .find(|&stride| gcd(stride % experts.max(1), experts) == 1)
        .unwrap_or(1)
}

/// splitmix64, to keep the actors crate free of a random-number dependency.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_the_least_recent() {
        // Proves LRU ranks by last use only.
        let mut cache = ExpertCache::new(ExpertPolicy::Lru);
        for expert in [1, 1, 1, 2, 3] {
            cache.touch(expert);
        }
        assert_eq!(cache.victim([1, 2, 3]), Some(1));
    }

    #[test]
    fn lfu_evicts_the_least_used_and_remembers_evicted_experts() {
        // Proves LFU ranks by use count (ties by recency), also for experts not cached now.
        let mut cache = ExpertCache::new(ExpertPolicy::Lfu);
        for expert in [1, 1, 1, 2, 3, 3] {
            cache.touch(expert);
        }
        assert_eq!(cache.victim([1, 2, 3]), Some(2));
        assert_eq!(cache.victim([1, 3]), Some(3));
        assert_eq!(cache.victim([]), None);
    }

    #[test]
    fn aging_lets_old_popularity_fade() {
        // Proves LFU with aging prefers a recently busy expert over a long-idle one that
        // plain LFU would keep for its old count.
        let mut aging = ExpertCache::new(ExpertPolicy::LfuAging {
            half_life_accesses: 4,
        });
        let mut plain = ExpertCache::new(ExpertPolicy::Lfu);
        let history = std::iter::repeat_n(1, 10)
            .chain(std::iter::repeat_n(9, 40))
            .chain(std::iter::repeat_n(2, 3));
        for expert in history {
            aging.touch(expert);
            plain.touch(expert);
        }
        assert_eq!(plain.victim([1, 2]), Some(2));
        assert_eq!(aging.victim([1, 2]), Some(1));
    }

    #[test]
    fn routing_is_seeded_skewed_and_distinct() {
        // Proves the routing repeats per seed, picks k distinct experts, and is skewed.
        let routing = SkewedRouting {
            layers: 2,
            experts: 16,
            top_k: 2,
            skew: 1.2,
            drift_tokens: 0,
            seed: 3,
        };
        assert_eq!(routing.trace(50), routing.trace(50));
        let mut counts = [0u32; 16];
        for token in 0..2000 {
            let chosen = routing.route(token, 0);
            assert_eq!(chosen.len(), 2);
            assert_ne!(chosen[0], chosen[1]);
            for expert in chosen {
                counts[expert as usize] += 1;
            }
        }
        counts.sort_unstable();
        assert!(counts[15] > 5 * counts[0].max(1), "not skewed: {counts:?}");
    }

    #[test]
    fn optimal_bounds_every_policy() {
        // Proves Belady's MIN is never beaten on a seeded trace, and a cache that holds
        // everything misses only once per expert.
        let routing = SkewedRouting {
            layers: 4,
            experts: 8,
            top_k: 2,
            skew: 1.0,
            drift_tokens: 100,
            seed: 9,
        };
        let visits = routing.trace(400);
        let best = replay_optimal(&visits, 8, 1);
        for policy in [
            ExpertPolicy::Lru,
            ExpertPolicy::Lfu,
            ExpertPolicy::default(),
        ] {
            let figures = replay(&visits, 8, 1, policy);
            assert!(figures.hits <= best.hits, "{policy:?} beat MIN");
            assert_eq!(figures.hits + figures.misses, 400 * 4 * 2);
        }
        let everything = replay(&visits, 32, 1, ExpertPolicy::Lru);
        assert_eq!(everything.misses, 32);
    }
}
