//! A pipeline's stages as Prometheus series: registered for every stage at the
//! observer's construction (the label set is fixed), recorded once per stage.

use metrics::{Counter, Gauge, Histogram};
use stagehand_actors::{Link, Tier};

use super::pipeline_catalog::{
    PIPELINE_IMAGES, PIPELINE_STAGE_BUDGET_BYTES, PIPELINE_STAGE_DURATION,
    PIPELINE_STAGE_PEAK_BYTES, PIPELINE_STAGE_TRANSFERRED_BYTES, STAGES,
};

/// What one stage of a pipeline did: one model's run inside it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StageFigures {
    /// One of [`STAGES`].
    pub stage: &'static str,
    pub seconds: f64,
    /// Model bytes moved over each link, in [`Link::ALL`] order.
    pub transferred_bytes: [u64; 3],
    /// Peak and budget per tier, in [`Tier::ALL`] order (VRAM, pinned).
    pub peak_bytes: [u64; 2],
    pub budget_bytes: [u64; 2],
}

/// Told of each stage a pipeline ran and of the images it made.
pub trait StageObserver: Send + Sync {
    fn stage_done(&self, figures: &StageFigures);
    fn images_made(&self, count: u64);
}

struct StageHandles {
    duration: Histogram,
    transferred_bytes: [Counter; 3],
    peak_bytes: [Gauge; 2],
    budget_bytes: [Gauge; 2],
}

pub(super) struct StageSeries {
    /// In [`STAGES`] order.
    stages: [StageHandles; STAGES.len()],
    images: Counter,
}

impl StageSeries {
    pub(super) fn register(registrar: &super::observer::Registrar<'_>) -> Self {
        let stages = STAGES.map(|stage| StageHandles {
            duration: registrar.histogram(PIPELINE_STAGE_DURATION, &[("stage", stage)]),
            transferred_bytes: Link::ALL.map(|link| {
                registrar.counter(
                    PIPELINE_STAGE_TRANSFERRED_BYTES,
                    &[
                        ("stage", stage),
                        ("from", link.from_label()),
                        ("to", link.to_label()),
                    ],
                )
            }),
            peak_bytes: Tier::ALL.map(|tier| {
                registrar.gauge(
                    PIPELINE_STAGE_PEAK_BYTES,
                    &[("stage", stage), ("tier", tier.label())],
                )
            }),
            budget_bytes: Tier::ALL.map(|tier| {
                registrar.gauge(
                    PIPELINE_STAGE_BUDGET_BYTES,
                    &[("stage", stage), ("tier", tier.label())],
                )
            }),
        });
        Self {
            stages,
            images: registrar.counter(PIPELINE_IMAGES, &[]),
        }
    }

    pub(super) fn record(&self, figures: &StageFigures) {
        let Some(index) = STAGES.iter().position(|stage| *stage == figures.stage) else {
            tracing::warn!("pipeline stage `{}` has no series", figures.stage);
            return;
        };
        let handles = &self.stages[index];
        handles.duration.record(figures.seconds);
        for (counter, bytes) in handles
            .transferred_bytes
            .iter()
            .zip(figures.transferred_bytes)
        {
            counter.increment(bytes);
        }
        for (gauge, bytes) in handles.peak_bytes.iter().zip(figures.peak_bytes) {
            gauge.set(bytes as f64);
        }
        for (gauge, bytes) in handles.budget_bytes.iter().zip(figures.budget_bytes) {
            gauge.set(bytes as f64);
        }
    }

    pub(super) fn images(&self, count: u64) {
        self.images.increment(count);
    }
}
