//! Every metric stagehand exports, declared once: name, type, unit, labels, description
//! and histogram buckets. The observer, the exporter's bucket setup, `docs/metrics.md`
//! and the dashboard checks all read this table, so a metric cannot exist in one place
//! and be missing from another.
//!
//! Naming follows Prometheus and Vector's instrumentation spec:
//! `stagehand_<subsystem>_<name>_<unit>[_total]`, base units, counters end in `_total`,
//! and every label takes a small, fixed set of values (listed here).

use metrics::{KeyName, Recorder, SharedString, Unit};

use super::{pipeline_catalog, serving_catalog};

/// The Prometheus type of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

impl MetricKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// A label and every value it may take: the whole point of declaring them is that the
/// cardinality is known up front.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LabelSpec {
    pub name: &'static str,
    pub values: &'static [&'static str],
}

/// One exported metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MetricSpec {
    pub name: &'static str,
    pub kind: MetricKind,
    /// The unit as a word for people (`bytes`, `seconds`, `blocks`, ...).
    pub unit: &'static str,
    pub labels: &'static [LabelSpec],
    pub description: &'static str,
    /// Upper bounds of the histogram buckets; empty for counters and gauges.
    pub buckets: &'static [f64],
}

impl MetricSpec {
    /// The unit the `metrics` facade knows, where there is one.
    pub fn facade_unit(&self) -> Option<Unit> {
        match self.unit {
            "bytes" => Some(Unit::Bytes),
            "seconds" => Some(Unit::Seconds),
            _ => Some(Unit::Count),
        }
    }

    /// The series names this metric appears as in an exposition or a PromQL query.
    pub fn series_names(&self) -> Vec<String> {
        match self.kind {
            MetricKind::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|suffix| format!("{}{suffix}", self.name))
                .collect(),
            MetricKind::Counter | MetricKind::Gauge => vec![self.name.to_string()],
        }
    }
}

pub(super) const LINK_FROM: LabelSpec = LabelSpec {
    name: "from",
    values: &["disk", "pinned"],
};
pub(super) const LINK_TO: LabelSpec = LabelSpec {
    name: "to",
    values: &["pinned", "vram"],
};
pub(super) const TIER: LabelSpec = LabelSpec {
    name: "tier",
    values: &["vram", "pinned"],
};
const TRANSFER_OWNER: LabelSpec = LabelSpec {
    name: "owner",
    values: &["model", "lora"],
};
/// `other` is what the tier holds that is not weights: activations in VRAM, the staging
/// ring in pinned memory. Kept apart so model bytes never read more than the model size.
const USAGE_OWNER: LabelSpec = LabelSpec {
    name: "owner",
    values: &["model", "lora", "other"],
};
const READ_AHEAD_OUTCOME: LabelSpec = LabelSpec {
    name: "outcome",
    values: &["used", "dropped", "failed"],
};
const EXPERT_OUTCOME: LabelSpec = LabelSpec {
    name: "outcome",
    values: &["hit", "late", "miss"],
};
const ERROR_KIND: LabelSpec = LabelSpec {
    name: "kind",
    values: &["read", "copy", "pin", "budget", "protocol"],
};

/// From a 4 KiB page copy (~tens of µs) up to a slow multi-GiB disk read.
const TRANSFER_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// A tiny demo step takes milliseconds; a 70B model streamed over PCIe takes tens of seconds.
const STEP_BUCKETS_SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0,
];
/// The first bucket is exactly zero: it counts the batches that never waited.
const STALL_BUCKETS_SECONDS: &[f64] = &[
    0.0, 0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0,
];

pub const LINK_TRANSFERRED_BYTES: &str = "stagehand_link_transferred_bytes_total";
pub const LINK_TRANSFER_DURATION: &str = "stagehand_link_transfer_duration_seconds";
pub const TIER_USED_BYTES: &str = "stagehand_tier_used_bytes";
pub const TIER_BUDGET_BYTES: &str = "stagehand_tier_budget_bytes";
pub const TIER_RESIDENT_BLOCKS: &str = "stagehand_tier_resident_blocks";
pub const TIER_EVICTED_BLOCKS: &str = "stagehand_tier_evicted_blocks_total";
pub const COMPUTE_ACQUIRE_HITS: &str = "stagehand_compute_acquire_hits_total";
pub const COMPUTE_ACQUIRE_MISSES: &str = "stagehand_compute_acquire_misses_total";
pub const COMPUTE_STALL: &str = "stagehand_compute_stall_seconds";
pub const COMPUTE_STEP_DURATION: &str = "stagehand_compute_step_duration_seconds";
pub const PREFETCH_LEAD_BLOCKS: &str = "stagehand_prefetch_lead_blocks";
pub const PREFETCH_SPECULATIVE_DECLINED: &str = "stagehand_prefetch_speculative_declined_total";
pub const PREFETCH_READ_AHEAD: &str = "stagehand_prefetch_read_ahead_blocks_total";
pub const PIN_CONSOLIDATIONS: &str = "stagehand_pin_consolidations_total";
pub const PIN_OPERATIONS: &str = "stagehand_pin_operations_total";
pub const PLAN_STEP_STREAMED_BYTES: &str = "stagehand_plan_step_streamed_bytes";
pub const ACTIVATION_DISPLACED_BLOCKS: &str = "stagehand_activation_displaced_blocks_total";
pub const EXPERT_ACQUIRES: &str = "stagehand_expert_acquires_total";
pub const ERRORS: &str = "stagehand_errors_total";
pub use super::serving_catalog::{
    SERVE_ADAPTER_SWITCHES, SERVE_BATCH_SIZE, SERVE_IN_FLIGHT, SERVE_QUEUE_DEPTH, SERVE_REQUESTS,
    SERVE_REQUEST_DURATION, SERVE_RESIDENCY, SERVE_RESIDENCY_STATES, SERVE_TIME_TO_FIRST_TOKEN,
    SERVE_TOKENS,
};

/// Every metric stagehand exports.
pub const CATALOG: &[MetricSpec] = &[
    MetricSpec {
        name: LINK_TRANSFERRED_BYTES,
        kind: MetricKind::Counter,
        unit: "bytes",
        labels: &[LINK_FROM, LINK_TO, TRANSFER_OWNER],
        description: "Bytes moved over a link (disk to pinned, pinned to vram, disk to vram), by whose bytes they were.",
        buckets: &[],
    },
    MetricSpec {
        name: LINK_TRANSFER_DURATION,
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &[LINK_FROM, LINK_TO],
        description: "Time one transfer took on a link, from issue to completion; the sum is the link's busy time.",
        buckets: TRANSFER_BUCKETS_SECONDS,
    },
    MetricSpec {
        name: TIER_USED_BYTES,
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: &[TIER, USAGE_OWNER],
        description: "Bytes in use in a memory tier: model weights, LoRA adapters, and other (activations such as a decoder's KV cache in vram, the staging ring in pinned).",
        buckets: &[],
    },
    MetricSpec {
        name: TIER_BUDGET_BYTES,
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: &[TIER],
        description: "Hard budget of a memory tier; used bytes never exceed it.",
        buckets: &[],
    },
    MetricSpec {
        name: TIER_RESIDENT_BLOCKS,
        kind: MetricKind::Gauge,
        unit: "blocks",
        labels: &[TIER],
        description: "Blocks resident in a memory tier.",
        buckets: &[],
    },
    MetricSpec {
        name: TIER_EVICTED_BLOCKS,
        kind: MetricKind::Counter,
        unit: "blocks",
        labels: &[TIER],
        description: "Blocks evicted from a memory tier to make room.",
        buckets: &[],
    },
    MetricSpec {
        name: COMPUTE_ACQUIRE_HITS,
        kind: MetricKind::Counter,
        unit: "acquires",
        labels: &[],
        description: "Block acquires by the compute thread that found the block already resident in vram.",
        buckets: &[],
    },
    MetricSpec {
        name: COMPUTE_ACQUIRE_MISSES,
        kind: MetricKind::Counter,
        unit: "acquires",
        labels: &[],
        description: "Block acquires by the compute thread that had to wait for the block to arrive.",
        buckets: &[],
    },
    MetricSpec {
        name: COMPUTE_STALL,
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &[],
        description: "Time the compute thread waited for blocks, per reported batch; rate of the sum is the fraction of time stalled.",
        buckets: STALL_BUCKETS_SECONDS,
    },
    MetricSpec {
        name: COMPUTE_STEP_DURATION,
        kind: MetricKind::Histogram,
        unit: "seconds",
        labels: &[],
        description: "Wall time of one compute step over every block of the model.",
        buckets: STEP_BUCKETS_SECONDS,
    },
    MetricSpec {
        name: PREFETCH_LEAD_BLOCKS,
        kind: MetricKind::Gauge,
        unit: "blocks",
        labels: &[],
        description: "How many blocks ahead of the compute position the prefetcher has loaded.",
        buckets: &[],
    },
    MetricSpec {
        name: PREFETCH_SPECULATIVE_DECLINED,
        kind: MetricKind::Counter,
        unit: "loads",
        labels: &[],
        description: "Speculative loads declined because the budget was predicted to run out.",
        buckets: &[],
    },
    MetricSpec {
        name: PREFETCH_READ_AHEAD,
        kind: MetricKind::Counter,
        unit: "blocks",
        labels: &[READ_AHEAD_OUTCOME],
        description: "Blocks read from disk ahead of the VRAM ring into idle staging buffers, by outcome: used by a load, dropped unused, or failed (the load then reads the block itself).",
        buckets: &[],
    },
    MetricSpec {
        name: PIN_CONSOLIDATIONS,
        kind: MetricKind::Counter,
        unit: "consolidations",
        labels: &[],
        description: "Sync points at which the pin manager did its collected pin work at once, instead of stalling transfers mid-block.",
        buckets: &[],
    },
    MetricSpec {
        name: PIN_OPERATIONS,
        kind: MetricKind::Counter,
        unit: "operations",
        labels: &[],
        description: "Pinned-memory registrations and releases done at those sync points.",
        buckets: &[],
    },
    MetricSpec {
        name: PLAN_STEP_STREAMED_BYTES,
        kind: MetricKind::Gauge,
        unit: "bytes",
        labels: &[],
        description: "Bytes the current plan copies to vram per step (every block it does not keep resident); rises when resident blocks give way to activations or LoRA regions.",
        buckets: &[],
    },
    MetricSpec {
        name: ACTIVATION_DISPLACED_BLOCKS,
        kind: MetricKind::Counter,
        unit: "blocks",
        labels: &[],
        description: "Resident blocks that gave way to an activation reservation (a decoder's growing KV cache, counted in vram's other bytes); they stream every step from then on.",
        buckets: &[],
    },
    MetricSpec {
        name: EXPERT_ACQUIRES,
        kind: MetricKind::Counter,
        unit: "acquires",
        labels: &[EXPERT_OUTCOME],
        description: "MoE expert acquires by outcome: hit (resident when the router asked), late (a hint had asked for it, its load had not landed) or miss (not foreseen).",
        buckets: &[],
    },
    MetricSpec {
        name: ERRORS,
        kind: MetricKind::Counter,
        unit: "errors",
        labels: &[ERROR_KIND],
        description: "Errors by kind (read, copy, pin, budget, protocol).",
        buckets: &[],
    },
    serving_catalog::REQUESTS,
    serving_catalog::REQUEST_DURATION,
    serving_catalog::TIME_TO_FIRST_TOKEN,
    serving_catalog::QUEUE_DEPTH,
    serving_catalog::IN_FLIGHT,
    serving_catalog::BATCH_SIZE,
    serving_catalog::TOKENS,
    serving_catalog::ADAPTER_SWITCHES,
    serving_catalog::RESIDENCY,
    pipeline_catalog::STAGE_DURATION,
    pipeline_catalog::STAGE_TRANSFERRED_BYTES,
    pipeline_catalog::STAGE_PEAK_BYTES,
    pipeline_catalog::STAGE_BUDGET_BYTES,
    pipeline_catalog::IMAGES,
];

/// Looks a metric up by its declared name.
pub fn find(name: &str) -> Option<&'static MetricSpec> {
    CATALOG.iter().find(|spec| spec.name == name)
}

/// Looks up the metric a series name belongs to: histogram series `_bucket`, `_sum`
/// and `_count` map back to their base name.
pub fn find_series(series: &str) -> Option<&'static MetricSpec> {
    CATALOG.iter().find(|spec| {
        spec.series_names()
            .iter()
            .any(|series_name| series_name == series)
    })
}

/// Registers every metric's description and unit with `recorder`, so the exposition
/// carries a `# HELP` line for each.
pub fn describe_all(recorder: &dyn Recorder) {
    for spec in CATALOG {
        let name = KeyName::from_const_str(spec.name);
        let unit = spec.facade_unit();
        let description = SharedString::const_str(spec.description);
        match spec.kind {
            MetricKind::Counter => recorder.describe_counter(name, unit, description),
            MetricKind::Gauge => recorder.describe_gauge(name, unit, description),
            MetricKind::Histogram => recorder.describe_histogram(name, unit, description),
        }
    }
}

/// The metric reference as Markdown: what `docs/metrics.md` must contain.
pub fn markdown_table() -> String {
    let mut text = String::from(
        "# stagehand metrics\n\n\
         Generated from `src/telemetry/catalog.rs`; `cargo test --test metrics_catalog` fails \
         when this file is out of date and prints the expected text.\n\n\
         Serve them with `stagehand run --metrics-addr 127.0.0.1:9464` (or `metrics_addr` in the \
         settings) and import `dashboards/stagehand.json` into Grafana; `dashboards/rules.yml` \
         holds the recording rules and alerts. Under `stagehand serve` every series also \
         carries `model` (the served model's name): each model's tiers, links and steps \
         are its own.\n\n\
         | name | type | unit | labels | description |\n\
         |---|---|---|---|---|\n",
    );
    for spec in CATALOG {
        let labels = if spec.labels.is_empty() {
            "—".to_string()
        } else {
            spec.labels
                .iter()
                .map(|label| match label.values {
                    [] => format!("`{}` (the served models' names)", label.name),
                    values => format!("`{}` ({})", label.name, values.join(", ")),
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        text.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            spec.name,
            spec.kind.as_str(),
            spec.unit,
            labels,
            spec.description
        ));
    }
    text.push_str("\nHistogram buckets (upper bounds, in each metric's unit):\n\n");
    for spec in CATALOG.iter().filter(|spec| !spec.buckets.is_empty()) {
        let bounds = spec
            .buckets
            .iter()
            .map(|bound| bound.to_string())
            .collect::<Vec<_>>()
            .join(", ");
        text.push_str(&format!("- `{}`: {bounds}\n", spec.name));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_prometheus_conventions() {
        // Proves every declared name has the prefix, a base unit and the right counter suffix.
        for spec in CATALOG {
            assert!(spec.name.starts_with("stagehand_"), "{}", spec.name);
            let is_total = spec.name.ends_with("_total");
            assert_eq!(is_total, spec.kind == MetricKind::Counter, "{}", spec.name);
            if spec.unit == "bytes" || spec.unit == "seconds" {
                let stem = spec.name.trim_end_matches("_total");
                assert!(stem.ends_with(spec.unit), "{} lacks its unit", spec.name);
            }
            assert_eq!(
                spec.buckets.is_empty(),
                spec.kind != MetricKind::Histogram,
                "{}: buckets go with histograms only",
                spec.name
            );
            assert!(spec.buckets.windows(2).all(|pair| pair[0] < pair[1]));
        }
    }

    #[test]
    fn names_are_unique_and_series_map_back() {
        // Proves no metric is declared twice and histogram series resolve to their base name.
        for (index, spec) in CATALOG.iter().enumerate() {
            assert!(CATALOG[index + 1..]
                .iter()
                .all(|other| other.name != spec.name));
        }
        let spec = find_series("stagehand_compute_step_duration_seconds_bucket");
        assert_eq!(spec.map(|spec| spec.name), Some(COMPUTE_STEP_DURATION));
        assert!(find_series("stagehand_errors_total_sum").is_none());
    }
}
