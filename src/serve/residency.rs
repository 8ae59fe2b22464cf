//! What a router in front of several servers needs to know (issue 42, item 3): per
//! model, whether its weights are resident, streamed or cold, how many requests wait
//! for it, and what share of the server's VRAM and pinned memory it holds.
//!
//! Each model's [`ResidencyProbe`] sits beside its Prometheus observer (a `Tee`): the
//! session's actors tell it their tier usage and plan as they tell the metrics, and
//! `GET /residency` and `/metrics` read a [`ModelResidency`] snapshot of it. The probe
//! is a few atomics written on a change of plan or occupancy, never per block, so the
//! hot path is what it was.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use stagehand_actors::{Observer, Tier, TierUsage};

use super::state::{AppState, ServedModel};

/// Where a model's weights are, as a router ranks replicas for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelState {
    /// The plan keeps every weight block in VRAM: a request moves no weight.
    Resident,
    /// Some blocks stay in VRAM, the rest stream in every step (from pinned memory
    /// or disk): the model runs, more slowly than where it is resident.
    Streamed,
    /// No weight block stays in VRAM (it gave its budget to the others, or its budget
    /// holds only the ring): every step streams the whole model.
    Cold,
}

impl ModelState {
    /// Every state, in the order of the `state` label's values.
    pub const ALL: [ModelState; 3] = [ModelState::Resident, ModelState::Streamed, ModelState::Cold];

    /// The `state` label value and the JSON spelling.
    pub fn label(self) -> &'static str {
        match self {
            ModelState::Resident => "resident",
            ModelState::Streamed => "streamed",
            ModelState::Cold => "cold",
        }
    }

    /// The state of a model of `model_bytes` whose plan copies
    /// `streamed_bytes_per_step` to VRAM each step.
    pub fn classify(model_bytes: u64, streamed_bytes_per_step: u64) -> ModelState {
        if streamed_bytes_per_step == 0 {
            ModelState::Resident
        } else if streamed_bytes_per_step >= model_bytes {
            ModelState::Cold
        } else {
            ModelState::Streamed
        }
    }
}

/// One tier's figures as the session last reported them.
#[derive(Debug, Default)]
struct TierFigures {
    used_bytes: AtomicU64,
    budget_bytes: AtomicU64,
}

impl TierFigures {
    fn set(&self, usage: TierUsage) {
        self.used_bytes.store(usage.used_bytes(), Ordering::Relaxed);
        self.budget_bytes
            .store(usage.budget_bytes, Ordering::Relaxed);
    }
}

/// A model's plan and occupancy, as its session reports them, and when it was last
/// asked for. Written by the session's actors and the handlers, read by
/// `/residency` and `/metrics`.
#[derive(Debug)]
pub struct ResidencyProbe {
    /// The bytes the session streams (the layout's), for [`ModelState::classify`].
    model_bytes: AtomicU64,
    streamed_bytes_per_step: AtomicU64,
    vram: TierFigures,
    pinned: TierFigures,
    /// Milliseconds since the epoch of the last request admitted; 0: none yet.
    last_request_ms: AtomicU64,
}

impl ResidencyProbe {
    /// A probe for a model not yet opened: until its session reports a plan it
    /// counts as cold (nothing placed yet).
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            model_bytes: AtomicU64::new(0),
            streamed_bytes_per_step: AtomicU64::new(u64::MAX),
            vram: TierFigures::default(),
            pinned: TierFigures::default(),
            last_request_ms: AtomicU64::new(0),
        })
    }

    /// The session's streamed size, once it is known (after the model opened).
    pub fn set_model_bytes(&self, model_bytes: u64) {
        self.model_bytes.store(model_bytes, Ordering::Relaxed);
    }

    /// A request for the model was admitted now.
    pub fn requested(&self) {
        self.last_request_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn state(&self) -> ModelState {
        ModelState::classify(
            self.model_bytes.load(Ordering::Relaxed),
            self.streamed_bytes_per_step.load(Ordering::Relaxed),
        )
    }
}

impl Observer for ResidencyProbe {
    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        match tier {
            Tier::Vram => self.vram.set(usage),
            Tier::Pinned => self.pinned.set(usage),
        }
    }

    fn plan_streamed(&self, bytes_per_step: u64) {
        self.streamed_bytes_per_step
            .store(bytes_per_step, Ordering::Relaxed);
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// One model of `GET /residency`.
#[derive(Debug, Clone, Serialize)]
pub struct ModelResidency {
    pub id: String,
    /// `encoder`, `decoder`, `image` or `video`.
    pub kind: &'static str,
    pub state: ModelState,
    /// Requests waiting in its bounded queue now, and the bound (429 past it).
    pub queue_depth: usize,
    pub queue_capacity: usize,
    /// Requests admitted and not yet answered (queued or computing).
    pub in_flight: usize,
    pub model_bytes: u64,
    pub streamed_bytes_per_step: u64,
    /// VRAM it holds (weights, LoRA, activations) and its budget (its own, or its
    /// lease of a shared `[budget]`).
    pub vram_bytes: u64,
    pub vram_budget_bytes: u64,
    pub pinned_bytes: u64,
    pub pinned_budget_bytes: u64,
    /// Its bytes over the server's whole VRAM (pinned) budget, 0 to 1.
    pub vram_share: f64,
    pub pinned_share: f64,
    /// Seconds since its last request was admitted; `null` before the first.
    pub idle_seconds: Option<f64>,
}

/// The body of `GET /residency`.
#[derive(Debug, Clone, Serialize)]
pub struct ResidencyReport {
    pub object: &'static str,
    /// True after SIGTERM: a router sends this server nothing new.
    pub draining: bool,
    /// The server's whole budgets: the shared `[budget]`, or the models' own added.
    pub vram_budget_bytes: u64,
    pub pinned_budget_bytes: u64,
    pub models: Vec<ModelResidency>,
}

/// A served model's snapshot, its shares not yet known.
fn snapshot(model: &ServedModel) -> ModelResidency {
    let probe = &model.residency;
    let last = probe.last_request_ms.load(Ordering::Relaxed);
    let kind = if model.images.is_some() {
        "image"
    } else if model.videos.is_some() {
        "video"
    } else if model.serves_embeddings() {
        "encoder"
    } else {
        "decoder"
    };
    ModelResidency {
        id: model.name.clone(),
        kind,
        state: probe.state(),
        queue_depth: model.queued(),
        queue_capacity: model.queue_depth,
        in_flight: model.in_flight.load(Ordering::SeqCst),
        model_bytes: probe.model_bytes.load(Ordering::Relaxed),
        streamed_bytes_per_step: probe.streamed_bytes_per_step.load(Ordering::Relaxed),
        vram_bytes: probe.vram.used_bytes.load(Ordering::Relaxed),
        vram_budget_bytes: probe.vram.budget_bytes.load(Ordering::Relaxed),
        pinned_bytes: probe.pinned.used_bytes.load(Ordering::Relaxed),
        pinned_budget_bytes: probe.pinned.budget_bytes.load(Ordering::Relaxed),
        vram_share: 0.0,
        pinned_share: 0.0,
        idle_seconds: (last > 0).then(|| now_ms().saturating_sub(last) as f64 / 1000.0),
    }
}

fn share(bytes: u64, of: u64) -> f64 {
    if of == 0 {
        return 0.0;
    }
    (bytes as f64 / of as f64).min(1.0)
}

/// Every served model's snapshot, with the server's budgets; the serve series of
/// `/metrics` (queue depth, state) are refreshed from the same figures.
pub fn report(app: &AppState) -> ResidencyReport {
    let served = app.served();
    let mut models: Vec<ModelResidency> = served.iter().map(|model| snapshot(model)).collect();
    let (vram_total, pinned_total) = match app.loader.shared.as_ref().map(|pool| pool.total()) {
        Some(lease) => (lease.vram_bytes, lease.pin_bytes),
        None => models.iter().fold((0, 0), |(vram, pinned), model| {
            (
                vram + model.vram_budget_bytes,
                pinned + model.pinned_budget_bytes,
            )
        }),
    };
    for (model, served) in models.iter_mut().zip(&served) {
        model.vram_share = share(model.vram_bytes, vram_total);
        model.pinned_share = share(model.pinned_bytes, pinned_total);
        served.series.queue_depth.set(model.queue_depth as f64);
        served.series.set_state(model.state.label());
    }
    ResidencyReport {
        object: "residency",
        draining: app.draining.load(Ordering::SeqCst),
        vram_budget_bytes: vram_total,
        pinned_budget_bytes: pinned_total,
        models,
    }
}

/// `GET /residency`: open like `/metrics` (it says nothing `/metrics` does not), so a
/// router or probe needs no API key.
pub(super) async fn residency(State(app): State<Arc<AppState>>) -> Response {
    Json(report(&app)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_that_streams_nothing_is_resident_everything_cold_else_streamed() {
        // Proves the three states follow from the plan's streamed bytes alone.
        assert_eq!(ModelState::classify(1000, 0), ModelState::Resident);
        assert_eq!(ModelState::classify(1000, 1), ModelState::Streamed);
        assert_eq!(ModelState::classify(1000, 999), ModelState::Streamed);
        assert_eq!(ModelState::classify(1000, 1000), ModelState::Cold);
        assert_eq!(ModelState::classify(0, 0), ModelState::Resident);
    }

    #[test]
    fn the_probe_follows_the_sessions_reports() {
        // Proves a probe starts cold, turns resident on a plan that streams nothing,
        // and keeps each tier's last usage and budget.
        let probe = ResidencyProbe::new();
        assert_eq!(probe.state(), ModelState::Cold);
        probe.set_model_bytes(4096);
        assert_eq!(probe.state(), ModelState::Cold);
        probe.plan_streamed(1024);
        assert_eq!(probe.state(), ModelState::Streamed);
        probe.plan_streamed(0);
        assert_eq!(probe.state(), ModelState::Resident);
        let usage = TierUsage {
            model_bytes: 3000,
            lora_bytes: 10,
            other_bytes: 90,
            budget_bytes: 8192,
            blocks: 3,
        };
        probe.tier_usage(Tier::Vram, usage);
        assert_eq!(probe.vram.used_bytes.load(Ordering::Relaxed), 3100);
        assert_eq!(probe.vram.budget_bytes.load(Ordering::Relaxed), 8192);
        assert_eq!(probe.pinned.used_bytes.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_share_is_a_fraction_of_a_known_total() {
        // Proves an unknown (zero) total gives 0, never a division by zero.
        assert_eq!(share(5, 0), 0.0);
        assert_eq!(share(1, 4), 0.25);
        assert_eq!(share(9, 4), 1.0);
    }
}
