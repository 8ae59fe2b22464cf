//! The three ways a simulated (or real) session can use its budgets: stagehand's
//! planned residency with prefetch, and the two baselines it is compared against.

use serde::Serialize;
use stagehand_actors::ResidencyPolicy;

/// How the session uses its budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Planned residency (a fixed max-scatter resident set plus a ring), prefetching
    /// `prefetch_depth` blocks ahead.
    Stagehand,
    /// Accelerate-style: load each block when it is needed, nothing ahead
    /// (`prefetch_depth = 0`, planned residency for what fits).
    Naive,
    /// Diffusers group-offload style: every block competes for LRU slots, one block
    /// prefetched ahead.
    LruPrefetch,
}

impl Policy {
    pub const ALL: [Policy; 3] = [Policy::Stagehand, Policy::Naive, Policy::LruPrefetch];

    pub fn label(self) -> &'static str {
        match self {
            Policy::Stagehand => "stagehand",
            Policy::Naive => "naive",
            Policy::LruPrefetch => "lru-prefetch",
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Policy::Stagehand => "planned residency, prefetch_depth from settings",
            Policy::Naive => "load each block when needed, no prefetch (accelerate-style)",
            Policy::LruPrefetch => "prefetch depth 1, LRU residency (diffusers group offload)",
        }
    }

    pub(super) fn residency(self) -> ResidencyPolicy {
        match self {
            Policy::Stagehand | Policy::Naive => ResidencyPolicy::Planned,
            Policy::LruPrefetch => ResidencyPolicy::Lru,
        }
    }

    /// The prefetch depth this policy runs with, given the configured one.
    pub fn prefetch_depth(self, configured: u32) -> u32 {
        match self {
            Policy::Stagehand => configured,
            Policy::Naive => 0,
            Policy::LruPrefetch => 1,
        }
    }
}
