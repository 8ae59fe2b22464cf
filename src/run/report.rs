//! What a run measured, step by step.

use std::collections::BTreeMap;

use stagehand_actors::{Link, LoraUsage, SessionPlan, StatsSnapshot};

#[derive(Debug, Clone)]
pub struct RunReport {
    pub steps: u64,
    pub step_seconds: Vec<f64>,
    /// Time the compute thread spent computing (not waiting) in each step.
    pub compute_seconds: Vec<f64>,
    /// Counters after the first (cold) step, to derive steady-state figures.
    pub after_first_step: StatsSnapshot,
    /// Counters after the session was shut down.
    pub stats: StatsSnapshot,
    pub plan: SessionPlan,
    /// Every step's result matched the reference (bit for bit, or checksums).
    pub verified_steps: u64,
    /// The LoRA offloader's accounting just before shutdown.
    pub lora: LoraUsage,
    /// Steps checked within the LoRA tolerance rather than bit for bit.
    pub tolerance_steps: u64,
    /// MoE runs: expert acquires that found the expert ready, and those that waited.
    pub expert_hits: u64,
    pub expert_misses: u64,
    /// Of the misses, waits for an expert a hint had already asked for.
    pub expert_late: u64,
    pub expert_hints: u64,
    /// The last output of each reference key, when the run was asked to keep them.
    pub outputs: BTreeMap<u64, Vec<f32>>,
    /// Decoders: the tokens picked, one per step.
    pub tokens: Vec<u32>,
    /// MoE decoders: per step, per layer, the experts used (what an oracle hint replays).
    pub routes: Vec<Vec<Vec<u32>>>,
    /// Decoders: the KV cache's bytes at the end, and each growth that made resident
    /// weights give way: (step, bytes reserved, blocks that now stream).
    pub kv_bytes: u64,
    pub kv_growth: Vec<(u64, u64, Vec<stagehand_actors::BlockId>)>,
    /// How the steps were checked (`verify`).
    pub verify: crate::settings::Verify,
    /// `verify = weights | first`: blocks checked against the file as they landed,
    /// and their bytes.
    pub landings_checked: u64,
    pub landed_bytes_checked: u64,
    /// Blocks whose file checksum the landing check read from the files this run
    /// (the rest came from the checksums an earlier run kept).
    pub checksums_read_from_files: u64,
}

impl RunReport {
    /// `count` as a share of every expert acquire (0 for a run without experts).
    pub fn expert_share(&self, count: u64) -> f64 {
        let total = self.expert_hits + self.expert_misses;
        if total == 0 {
            0.0
        } else {
            count as f64 / total as f64
        }
    }

    /// A report with nothing run yet, for a session that planned `plan`.
    pub fn new(plan: SessionPlan) -> Self {
        Self {
            steps: 0,
            step_seconds: Vec::new(),
            compute_seconds: Vec::new(),
            after_first_step: StatsSnapshot::default(),
            stats: StatsSnapshot::default(),
            plan,
            verified_steps: 0,
            lora: LoraUsage::default(),
            tolerance_steps: 0,
            expert_hits: 0,
            expert_misses: 0,
            expert_late: 0,
            expert_hints: 0,
            outputs: BTreeMap::new(),
            tokens: Vec::new(),
            routes: Vec::new(),
            kv_bytes: 0,
            kv_growth: Vec::new(),
            verify: crate::settings::Verify::Full,
            landings_checked: 0,
            checksums_read_from_files: 0,
            landed_bytes_checked: 0,
        }
    }

    /// Keeps what a decoder step reports: its token, its routing, its KV growth.
    pub fn record_decoder_step(&mut self, step: u64, output: &crate::families::StepOutput) {
        if !output.experts.routes.is_empty() {
            self.routes.push(output.experts.routes.clone());
        }
        let Some(decoded) = &output.decoded else {
            return;
        };
        self.tokens.push(decoded.token);
        self.kv_bytes = self.kv_bytes.max(decoded.kv_bytes);
        if decoded.kv_reserved_bytes > 0 {
            self.kv_growth
                .push((step, decoded.kv_reserved_bytes, decoded.kv_evicted.clone()));
        }
    }

    /// Median of the steps after the first.
    pub fn steady_step_seconds(&self) -> f64 {
        median(steady(&self.step_seconds))
    }

    pub fn steady_compute_seconds(&self) -> f64 {
        median(steady(&self.compute_seconds))
    }

    /// LoRA bytes copied pinned → VRAM per steady step: the packs re-sent with
    /// streamed blocks (the first, cold step excluded).
    pub fn steady_lora_bytes_per_step(&self) -> f64 {
        let later_steps = self.steps.saturating_sub(1).max(1) as f64;
        let first = self.after_first_step.pinned_to_vram.lora_bytes;
        self.stats.pinned_to_vram.lora_bytes.saturating_sub(first) as f64 / later_steps
    }

    /// Bytes per steady-state step over a link. Into VRAM, each load counts for the
    /// step that uses it (a prefetch for step 2 that lands during step 1 is step 2's):
    /// the mean of the steps after the first. Elsewhere (and where the steps used the
    /// order more than once each), the counters' growth after step 1.
    pub fn steady_bytes_per_step(&self, link: Link) -> f64 {
        let later_steps = self.steps.saturating_sub(1);
        if later_steps == 0 {
            return self.stats.link(link).model_bytes as f64;
        }
        let loads = &self.stats.step_loads;
        let one_pass_a_step = loads.last().is_some_and(|last| last.step < self.steps)
            && self.steps <= stagehand_actors::STEP_HISTORY as u64;
        if link != Link::DiskToPinned && one_pass_a_step {
            let steady: u64 = (1..self.steps)
                .map(|step| self.stats.step_bytes(link, step))
                .sum();
            return steady as f64 / later_steps as f64;
        }
        let grown =
            self.stats.link(link).model_bytes - self.after_first_step.link(link).model_bytes;
        grown as f64 / later_steps as f64
    }
}

/// The steps after the first (cold) one, or all of them when there is only one.
fn steady(values: &[f64]) -> &[f64] {
    values
        .get(1..)
        .filter(|rest| !rest.is_empty())
        .unwrap_or(values)
}

pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}
