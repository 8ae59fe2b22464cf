//! The run summary: what a user reads after `stagehand run`, and its JSON form.

use serde::Serialize;
use stagehand_actors::{AdapterSummary, Link};

use super::Outcome;

mod text;

#[derive(Debug, Serialize)]
pub struct Summary {
    /// What ran: "linear-stack", "moe", "bert encoder", or "stream-verify" (bytes
    /// checked against the file, nothing computed).
    pub workload: &'static str,
    pub device: String,
    pub storage: String,
    pub steps: u64,
    pub verified_steps: u64,
    /// How the steps were checked: full, first, weights or off.
    pub verify: &'static str,
    /// The precision of the many-rows products: f32 or bf16 (`compute_dtype`).
    pub compute_dtype: &'static str,
    /// Blocks checked against the file as they landed (`verify = first | weights`).
    pub landings_checked: u64,
    pub landed_bytes_checked: u64,
    /// Blocks whose expected checksum was read from the files this run; the others
    /// came from the checksums an earlier run on the same, unchanged files kept.
    pub checksums_read_from_files: u64,
    pub model_bytes: u64,
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
    /// The fast-disk staging ring, pinned beside the ceiling.
    pub staging_ring_bytes: u64,
    pub resident_bytes: u64,
    pub streamed_bytes_per_step_planned: u64,
    pub disk_bytes_per_step_planned: u64,
    pub first_step_seconds: f64,
    /// Of the first step, the time the compute thread computed, and the rest: waiting
    /// for the cold reads and copies (a decoder's time to first token, split).
    pub first_step_compute_seconds: f64,
    pub first_step_wait_seconds: f64,
    /// Model bytes read from disk up to the end of the first step (the cold reads):
    /// on the CPU backend they share the cores with the first step's compute.
    pub first_step_read_bytes: u64,
    pub steady_step_seconds: f64,
    pub steady_compute_seconds: f64,
    pub bound_seconds: f64,
    pub bound_limited_by: &'static str,
    /// The compute's share of the bound: the roofline's floor under the step's
    /// kernels (or the measured compute where no roofline is known).
    pub compute_floor_seconds: f64,
    /// The machine's roofline (the CPU backend): bytes/s every core reads, and the
    /// product peak in FLOP/s; 0 where none was measured.
    pub roofline_memory_bytes_per_second: f64,
    pub roofline_flops_per_second: f64,
    /// The compute floor over the measured compute: how close the kernels run to the
    /// machine (1: at its roofline); never above 1 — a step that beat the roofline
    /// raised it (`roofline_raised_by`).
    pub compute_share_of_roofline: f64,
    /// Where the roofline came from: "measured 2025-06-01 12:03 UTC (4 min ago; best
    /// of 5 rounds of 0.25 s on …)"; empty where none was used.
    pub roofline_source: String,
    /// The floor under the roofline as taken over this step's measured compute, where
    /// the step computed faster than it allowed and the roofline was raised to what the
    /// step reached.
    pub roofline_raised_by: Option<f64>,
    /// The steps' copy rate over the cached one, where they copied faster and it was
    /// raised.
    pub copy_rate_raised_by: Option<f64>,
    pub efficiency: f64,
    pub copy_bytes_per_second: f64,
    pub read_bytes_per_second: f64,
    pub pinned_to_vram_bytes_per_step: f64,
    pub disk_to_pinned_bytes_per_step: f64,
    pub disk_to_vram_bytes_per_step: f64,
    pub fast_disk: bool,
    pub hits: u64,
    pub misses: u64,
    pub stall_seconds: f64,
    pub peak_vram_bytes: u64,
    pub peak_pinned_bytes: u64,
    pub vram_evictions: u64,
    pub pin_consolidations: u64,
    pub speculative_declined: u64,
    /// Disk read-aheads a load used, dropped unused, and failed.
    pub read_ahead_used: u64,
    pub read_ahead_dropped: u64,
    pub read_ahead_failed: u64,
    pub vram_bytes_after_shutdown: u64,
    pub pinned_bytes_after_shutdown: u64,
    pub step_seconds: Vec<f64>,
    /// LoRA adapters attached, and their factor bytes — counted apart from
    /// `model_bytes`.
    pub lora_adapters: Vec<AdapterSummary>,
    pub lora_bytes: u64,
    /// The LoRA offloader's own pinned set (every pack) and VRAM (its pack slots).
    pub lora_pinned_bytes: u64,
    pub peak_vram_lora_bytes: u64,
    pub lora_bytes_to_vram: u64,
    /// LoRA bytes re-sent to VRAM per steady step: the packs of streamed blocks.
    pub lora_bytes_to_vram_per_step: f64,
    /// Steps checked against the merged reference within the LoRA tolerance (some
    /// block took the low-rank path); the other LoRA steps matched it bit for bit.
    pub lora_tolerance_steps: u64,
    /// MoE: expert acquires that found the expert ready / that waited for it.
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub expert_hit_rate: f64,
    pub expert_hints: u64,
    /// Of the misses, waits for an expert a hint had already asked for (right, late).
    pub expert_late: u64,
    /// Experts that were resident or already hinted when used: (hits + late) / uses.
    /// What the policy and the hint foresaw, whatever the load speed; the hit rate is
    /// the part of it whose loads also landed in time.
    pub expert_foreseen_rate: f64,
    /// Peak model bytes in VRAM; never above `model_bytes`.
    pub vram_model_bytes_after_first_step: u64,
    /// Model bytes kept in host memory outside the tiers (an encoder's word table,
    /// of which only the gathered rows go to the device).
    pub host_model_bytes: u64,
    /// The process's peak resident set from the run's start (after a roofline
    /// measurement, whose buffers are not the run's), and what the budgets allow it:
    /// (VRAM budget + peak pinned + host model bytes) × 1.1 + 64 MiB, plus
    /// `roofline_measurement_rss_bytes`.
    pub peak_rss_bytes: Option<u64>,
    pub rss_limit_bytes: u64,
    /// Bytes a roofline measurement at the start added to the peak that the system
    /// could not reset away (0 on Linux).
    pub roofline_measurement_rss_bytes: u64,
    /// Decoders: the KV cache at the end, the growths that made resident blocks give
    /// way, how many gave way, and the streamed bytes per step planned after them.
    pub kv_bytes: u64,
    pub kv_growths_with_evictions: u64,
    pub kv_evicted_blocks: u64,
    pub streamed_bytes_per_step_after_kv: u64,
    pub tokens: Vec<u32>,
}

/// `part / whole`, 0 where there is no whole.
fn share(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole
    } else {
        0.0
    }
}

/// Host memory the budgets account for may be exceeded by this factor and margin
/// (allocator slack, the binary, the tokenizer, activations).
const RSS_SLACK: f64 = 1.1;
const RSS_MARGIN_BYTES: u64 = 64 << 20;

/// The peak RSS a run may reach: what its budgets account for (the VRAM budget, the
/// pinned peak, host-held weights) with slack, plus the roofline measurement's own.
fn rss_limit_bytes(outcome: &Outcome) -> u64 {
    let accounted = outcome.budgets.vram_budget_bytes
        + outcome.report.stats.pinned.peak_used_bytes
        + outcome.host_bytes;
    (accounted as f64 * RSS_SLACK) as u64
        + RSS_MARGIN_BYTES
        + outcome.roofline_measurement_rss_bytes
}

impl Summary {
    pub fn new(outcome: &Outcome) -> Self {
        let report = &outcome.report;
        let stats = &report.stats;
        let steady = report.steady_step_seconds();
        let bound = outcome.bound.seconds();
        let first_step = report.step_seconds.first().copied().unwrap_or(0.0);
        let first_compute = report.compute_seconds.first().copied().unwrap_or(0.0);
        let roofline = outcome.roofline.as_ref();
        // A KV growth that had to evict counts once; its evicted blocks count each.
        let kv_evictions = report.kv_growth.iter().map(|(_, _, blocks)| blocks.len());
        let kv_growths_with_evictions = kv_evictions.clone().filter(|&n| n > 0).count() as u64;
        let kv_evicted_blocks = kv_evictions.sum::<usize>() as u64;
        Self {
            workload: outcome.workload,
            device: outcome.device.clone(),
            storage: outcome.storage.clone(),
            steps: report.steps,
            verified_steps: report.verified_steps,
            verify: report.verify.name(),
            compute_dtype: outcome.compute_dtype.name(),
            landings_checked: report.landings_checked,
            checksums_read_from_files: report.checksums_read_from_files,
            landed_bytes_checked: report.landed_bytes_checked,
            model_bytes: outcome.model_bytes,
            vram_budget_bytes: outcome.budgets.vram_budget_bytes,
            pin_ceiling_bytes: outcome.budgets.pin_ceiling_bytes,
            staging_ring_bytes: outcome.staging_ring_bytes,
            resident_bytes: report.plan.vram.resident_bytes,
            streamed_bytes_per_step_planned: report.plan.vram.streamed_bytes_per_step,
            disk_bytes_per_step_planned: report.plan.pins.disk_bytes_per_step,
            first_step_seconds: first_step,
            first_step_compute_seconds: first_compute,
            first_step_wait_seconds: (first_step - first_compute).max(0.0),
            first_step_read_bytes: report.after_first_step.disk_to_pinned.model_bytes
                + report.after_first_step.disk_to_vram.model_bytes,
            steady_step_seconds: steady,
            steady_compute_seconds: report.steady_compute_seconds(),
            bound_seconds: bound,
            bound_limited_by: outcome.bound.limited_by(),
            compute_floor_seconds: outcome.bound.compute_seconds,
            roofline_memory_bytes_per_second: roofline
                .map_or(0.0, |used| used.roofline.memory_bytes_per_second),
            roofline_flops_per_second: roofline.map_or(0.0, |used| used.roofline.flops_per_second),
            compute_share_of_roofline: share(
                outcome.bound.compute_seconds,
                report.steady_compute_seconds(),
            ),
            roofline_source: roofline.map_or_else(String::new, |used| {
                used.roofline.provenance(crate::run::roofline::unix_now())
            }),
            roofline_raised_by: roofline.and_then(|used| used.compute_raised_by),
            copy_rate_raised_by: roofline.and_then(|used| used.copy_raised_by),
            efficiency: share(bound, steady),
            copy_bytes_per_second: outcome.rates.copy_bytes_per_second,
            read_bytes_per_second: outcome.rates.read_bytes_per_second,
            pinned_to_vram_bytes_per_step: report.steady_bytes_per_step(Link::PinnedToVram),
            disk_to_pinned_bytes_per_step: report.steady_bytes_per_step(Link::DiskToPinned),
            disk_to_vram_bytes_per_step: report.steady_bytes_per_step(Link::DiskToVram),
            fast_disk: report.plan.pins.chunked,
            hits: stats.hits,
            misses: stats.misses,
            stall_seconds: stats.stall_seconds,
            peak_vram_bytes: stats.vram.peak_used_bytes,
            peak_pinned_bytes: stats.pinned.peak_used_bytes,
            vram_evictions: stats.vram.evictions,
            pin_consolidations: stats.consolidations,
            speculative_declined: stats.speculative_declined,
            read_ahead_used: stats.read_ahead_used,
            read_ahead_dropped: stats.read_ahead_dropped,
            read_ahead_failed: stats.read_ahead_failed,
            vram_bytes_after_shutdown: stats.vram.used_bytes,
            pinned_bytes_after_shutdown: stats.pinned.used_bytes,
            step_seconds: report.step_seconds.clone(),
            lora_adapters: report.lora.adapters.clone(),
            lora_bytes: report.lora.adapters.iter().map(|a| a.bytes).sum(),
            lora_pinned_bytes: report.lora.pinned_bytes,
            peak_vram_lora_bytes: report.after_first_step.vram.lora_bytes,
            lora_bytes_to_vram: stats.pinned_to_vram.lora_bytes,
            lora_bytes_to_vram_per_step: report.steady_lora_bytes_per_step(),
            lora_tolerance_steps: report.tolerance_steps,
            expert_hits: report.expert_hits,
            expert_misses: report.expert_misses,
            expert_hit_rate: report.expert_share(report.expert_hits),
            expert_hints: report.expert_hints,
            expert_late: report.expert_late,
            expert_foreseen_rate: report.expert_share(report.expert_hits + report.expert_late),
            vram_model_bytes_after_first_step: report.after_first_step.vram.model_bytes,
            host_model_bytes: outcome.host_bytes,
            peak_rss_bytes: outcome.peak_rss_bytes,
            rss_limit_bytes: rss_limit_bytes(outcome),
            roofline_measurement_rss_bytes: outcome.roofline_measurement_rss_bytes,
            kv_bytes: report.kv_bytes,
            kv_growths_with_evictions,
            kv_evicted_blocks,
            streamed_bytes_per_step_after_kv: outcome.streamed_bytes_per_step_after_kv,
            tokens: report.tokens.clone(),
        }
    }
}
