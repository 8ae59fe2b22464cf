//! A decoder's KV cache as it is reserved: in whole pages, through the session's
//! activation path, as the sequence grows. The decoder reserves it so in a run, and
//! the simulator reserves the same pages at the same steps, so the simulated plan,
//! evictions and peak VRAM are the run's.

use serde::Serialize;

/// A decoder's KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct KvCache {
    /// Keys and values of every layer for one token of every sequence a step decodes.
    pub bytes_per_token: u64,
    /// Tokens of the prompt the first step prefills.
    pub prompt_tokens: u64,
    /// The cache grows by whole pages of this many tokens.
    pub page_tokens: u64,
}

impl KvCache {
    /// Bytes reserved when the cache holds `tokens` tokens: whole pages.
    pub fn reserved_bytes(&self, tokens: u64) -> u64 {
        let page = self.page_tokens.max(1);
        tokens
            .div_ceil(page)
            .saturating_mul(page)
            .saturating_mul(self.bytes_per_token)
    }

    /// Tokens the cache must hold during step `step` (0-based): the prompt in the
    /// prefill, then one more per decoded token.
    pub fn tokens_in_step(&self, step: u64) -> u64 {
        self.prompt_tokens + step
    }

    /// What the session keeps room for as it starts (`SessionConfig::
    /// activation_reserve_bytes`): the pages of the prompt and the first token, as
    /// `run::execute` gives `Prepared::activation_bytes(1)`. The plan is made without
    /// these bytes.
    pub fn start_reserve_bytes(&self) -> u64 {
        self.reserved_bytes(self.prompt_tokens + 1)
    }

    /// Bytes the decoder reserves at the start of step `step`: the pages it adds.
    pub fn growth_bytes(&self, step: u64) -> u64 {
        let now = self.reserved_bytes(self.tokens_in_step(step));
        let before = match step {
            0 => 0,
            _ => self.reserved_bytes(self.tokens_in_step(step - 1)),
        };
        now.saturating_sub(before)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_grows_a_page_at_a_time_as_the_decoder_grows_it() {
        // 10 prompt tokens, pages of 4: the prefill reserves 3 pages (12 tokens), the
        // decode steps add a page each time the tokens cross a page boundary.
        let cache = KvCache {
            bytes_per_token: 100,
            prompt_tokens: 10,
            page_tokens: 4,
        };
        let growth: Vec<u64> = (0..8).map(|step| cache.growth_bytes(step)).collect();
        assert_eq!(growth, [1200, 0, 0, 400, 0, 0, 0, 400]);
        assert_eq!(cache.start_reserve_bytes(), 1200);
        assert_eq!(growth.iter().sum::<u64>(), cache.reserved_bytes(17));
        assert_eq!(cache.reserved_bytes(17), 2000);
    }
}
