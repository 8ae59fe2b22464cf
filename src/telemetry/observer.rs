//! The Prometheus adapter of the pipeline's [`Observer`] port.
//!
//! Every label combination is resolved to a handle once, at construction, so recording
//! an event is an index into an array and an atomic add: no key hashing, no registry
//! lookup, no allocation. The pipeline calls the observer per transfer, step or batch.

use metrics::{Counter, Gauge, Histogram, Key, Label, Metadata, Recorder};
use metrics_exporter_prometheus::PrometheusHandle;
use stagehand_actors::{
    AcquireBatch, ErrorKind, ExpertAcquires, Link, Observer, Owner, ReadAheadOutcome, Tier,
    TierUsage,
};

use super::catalog::{self, describe_all};
use super::server::MetricsServer;
use super::stage_series::{StageFigures, StageObserver, StageSeries};
use super::TelemetryError;

const TIER_COUNT: usize = Tier::ALL.len();
const LINK_COUNT: usize = Link::ALL.len();
const OWNERS: [Owner; 2] = [Owner::Model, Owner::Lora];
const OWNER_COUNT: usize = OWNERS.len();
const ERROR_COUNT: usize = ErrorKind::ALL.len();

/// The `owner` label values of a tier's usage, in the order of [`TierGauges::used_bytes`].
const USAGE_OWNERS: [&str; 3] = ["model", "lora", "other"];

fn link_index(link: Link) -> usize {
    match link {
        Link::DiskToPinned => 0,
        Link::PinnedToVram => 1,
        Link::DiskToVram => 2,
    }
}

fn tier_index(tier: Tier) -> usize {
    match tier {
        Tier::Vram => 0,
        Tier::Pinned => 1,
    }
}

fn owner_index(owner: Owner) -> usize {
    match owner {
        Owner::Model => 0,
        Owner::Lora => 1,
    }
}

fn error_index(kind: ErrorKind) -> usize {
    match kind {
        ErrorKind::Read => 0,
        ErrorKind::Copy => 1,
        ErrorKind::Pin => 2,
        ErrorKind::Budget => 3,
        ErrorKind::Protocol => 4,
    }
}

struct TierGauges {
    /// Model, LoRA, other — see [`USAGE_OWNERS`].
    used_bytes: [Gauge; 3],
    budget_bytes: Gauge,
    resident_blocks: Gauge,
    evicted_blocks: Counter,
}

/// Registers handles against one recorder; the metadata only names where they came from.
pub(super) struct Registrar<'a> {
    recorder: &'a dyn Recorder,
    /// A `model` label on every series (a server with several models), if any.
    model: Option<&'a str>,
}

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));

impl Registrar<'_> {
    fn key(&self, name: &'static str, labels: &[(&'static str, &'static str)]) -> Key {
        let mut labels: Vec<Label> = labels
            .iter()
            .map(|(key, value)| Label::from_static_parts(key, value))
            .collect();
        if let Some(model) = self.model {
            labels.push(Label::new("model", model.to_string()));
        }
        Key::from_parts(name, labels)
    }

    pub(super) fn counter(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> Counter {
        debug_assert!(catalog::find(name).is_some(), "{name} is not declared");
        self.recorder
            .register_counter(&self.key(name, labels), &METADATA)
    }

    pub(super) fn gauge(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> Gauge {
        debug_assert!(catalog::find(name).is_some(), "{name} is not declared");
        self.recorder
            .register_gauge(&self.key(name, labels), &METADATA)
    }

    pub(super) fn histogram(
        &self,
        name: &'static str,
        labels: &[(&'static str, &'static str)],
    ) -> Histogram {
        debug_assert!(catalog::find(name).is_some(), "{name} is not declared");
        self.recorder
            .register_histogram(&self.key(name, labels), &METADATA)
    }
}

/// Reports pipeline events as Prometheus metrics.
///
/// Build one with [`super::install`] (serves `/metrics`) or
/// [`PrometheusObserver::in_process`] (render the exposition yourself). Dropping the
/// last copy stops the HTTP listener and frees its port.
pub struct PrometheusObserver {
    /// Indexed `[link][owner]`.
    transferred_bytes: [[Counter; OWNER_COUNT]; LINK_COUNT],
    transfer_duration: [Histogram; LINK_COUNT],
    tiers: [TierGauges; TIER_COUNT],
    acquire_hits: Counter,
    acquire_misses: Counter,
    stall_seconds: Histogram,
    step_duration: Histogram,
    prefetch_lead: Gauge,
    speculative_declined: Counter,
    /// In [`ReadAheadOutcome::ALL`] order.
    read_ahead: [Counter; 3],
    pin_consolidations: Counter,
    pin_operations: Counter,
    plan_streamed: Gauge,
    activations_displaced: Counter,
    /// Hit, late, miss.
    expert_acquires: [Counter; 3],
    errors: [Counter; ERROR_COUNT],
    stages: StageSeries,
    handle: PrometheusHandle,
    /// Kept only so the listener lives exactly as long as the observer.
    _server: Option<MetricsServer>,
}

impl PrometheusObserver {
    /// Describes and pre-registers every metric of the catalog on `recorder`, so each one
    /// is exported (at zero) from the first scrape and recording needs no lookup.
    pub(super) fn register(
        recorder: &dyn Recorder,
        handle: PrometheusHandle,
        server: Option<MetricsServer>,
    ) -> Self {
        Self::register_labelled(recorder, handle, server, None)
    }

    /// As [`PrometheusObserver::register`], every series labelled `model="MODEL"`:
    /// one observer per model of a server, so one model's bytes never show in
    /// another's figures.
    pub(super) fn register_labelled(
        recorder: &dyn Recorder,
        handle: PrometheusHandle,
        server: Option<MetricsServer>,
        model: Option<&str>,
    ) -> Self {
        describe_all(recorder);
        let registrar = Registrar { recorder, model };
        let transferred_bytes = Link::ALL.map(|link| {
            OWNERS.map(|owner| {
                registrar.counter(
                    catalog::LINK_TRANSFERRED_BYTES,
                    &[
                        ("from", link.from_label()),
                        ("to", link.to_label()),
                        ("owner", owner.label()),
                    ],
                )
            })
        });
        let transfer_duration = Link::ALL.map(|link| {
            registrar.histogram(
                catalog::LINK_TRANSFER_DURATION,
                &[("from", link.from_label()), ("to", link.to_label())],
            )
        });
        let tiers = Tier::ALL.map(|tier| {
            let tier_label = [("tier", tier.label())];
            TierGauges {
                used_bytes: USAGE_OWNERS.map(|owner| {
                    registrar.gauge(
                        catalog::TIER_USED_BYTES,
                        &[("tier", tier.label()), ("owner", owner)],
                    )
                }),
                budget_bytes: registrar.gauge(catalog::TIER_BUDGET_BYTES, &tier_label),
                resident_blocks: registrar.gauge(catalog::TIER_RESIDENT_BLOCKS, &tier_label),
                evicted_blocks: registrar.counter(catalog::TIER_EVICTED_BLOCKS, &tier_label),
            }
        });
        let errors = ErrorKind::ALL
            .map(|kind| registrar.counter(catalog::ERRORS, &[("kind", kind.label())]));
        Self {
            transferred_bytes,
            transfer_duration,
            tiers,
            acquire_hits: registrar.counter(catalog::COMPUTE_ACQUIRE_HITS, &[]),
            acquire_misses: registrar.counter(catalog::COMPUTE_ACQUIRE_MISSES, &[]),
            stall_seconds: registrar.histogram(catalog::COMPUTE_STALL, &[]),
            step_duration: registrar.histogram(catalog::COMPUTE_STEP_DURATION, &[]),
            prefetch_lead: registrar.gauge(catalog::PREFETCH_LEAD_BLOCKS, &[]),
            speculative_declined: registrar.counter(catalog::PREFETCH_SPECULATIVE_DECLINED, &[]),
            read_ahead: ReadAheadOutcome::ALL.map(|outcome| {
                registrar.counter(
                    catalog::PREFETCH_READ_AHEAD,
                    &[("outcome", outcome.label())],
                )
            }),
            pin_consolidations: registrar.counter(catalog::PIN_CONSOLIDATIONS, &[]),
            pin_operations: registrar.counter(catalog::PIN_OPERATIONS, &[]),
            plan_streamed: registrar.gauge(catalog::PLAN_STEP_STREAMED_BYTES, &[]),
            activations_displaced: registrar.counter(catalog::ACTIVATION_DISPLACED_BLOCKS, &[]),
            expert_acquires: ["hit", "late", "miss"].map(|outcome| {
                registrar.counter(catalog::EXPERT_ACQUIRES, &[("outcome", outcome)])
            }),
            errors,
            stages: StageSeries::register(&registrar),
            handle,
            _server: server,
        }
    }

    /// An observer with its own recorder and no HTTP listener: for tests, and for
    /// callers that serve the text themselves. Independent of the process-global
    /// `metrics` recorder, so any number can coexist in one process.
    pub fn in_process() -> Result<Self, TelemetryError> {
        let recorder = super::server::builder()?.build_recorder();
        let handle = recorder.handle();
        Ok(Self::register(&recorder, handle, None))
    }

    /// The Prometheus text exposition of every metric, as a scrape would return it.
    pub fn render(&self) -> String {
        self.handle.render()
    }

    /// The address `/metrics` is served on, if this observer serves one.
    pub fn listen_addr(&self) -> Option<std::net::SocketAddr> {
        self._server.as_ref().map(MetricsServer::addr)
    }
}

impl Observer for PrometheusObserver {
    fn transfer(&self, link: Link, owner: Owner, bytes: u64, seconds: f64) {
        let link = link_index(link);
        self.transferred_bytes[link][owner_index(owner)].increment(bytes);
        self.transfer_duration[link].record(seconds);
    }

    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        let gauges = &self.tiers[tier_index(tier)];
        let [model, lora, other] = &gauges.used_bytes;
        model.set(usage.model_bytes as f64);
        lora.set(usage.lora_bytes as f64);
        other.set(usage.other_bytes as f64);
        gauges.budget_bytes.set(usage.budget_bytes as f64);
        gauges.resident_blocks.set(usage.blocks as f64);
    }

    fn eviction(&self, tier: Tier, blocks: u64) {
        self.tiers[tier_index(tier)]
            .evicted_blocks
            .increment(blocks);
    }

    fn pin_consolidation(&self, operations: u64) {
        self.pin_consolidations.increment(1);
        self.pin_operations.increment(operations);
    }

    fn speculative_declined(&self) {
        self.speculative_declined.increment(1);
    }

    fn read_ahead(&self, outcome: ReadAheadOutcome, blocks: u64) {
        self.read_ahead[outcome.index()].increment(blocks);
    }

    fn acquires(&self, batch: AcquireBatch) {
        self.acquire_hits.increment(batch.hits);
        self.acquire_misses.increment(batch.misses);
        self.stall_seconds.record(batch.stall_seconds);
    }

    fn prefetch_lead(&self, blocks_ahead: u64) {
        self.prefetch_lead.set(blocks_ahead as f64);
    }

    fn step(&self, seconds: f64) {
        self.step_duration.record(seconds);
    }

    fn error(&self, kind: ErrorKind) {
        self.errors[error_index(kind)].increment(1);
    }

    fn plan_streamed(&self, bytes_per_step: u64) {
        self.plan_streamed.set(bytes_per_step as f64);
    }

    fn activations_displaced(&self, blocks: u64) {
        self.activations_displaced.increment(blocks);
    }

    fn expert_acquires(&self, acquires: ExpertAcquires) {
        let [hit, late, miss] = &self.expert_acquires;
        hit.increment(acquires.hits);
        late.increment(acquires.late);
        miss.increment(acquires.misses);
    }
}

impl std::fmt::Debug for PrometheusObserver {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PrometheusObserver")
            .field("listen_addr", &self.listen_addr())
            .finish_non_exhaustive()
    }
}

impl StageObserver for PrometheusObserver {
    fn stage_done(&self, figures: &StageFigures) {
        self.stages.record(figures);
    }

    fn images_made(&self, count: u64) {
        self.stages.images(count);
    }
}
