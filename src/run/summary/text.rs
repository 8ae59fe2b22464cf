//! The run summary as text: what a user reads (on stderr) after `stagehand run`,
//! `embed`, `generate` or `sample`.

use stagehand_actors::Bytes;

use super::Summary;

impl Summary {
    /// The summary of a run of `command` (`run`, `embed`, …), which its heading names.
    pub fn render(&self, command: &str) -> String {
        let mut out = String::new();
        self.write_heading(&mut out, command);
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
        // The file's checksums an earlier run on the unchanged files kept are not read.
        let checksums = format!("{} file checksums read", self.checksums_read_from_files);
        match self.verify {
            "off" => "not verified (verify = off)".to_string(),
            "weights" => format!("{landed} (verify = weights, {checksums})"),
            "first" => format!(
                "{} verified against {reference}, then {landed} (verify = first, {checksums})",
                self.verified_steps
            ),
            _ => format!("{} verified against {reference}", self.verified_steps),
        }
    }

    /// What ran where, how it was checked, and the budgets.
    fn write_heading(&self, out: &mut String, command: &str) {
        let reference = if self.lora_adapters.is_empty() {
            "the fully-resident reference"
        } else {
            "the fully-merged LoRA reference"
        };
        if self.workload == "stream-verify" {
            line(out, format!(
                "stagehand {command}: stream-verify, {} on {} ({} reads): checked bytes only — every block's checksum on the device equals the file's in {} steps; nothing was computed",
                counted(self.steps, "step", "steps"),
                self.device,
                self.storage,
                self.verified_steps
            ));
        } else {
            line(
                out,
                format!(
                    "stagehand {command}: {}, {} on {}{} ({} reads), {}",
                    self.workload,
                    counted(self.steps, "step", "steps"),
                    self.device,
                    match self.compute_dtype {
                        "f32" => "",
                        _ => " with bf16 products",
                    },
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

    /// What the steady figures are taken from: `None` for a run of one (cold) step,
    /// which has none; the second step alone for two; the median of the rest for more.
    fn steady_of(&self) -> Option<String> {
        match self.steps.saturating_sub(1) {
            0 => None,
            1 => Some("the second step".to_string()),
            later => Some(format!("median of {later} steps")),
        }
    }

    /// The step times against the physical bound. A run of one step has no steady
    /// figure, so neither an efficiency nor a share of the roofline.
    fn write_times(&self, out: &mut String) {
        let first = format!(
            "first {} ({} compute, {} waiting for the cold reads)",
            ms(self.first_step_seconds),
            ms(self.first_step_compute_seconds),
            ms(self.first_step_wait_seconds),
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
        let bound = format!(
            "  physical bound {} (limited by {}{roofline}; copy {}, reads {})",
            ms(self.bound_seconds),
            self.bound_limited_by,
            rate(self.copy_bytes_per_second),
            rate(self.read_bytes_per_second),
        );
        let Some(steady_of) = self.steady_of() else {
            line(
                out,
                format!(
                    "  step time: one step, {first}; no steady figure (it needs two steps or more)"
                ),
            );
            line(out, bound);
            self.write_roofline_source(out);
            return;
        };
        line(
            out,
            format!(
                "  step time: {first}  steady {} ({steady_of})  compute {}",
                ms(self.steady_step_seconds),
                ms(self.steady_compute_seconds)
            ),
        );
        line(
            out,
            format!(
                "{bound}  efficiency {:.2} (bound/actual){}",
                self.efficiency,
                self.above_bound_reason()
            ),
        );
        self.write_roofline(out);
    }

    /// The compute against the roofline, and where the roofline came from. A step that
    /// beat it raised it (`roofline_raised_by`): the share is then 100 %, and a note
    /// says by how much the roofline was too low.
    fn write_roofline(&self, out: &mut String) {
        if self.roofline_flops_per_second <= 0.0 {
            return;
        }
        let raised = self.roofline_raised_by.map_or_else(String::new, |factor| {
            format!(
                " — this step computed {factor:.2}× faster than the roofline allowed, so it was measured too low: raised to what this step reached"
            )
        });
        line(out, format!(
            "  compute at {:.0} % of the roofline (its floor under this step's kernels {}, measured compute {}){raised}",
            self.compute_share_of_roofline.min(1.0) * 100.0,
            ms(self.compute_floor_seconds),
            ms(self.steady_compute_seconds)
        ));
        self.write_roofline_source(out);
    }

    /// Which measurement the roofline is, and when it was taken (and raised).
    fn write_roofline_source(&self, out: &mut String) {
        if self.roofline_source.is_empty() {
            return;
        }
        let copy = self.copy_rate_raised_by.map_or_else(String::new, |factor| {
            format!("; the steps copied {factor:.2}× faster than its copy rate, raised to theirs")
        });
        line(out, format!("  roofline {}{copy}", self.roofline_source));
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
            _ => " — above 1: the measured compute the bound uses was slower than this step's",
        }
    }

    /// The bytes a steady step moved, beside the plan's (a run of one step: that
    /// step's).
    fn write_traffic(&self, out: &mut String) {
        let per_step = if self.steps < 2 {
            "in its one step"
        } else {
            "per steady step"
        };
        if self.fast_disk {
            line(out, format!(
                "  {per_step}: pinned→vram {}  disk→vram {} (fast disk; plan {} to vram, {} from disk)",
                bytes(self.pinned_to_vram_bytes_per_step as u64),
                bytes(self.disk_to_vram_bytes_per_step as u64),
                bytes(self.streamed_bytes_per_step_planned),
                bytes(self.disk_bytes_per_step_planned)
            ));
        } else if self.expert_hits + self.expert_misses > 0 {
            // The plan covers the dense blocks in step order; experts load as the router
            // picks them, through the expert cache, and no plan predicts those bytes.
            line(out, format!(
                "  {per_step}: pinned→vram {} (dense blocks planned {}, the rest experts as routed)  disk→pinned {} (dense blocks planned {})",
                bytes(self.pinned_to_vram_bytes_per_step as u64),
                bytes(self.streamed_bytes_per_step_planned),
                bytes(self.disk_to_pinned_bytes_per_step as u64),
                bytes(self.disk_bytes_per_step_planned)
            ));
        } else {
            line(
                out,
                format!(
                    "  {per_step}: pinned→vram {} (plan {})  disk→pinned {} (plan {})",
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
                "  lora: {} ({} of factors, counted apart from the model; pinned {}, vram {} of pack slots, {}/step re-sent with the blocks that apply it low-rank)  {} steps low-rank within {:e} of the merged reference, the rest bit-exact",
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
                "  peak RSS {} ({} the {} the budgets account for: (vram budget + peak pinned + host) × 1.1 + 64 MiB{})",
                bytes(peak),
                if peak <= self.rss_limit_bytes { "within" } else { "ABOVE" },
                bytes(self.rss_limit_bytes),
                if self.roofline_measurement_rss_bytes > 0 {
                    format!(" + {} the roofline measurement held", bytes(self.roofline_measurement_rss_bytes))
                } else {
                    String::new()
                }
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
