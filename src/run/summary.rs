//! The run summary: what a user reads after `stagehand run`, and its JSON form.

use serde::Serialize;
use stagehand_actors::{AdapterSummary, Bytes, Link};

use super::Outcome;

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
    /// Blocks checked against the file as they landed (`verify = first | weights`).
    pub landings_checked: u64,
    pub landed_bytes_checked: u64,
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
    /// machine (1: at its roofline).
    pub compute_share_of_roofline: f64,
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
    /// The process's peak resident set, and what the budgets allow it:
    /// (VRAM budget + peak pinned + host model bytes) × 1.1 + 64 MiB.
    pub peak_rss_bytes: Option<u64>,
    pub rss_limit_bytes: u64,
    /// Decoders: the KV cache at the end, the growths that made resident blocks give
    /// way, how many gave way, and the streamed bytes per step planned after them.
    pub kv_bytes: u64,
    pub kv_growths_with_evictions: u64,
    pub kv_evicted_blocks: u64,
    pub streamed_bytes_per_step_after_kv: u64,
    pub tokens: Vec<u32>,
}

/// Host memory the budgets account for may be exceeded by this factor and margin
/// (allocator slack, the binary, the tokenizer, activations).
const RSS_SLACK: f64 = 1.1;
const RSS_MARGIN_BYTES: u64 = 64 << 20;

impl Summary {
    pub fn new(outcome: &Outcome) -> Self {
        let report = &outcome.report;
        let stats = &report.stats;
        let steady = report.steady_step_seconds();
        let bound = outcome.bound.seconds();
        let accounted =
            outcome.budgets.vram_budget_bytes + stats.pinned.peak_used_bytes + outcome.host_bytes;
        Self {
            workload: outcome.workload,
            device: outcome.device.clone(),
            storage: outcome.storage.clone(),
            steps: report.steps,
            verified_steps: report.verified_steps,
            verify: report.verify.name(),
            landings_checked: report.landings_checked,
            landed_bytes_checked: report.landed_bytes_checked,
            model_bytes: outcome.model_bytes,
            vram_budget_bytes: outcome.budgets.vram_budget_bytes,
            pin_ceiling_bytes: outcome.budgets.pin_ceiling_bytes,
            staging_ring_bytes: outcome.staging_ring_bytes,
            resident_bytes: report.plan.vram.resident_bytes,
            streamed_bytes_per_step_planned: report.plan.vram.streamed_bytes_per_step,
            disk_bytes_per_step_planned: report.plan.pins.disk_bytes_per_step,
            first_step_seconds: report.step_seconds.first().copied().unwrap_or(0.0),
            first_step_compute_seconds: report.compute_seconds.first().copied().unwrap_or(0.0),
            first_step_wait_seconds: (report.step_seconds.first().copied().unwrap_or(0.0)
                - report.compute_seconds.first().copied().unwrap_or(0.0))
            .max(0.0),
            steady_step_seconds: steady,
            steady_compute_seconds: report.steady_compute_seconds(),
            bound_seconds: bound,
            bound_limited_by: outcome.bound.limited_by(),
            compute_floor_seconds: outcome.bound.compute_seconds,
            roofline_memory_bytes_per_second: outcome
                .roofline
                .map_or(0.0, |roofline| roofline.memory_bytes_per_second),
            roofline_flops_per_second: outcome
                .roofline
                .map_or(0.0, |roofline| roofline.flops_per_second),
            compute_share_of_roofline: if report.steady_compute_seconds() > 0.0 {
                outcome.bound.compute_seconds / report.steady_compute_seconds()
            } else {
                0.0
            },
            efficiency: if steady > 0.0 { bound / steady } else { 0.0 },
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
            rss_limit_bytes: (accounted as f64 * RSS_SLACK) as u64 + RSS_MARGIN_BYTES,
            kv_bytes: report.kv_bytes,
            kv_growths_with_evictions: report
                .kv_growth
                .iter()
                .filter(|(_, _, blocks)| !blocks.is_empty())
                .count() as u64,
            kv_evicted_blocks: report
                .kv_growth
                .iter()
                .map(|(_, _, blocks)| blocks.len() as u64)
                .sum(),
            streamed_bytes_per_step_after_kv: outcome.streamed_bytes_per_step_after_kv,
            tokens: report.tokens.clone(),
        }
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        self.write_heading(&mut out);
        self.write_times(&mut out);
        self.write_traffic(&mut out);
        self.write_residency(&mut out);
        self.write_lora(&mut out);
        self.write_experts(&mut out);
        self.write_kv_cache(&mut out);
        self.write_memory(&mut out);
        out
    }

    /// How the steps were checked, as the heading says it.
    fn verification(&self, reference: &str) -> String {
        let landed = format!(
            "{} landed blocks ({}) checked against the file",
            self.landings_checked,
            bytes(self.landed_bytes_checked)
        );
        match self.verify {
            "off" => "not verified (verify = off)".to_string(),
            "weights" => format!("{landed} (verify = weights)"),
            "first" => format!(
                "{} verified against {reference}, then {landed} (verify = first)",
                self.verified_steps
            ),
            _ => format!("{} verified against {reference}", self.verified_steps),
        }
    }

    /// What ran where, how it was checked, and the budgets.
    fn write_heading(&self, out: &mut String) {
        let reference = if self.lora_adapters.is_empty() {
            "the fully-resident reference"
        } else {
            "the fully-merged LoRA reference"
        };
        if self.workload == "stream-verify" {
            line(out, format!(
                "stagehand run: stream-verify, {} on {} ({} reads): checked bytes only — every block's checksum on the device equals the file's in {} steps; nothing was computed",
                counted(self.steps, "step", "steps"),
                self.device,
                self.storage,
                self.verified_steps
            ));
        } else {
            line(
                out,
                format!(
                    "stagehand run: {}, {} on {} ({} reads), {}",
                    self.workload,
                    counted(self.steps, "step", "steps"),
                    self.device,
                    self.storage,
                    self.verification(reference)
                ),
            );
        }
        line(
            out,
            format!(
                "  model {}  vram budget {} ({} resident + streaming ring)  pin ceiling {}",
                bytes(self.model_bytes),
                bytes(self.vram_budget_bytes),
                bytes(self.resident_bytes),
                bytes(self.pin_ceiling_bytes)
            ),
        );
    }

    /// The step times against the physical bound.
    fn write_times(&self, out: &mut String) {
        line(
            out,
            format!(
                "  step time: first {} ({} compute, {} waiting for the cold reads)  steady {} (median)  compute {}",
                ms(self.first_step_seconds),
                ms(self.first_step_compute_seconds),
                ms(self.first_step_wait_seconds),
                ms(self.steady_step_seconds),
                ms(self.steady_compute_seconds)
            ),
        );
        let roofline = if self.roofline_flops_per_second > 0.0 {
            format!(
                "; roofline {} read, {:.1} GFLOP/s",
                rate(self.roofline_memory_bytes_per_second),
                self.roofline_flops_per_second / 1e9
            )
        } else {
            String::new()
        };
        line(out, format!(
            "  physical bound {} (limited by {}{roofline}; copy {}, reads {})  efficiency {:.2} (bound/actual){}",
            ms(self.bound_seconds),
            self.bound_limited_by,
            rate(self.copy_bytes_per_second),
            rate(self.read_bytes_per_second),
            self.efficiency,
            self.above_bound_reason()
        ));
        if self.roofline_flops_per_second > 0.0 {
            line(out, format!(
                "  compute at {:.0} % of the roofline (its floor under this step's kernels {}, measured compute {})",
                self.compute_share_of_roofline * 100.0,
                ms(self.compute_floor_seconds),
                ms(self.steady_compute_seconds)
            ));
        }
    }

    /// Why an efficiency above 1 is possible, said beside it: a step faster than its
    /// bound means the bound's figures were measured lower than this run reached.
    fn above_bound_reason(&self) -> &'static str {
        if self.efficiency <= 1.0 {
            return "";
        }
        match self.bound_limited_by {
            "copy to VRAM" | "disk reads" => {
                " — above 1: the link rate measured after the run was slower than the run's own transfers (the page cache served its reads, or the link was busy when measured)"
            }
            _ if self.roofline_flops_per_second > 0.0 => {
                " — above 1: the kernels ran faster than the cached roofline allows, so it was measured on a busier machine; the next run measures it again"
            }
            _ => " — above 1: the measured compute the bound uses was slower than this step's",
        }
    }

    /// The bytes a steady step moved, beside the plan's.
    fn write_traffic(&self, out: &mut String) {
        if self.fast_disk {
            line(out, format!(
                "  per steady step: pinned→vram {}  disk→vram {} (fast disk; plan {} to vram, {} from disk)",
                bytes(self.pinned_to_vram_bytes_per_step as u64),
                bytes(self.disk_to_vram_bytes_per_step as u64),
                bytes(self.streamed_bytes_per_step_planned),
                bytes(self.disk_bytes_per_step_planned)
            ));
        } else if self.expert_hits + self.expert_misses > 0 {
            // The plan covers the dense blocks in step order; experts load as the router
            // picks them, through the expert cache, and no plan predicts those bytes.
            line(out, format!(
                "  per steady step: pinned→vram {} (dense blocks planned {}, the rest experts as routed)  disk→pinned {} (dense blocks planned {})",
                bytes(self.pinned_to_vram_bytes_per_step as u64),
                bytes(self.streamed_bytes_per_step_planned),
                bytes(self.disk_to_pinned_bytes_per_step as u64),
                bytes(self.disk_bytes_per_step_planned)
            ));
        } else {
            line(
                out,
                format!(
                    "  per steady step: pinned→vram {} (plan {})  disk→pinned {} (plan {})",
                    bytes(self.pinned_to_vram_bytes_per_step as u64),
                    bytes(self.streamed_bytes_per_step_planned),
                    bytes(self.disk_to_pinned_bytes_per_step as u64),
                    bytes(self.disk_bytes_per_step_planned)
                ),
            );
        }
    }

    /// How often a block was ready when needed, the peaks and the read-ahead.
    fn write_residency(&self, out: &mut String) {
        let total = (self.hits + self.misses).max(1);
        line(
            out,
            format!(
                "  acquires: {}, {} ({:.1}% hit)  compute stalled {}",
                counted(self.hits, "hit", "hits"),
                counted(self.misses, "miss", "misses"),
                100.0 * self.hits as f64 / total as f64,
                ms(self.stall_seconds)
            ),
        );
        // The staging ring is pinned beside the ceiling, not inside it: say so, or a
        // peak above the ceiling reads as a broken budget.
        let pinned_limit = if self.staging_ring_bytes > 0 {
            format!(
                "{} + {} staging ring",
                bytes(self.pin_ceiling_bytes),
                bytes(self.staging_ring_bytes)
            )
        } else {
            bytes(self.pin_ceiling_bytes)
        };
        line(out, format!(
            "  peak vram {} of {}  peak pinned {} of {}  evictions {}  pin consolidations {}  speculative loads declined {}",
            bytes(self.peak_vram_bytes),
            bytes(self.vram_budget_bytes),
            bytes(self.peak_pinned_bytes),
            pinned_limit,
            self.vram_evictions,
            self.pin_consolidations,
            self.speculative_declined
        ));
        let read_ahead = self.read_ahead_used + self.read_ahead_dropped + self.read_ahead_failed;
        if read_ahead > 0 {
            line(out, format!(
                "  disk read-ahead: {} read while the ring was full: {} used, {} dropped, {} failed",
                counted(read_ahead, "block", "blocks"),
                self.read_ahead_used,
                self.read_ahead_dropped,
                self.read_ahead_failed
            ));
        }
    }

    /// The LoRA adapters, for a run with any.
    fn write_lora(&self, out: &mut String) {
        if !self.lora_adapters.is_empty() {
            let names: Vec<String> = self
                .lora_adapters
                .iter()
                .map(|adapter| format!("{}:{}", adapter.name, adapter.strength))
                .collect();
            line(out, format!(
                "  lora: {} ({} of factors, counted apart from the model; pinned {}, vram {} of pack slots, {}/step re-sent with streamed blocks)  {} steps low-rank within {:e} of the merged reference, the rest bit-exact",
                names.join(", "),
                bytes(self.lora_bytes),
                bytes(self.lora_pinned_bytes),
                bytes(self.peak_vram_lora_bytes),
                bytes(self.lora_bytes_to_vram_per_step as u64),
                self.lora_tolerance_steps,
                crate::families::lora_set::LORA_TOLERANCE
            ));
        }
    }

    /// The expert cache, for an MoE run.
    fn write_experts(&self, out: &mut String) {
        if self.expert_hits + self.expert_misses > 0 {
            line(out, format!(
                "  experts: {}, {} ({:.1}% hit)  {} hinted, {} of the misses hinted but late ({:.1}% foreseen)",
                counted(self.expert_hits, "hit", "hits"),
                counted(self.expert_misses, "miss", "misses"),
                100.0 * self.expert_hit_rate,
                self.expert_hints,
                self.expert_late,
                100.0 * self.expert_foreseen_rate
            ));
        }
    }

    /// The KV cache, for a decoder, and what its growth displaced.
    fn write_kv_cache(&self, out: &mut String) {
        if self.kv_bytes > 0 {
            let replan = if self.kv_evicted_blocks > 0 {
                format!(
                    "; growing it made {} resident blocks give way (by max-scatter priority, in {} growths): the plan now streams {} per step, was {}",
                    self.kv_evicted_blocks,
                    self.kv_growths_with_evictions,
                    bytes(self.streamed_bytes_per_step_after_kv),
                    bytes(self.streamed_bytes_per_step_planned)
                )
            } else {
                "; it grew without displacing weights".to_string()
            };
            line(
                out,
                format!(
                    "  KV cache: {} in VRAM for {} tokens (activations){replan}",
                    bytes(self.kv_bytes),
                    self.tokens.len()
                ),
            );
        }
    }

    /// Host memory: the embedding table, the peak RSS, what shutdown left held.
    fn write_memory(&self, out: &mut String) {
        if self.host_model_bytes > 0 {
            line(out, format!(
                "  host memory: {} of embedding table kept on the host (only gathered rows go to the device)",
                bytes(self.host_model_bytes)
            ));
        }
        if let Some(peak) = self.peak_rss_bytes {
            line(out, format!(
                "  peak RSS {} ({} the {} the budgets account for: (vram budget + peak pinned + host) × 1.1 + 64 MiB)",
                bytes(peak),
                if peak <= self.rss_limit_bytes { "within" } else { "ABOVE" },
                bytes(self.rss_limit_bytes)
            ));
        }
        line(
            out,
            format!(
                "  after shutdown: vram {} pinned {} held",
                bytes(self.vram_bytes_after_shutdown),
                bytes(self.pinned_bytes_after_shutdown)
            ),
        );
    }
}

fn line(out: &mut String, text: String) {
    out.push_str(&text);
    out.push('\n');
}

fn bytes(value: u64) -> String {
    Bytes(value).to_string()
}

fn rate(bytes_per_second: f64) -> String {
    format!("{:.2} GB/s", bytes_per_second / 1e9)
}

fn ms(seconds: f64) -> String {
    format!("{:.1} ms", seconds * 1e3)
}

/// "1 miss", "2 misses": a count with the right noun.
fn counted(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}
