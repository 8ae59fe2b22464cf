//! The catalog's entries for pipelines (listed in [`super::catalog::CATALOG`] with the
//! rest): each stage of a prompt-to-image or prompt-to-video job — one model's run —
//! by `stage`, with the `model` label of the served pipeline in `serve`.

use super::catalog::{LabelSpec, MetricKind, MetricSpec, LINK_FROM, LINK_TO, TIER};

/// A pipeline's stages, in the order they run: Flux's (clip, t5, vae-encoder,
/// transformer, vae) and Wan's (umt5, transformer, transformer_2 — Wan 2.2 A14B's
/// low-noise expert — vae).
pub const STAGES: [&str; 7] = [
    "clip",
    "t5",
    "umt5",
    "vae-encoder",
    "transformer",
    "transformer_2",
    "vae",
];

const STAGE: LabelSpec = LabelSpec {
    name: "stage",
    values: &STAGES,
};
/// A text encoder of a tiny pipeline takes milliseconds; T5-XXL streamed, or a
/// 12-billion-parameter transformer's 28 steps, takes minutes.
const STAGE_BUCKETS_SECONDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0, 300.0, 600.0, 1800.0,
];

pub const PIPELINE_STAGE_DURATION: &str = "stagehand_pipeline_stage_duration_seconds";
pub const PIPELINE_STAGE_TRANSFERRED_BYTES: &str =
    "stagehand_pipeline_stage_transferred_bytes_total";
pub const PIPELINE_STAGE_PEAK_BYTES: &str = "stagehand_pipeline_stage_peak_bytes";
pub const PIPELINE_STAGE_BUDGET_BYTES: &str = "stagehand_pipeline_stage_budget_bytes";
pub const PIPELINE_IMAGES: &str = "stagehand_pipeline_images_total";

pub(super) const STAGE_DURATION: MetricSpec = MetricSpec {
    name: PIPELINE_STAGE_DURATION,
    kind: MetricKind::Histogram,
    unit: "seconds",
    labels: &[STAGE],
    description: "A pipeline's stage from its model's open to its last byte given back (clip, t5, umt5, vae-encoder, transformer, transformer_2, vae).",
    buckets: STAGE_BUCKETS_SECONDS,
};

pub(super) const STAGE_TRANSFERRED_BYTES: MetricSpec = MetricSpec {
    name: PIPELINE_STAGE_TRANSFERRED_BYTES,
    kind: MetricKind::Counter,
    unit: "bytes",
    labels: &[STAGE, LINK_FROM, LINK_TO],
    description: "Model bytes a pipeline's stage moved over each link (disk to pinned, pinned to VRAM, disk to VRAM).",
    buckets: &[],
};

pub(super) const STAGE_PEAK_BYTES: MetricSpec = MetricSpec {
    name: PIPELINE_STAGE_PEAK_BYTES,
    kind: MetricKind::Gauge,
    unit: "bytes",
    labels: &[STAGE, TIER],
    description:
        "The peak a pipeline's stage held in each tier in its last run (weights and activations).",
    buckets: &[],
};

pub(super) const STAGE_BUDGET_BYTES: MetricSpec = MetricSpec {
    name: PIPELINE_STAGE_BUDGET_BYTES,
    kind: MetricKind::Gauge,
    unit: "bytes",
    labels: &[STAGE, TIER],
    description: "The budget a pipeline's stage ran under in each tier in its last run (its share of the pipeline's).",
    buckets: &[],
};

pub(super) const IMAGES: MetricSpec = MetricSpec {
    name: PIPELINE_IMAGES,
    kind: MetricKind::Counter,
    unit: "images",
    labels: &[],
    description: "Images a pipeline made (every stage run and decoded).",
    buckets: &[],
};
