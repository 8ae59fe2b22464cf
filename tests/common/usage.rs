//! An observer of the tiers' usage: what each last reported, and the most VRAM ever
//! reported — for the tests that check a run, a stop or a drop gives every byte back.

use std::sync::atomic::{AtomicU64, Ordering};

use stagehand::actors::{Observer, Tier, TierUsage};

/// The bytes each tier last reported in use, and the most VRAM ever reported.
#[derive(Default)]
pub struct LastUsage {
    pub vram: AtomicU64,
    pub pinned: AtomicU64,
    pub peak_vram: AtomicU64,
}

impl Observer for LastUsage {
    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        let used = usage.used_bytes();
        match tier {
            Tier::Vram => {
                self.vram.store(used, Ordering::SeqCst);
                self.peak_vram.fetch_max(used, Ordering::SeqCst);
            }
            Tier::Pinned => self.pinned.store(used, Ordering::SeqCst),
        }
    }
}
