//! `stagehand validate`: one configuration both simulated on a hardware profile and
//! really run on this machine's backend, through the same budgets, so the prediction
//! and the measurement are about the same work.
//!
//! The real run is `stagehand run`'s path (`run::prepare_with`, `run::execute`); the
//! simulation is `sim::run_policy` of the description `simulate --model` makes of the
//! same file, with the budgets the real run resolved. Bytes per link per step are
//! counted from the real session's observer at each step's end, as the simulator
//! counts them from its session's stats.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use stagehand_actors::{BlockId, Link, Observer, ResidencyPolicy};

use crate::run::{Budgets, Extras, Prepared, RunPlan, WorkloadKind};
use crate::settings::Settings;
use crate::sim::{
    run_policy, steady_window, FaultPlan, FitSettings, HardwareProfile, LinkBytes,
    ModelDescription, Policy, PolicyRun, ReadPath, RunOptions,
};

/// Which model a case runs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CaseModel {
    /// The generated linear-stack demo model at `path`.
    LinearStack { path: PathBuf },
    /// A generated Llama-family decoder folder: `batch` is ignored, one token a step.
    Decoder { path: PathBuf },
    /// A BERT encoder folder: each step embeds `batch` of the built-in sentences.
    Encoder { path: PathBuf },
}

impl CaseModel {
    pub fn path(&self) -> &Path {
        match self {
            CaseModel::LinearStack { path }
            | CaseModel::Decoder { path }
            | CaseModel::Encoder { path } => path,
        }
    }

    pub fn label(&self) -> &'static str {
        match self {
            CaseModel::LinearStack { .. } => "linear-stack",
            CaseModel::Decoder { .. } => "llama",
            CaseModel::Encoder { .. } => "bert",
        }
    }
}

/// One configuration of the matrix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Case {
    pub model: CaseModel,
    pub batch: usize,
    /// The VRAM budget as a share of the streamed model (raised to what the plan
    /// needs at this depth, as `stagehand run` raises it).
    pub vram_share: f64,
    pub prefetch_depth: u32,
    pub fast_disk: bool,
    pub steps: u64,
    /// Real runs of the configuration (at least 1): the measured times are the
    /// median over them, and their spread says how repeatable the machine is.
    pub repeats: u32,
    /// Really run on the CUDA backend instead of the CPU one.
    pub cuda: bool,
}

/// One figure, predicted and measured.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Figure {
    pub predicted: f64,
    pub measured: f64,
    /// (predicted − measured) / measured; 0 when both are 0.
    pub error: f64,
}

impl Figure {
    pub fn new(predicted: f64, measured: f64) -> Self {
        let error = if measured == 0.0 {
            if predicted == 0.0 {
                0.0
            } else {
                f64::INFINITY
            }
        } else {
            (predicted - measured) / measured
        };
        Self {
            predicted,
            measured,
            error,
        }
    }
}

/// Targets of the issue: steady within ±10 %, cold within ±25 %, bytes and peaks exact.
pub const STEADY_TOLERANCE: f64 = 0.10;
pub const COLD_TOLERANCE: f64 = 0.25;

/// The measured figure of each repeat, and how far apart they lie.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Repeats {
    pub seconds: Vec<f64>,
    /// (slowest − fastest) / median.
    pub spread: f64,
}

impl Repeats {
    fn new(seconds: Vec<f64>) -> Self {
        let (low, high) = seconds
            .iter()
            .fold((f64::INFINITY, 0.0f64), |(low, high), &value| {
                (low.min(value), high.max(value))
            });
        let middle = median(&seconds);
        let spread = if middle > 0.0 {
            (high - low) / middle
        } else {
            0.0
        };
        Self { seconds, spread }
    }

    /// A prediction that misses the median by more than `tolerance` is still
    /// explained by the machine when identical runs themselves spread over more
    /// than twice the tolerance and the prediction lies within their range widened
    /// by the tolerance.
    fn explains(&self, predicted: f64, tolerance: f64) -> bool {
        let low = self.seconds.iter().copied().fold(f64::INFINITY, f64::min);
        let high = self.seconds.iter().copied().fold(0.0, f64::max);
        self.spread > 2.0 * tolerance
            && predicted >= low * (1.0 - tolerance)
            && predicted <= high * (1.0 + tolerance)
    }
}

/// One row of the table: a case's predictions against its measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub case: Case,
    pub vram_budget_bytes: u64,
    pub pin_ceiling_bytes: u64,
    /// Predicted against the median of the repeats.
    pub steady_step_seconds: Figure,
    pub cold_step_seconds: Figure,
    /// Each repeat's steady (median) and cold step.
    pub steady_repeats: Repeats,
    pub cold_repeats: Repeats,
    /// Mean bytes per steady step over each link (the same steps on both sides).
    pub disk_to_pinned_bytes: Figure,
    pub pinned_to_vram_bytes: Figure,
    pub disk_to_vram_bytes: Figure,
    /// The plan's streamed and disk bytes per step (both sessions plan the same).
    pub plan_streamed_bytes: Figure,
    pub plan_disk_bytes: Figure,
    pub peak_vram_bytes: Figure,
    pub peak_pinned_bytes: Figure,
    /// Every step of the real run matched its fully-resident reference.
    pub verified: bool,
    pub verdict: Verdict,
    /// The link rates the prediction used (the profile's) and the ones the real run
    /// measured on its own blocks right after its steps.
    pub link_rates: RowRates,
    /// The same simulation with the run's own link rates in place of the profile's:
    /// how much of a time miss is the simulator's model and how much is the machine's
    /// links drifting between the calibration and the row (on this VM the O_DIRECT
    /// rate moved 1.08–1.74 GB/s between calibrations minutes apart).
    pub steady_at_run_rates: Figure,
    pub cold_at_run_rates: Figure,
    pub verdict_at_run_rates: Verdict,
}

/// Copy (pinned → device) and read rates, GB/s.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RowRates {
    pub profile_copy_gb_per_s: f64,
    pub profile_read_gb_per_s: f64,
    pub run_copy_gb_per_s: f64,
    /// 0 when the run read nothing from disk after its first step (the profile's
    /// rate is kept then).
    pub run_read_gb_per_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Steady within ±10 %, cold within ±25 %, plan bytes and peaks exact.
    Pass,
    /// Bytes and peaks exact, a time outside its tolerance.
    TimeMiss,
    /// Bytes and peaks exact, a time outside its tolerance, but identical runs of
    /// the configuration spread over more than twice the tolerance and the
    /// prediction lies within their range: the machine, not the model, misses.
    Unrepeatable,
    /// A plan figure or a peak differs: the simulator models another plan.
    PlanMiss,
}

impl Row {
    fn judge(&mut self) {
        self.verdict = self.verdict_of(self.steady_step_seconds, self.cold_step_seconds);
        self.verdict_at_run_rates =
            self.verdict_of(self.steady_at_run_rates, self.cold_at_run_rates);
    }

    fn verdict_of(&self, steady: Figure, cold: Figure) -> Verdict {
        let exact = [
            self.plan_streamed_bytes,
            self.plan_disk_bytes,
            self.peak_vram_bytes,
            self.peak_pinned_bytes,
        ]
        .iter()
        .all(|figure| figure.error == 0.0);
        let judged = |figure: Figure, repeats: &Repeats, tolerance: f64| {
            if figure.error.abs() <= tolerance {
                Verdict::Pass
            } else if repeats.explains(figure.predicted, tolerance) {
                Verdict::Unrepeatable
            } else {
                Verdict::TimeMiss
            }
        };
        if !exact {
            return Verdict::PlanMiss;
        }
        match (
            judged(steady, &self.steady_repeats, STEADY_TOLERANCE),
            judged(cold, &self.cold_repeats, COLD_TOLERANCE),
        ) {
            (Verdict::TimeMiss, _) | (_, Verdict::TimeMiss) => Verdict::TimeMiss,
            (Verdict::Unrepeatable, _) | (_, Verdict::Unrepeatable) => Verdict::Unrepeatable,
            _ => Verdict::Pass,
        }
    }
}

/// Model bytes over each link so far, counted from the session's observer.
#[derive(Default)]
struct LinkCounter {
    bytes: [AtomicU64; 3],
}

impl LinkCounter {
    fn snapshot(&self) -> LinkBytes {
        let read = |index: usize| self.bytes[index].load(Ordering::Relaxed);
        LinkBytes {
            disk_to_pinned: read(0),
            pinned_to_vram: read(1),
            disk_to_vram: read(2),
        }
    }
}

impl Observer for LinkCounter {
    fn block_transfer(&self, link: Link, _block: BlockId, bytes: u64, _seconds: f64) {
        let index = match link {
            Link::DiskToPinned => 0,
            Link::PinnedToVram => 1,
            Link::DiskToVram => 2,
        };
        self.bytes[index].fetch_add(bytes, Ordering::Relaxed);
    }
}

/// What one real run measured.
struct Measured {
    step_seconds: Vec<f64>,
    /// Link counters at the start and at each step's end.
    boundaries: Vec<LinkBytes>,
    plan_streamed_bytes: u64,
    plan_disk_bytes: u64,
    peak_vram_bytes: u64,
    peak_pinned_bytes: u64,
    verified: bool,
    budgets: Budgets,
    rates: crate::workload::bound::LinkRates,
}

/// Why a case could not be validated.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error("{case}: {reason}")]
    Case { case: String, reason: String },
}

fn describe(case: &Case) -> String {
    format!(
        "{} batch {} vram {:.0} % depth {}{}",
        case.model.label(),
        case.batch,
        case.vram_share * 100.0,
        case.prefetch_depth,
        if case.fast_disk { " fast-disk" } else { "" }
    )
}

fn settings_of(case: &Case) -> Settings {
    Settings {
        prefetch_depth: case.prefetch_depth,
        fast_disk: case.fast_disk,
        ..Settings::default()
    }
}

fn prepare(case: &Case, settings: &Settings) -> Result<Prepared, String> {
    let (kind, is_demo) = match case.model {
        CaseModel::LinearStack { .. } => (WorkloadKind::LinearStack, true),
        CaseModel::Decoder { .. } => (WorkloadKind::Decoder, false),
        CaseModel::Encoder { .. } => (WorkloadKind::Encoder, false),
    };
    crate::run::prepare_with(
        case.model.path(),
        kind,
        case.batch,
        settings,
        is_demo,
        &Extras::default(),
    )
    .map_err(|error| error.to_string())
}

/// The budgets of the case: its share of the model, at least what the plan needs,
/// and the pin ceiling `stagehand run` gives (a demo model keeps room to cache).
fn budgets_of(case: &Case, prepared: &Prepared, settings: &mut Settings) -> Budgets {
    let model_bytes = prepared.streamed_model_bytes();
    let (minimum, _) = prepared.plan_minimum_bytes(case.prefetch_depth, ResidencyPolicy::Planned);
    let wanted = (model_bytes as f64 * case.vram_share) as u64;
    let budget = wanted.max(minimum + prepared.activation_bytes(case.steps));
    settings.vram_budget = Some(bytesize::ByteSize(budget));
    let budgets = crate::run::resolve_budgets(settings, model_bytes, prepared.is_demo);
    crate::run::demo_pins::demo_pin_room(prepared, settings, budgets)
}

fn run_real(
    case: &Case,
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
) -> Result<Measured, String> {
    let counter = Arc::new(LinkCounter::default());
    let boundaries = Arc::new(Mutex::new(vec![LinkBytes::default()]));
    let on_step = {
        let counter = Arc::clone(&counter);
        let boundaries = Arc::clone(&boundaries);
        Box::new(move |_step: u64, _seconds: f64| {
            if let Ok(mut boundaries) = boundaries.lock() {
                boundaries.push(counter.snapshot());
            }
        })
    };
    let plan = RunPlan {
        settings,
        budgets,
        prefetch_depth: case.prefetch_depth,
        policy: ResidencyPolicy::Planned,
        steps: case.steps,
        stop: Arc::new(AtomicBool::new(false)),
        observer: Arc::clone(&counter) as Arc<dyn Observer>,
        on_step,
        fail_after_reads: None,
        keep_outputs: false,
        on_token: None,
    };
    let outcome = if case.cuda {
        crate::run::execute_cuda(prepared, plan)
    } else {
        crate::run::execute(prepared, plan)
    }
    .map_err(|error| error.to_string())?;
    let report = &outcome.report;
    let boundaries = boundaries
        .lock()
        .map(|boundaries| boundaries.clone())
        .unwrap_or_default();
    Ok(Measured {
        step_seconds: report.step_seconds.clone(),
        boundaries,
        plan_streamed_bytes: report.plan.vram.streamed_bytes_per_step,
        plan_disk_bytes: report.plan.pins.disk_bytes_per_step,
        peak_vram_bytes: report.stats.vram.peak_used_bytes,
        peak_pinned_bytes: report.stats.pinned.peak_used_bytes,
        verified: report.verified_steps == report.steps,
        budgets: outcome.budgets,
        rates: outcome.rates,
    })
}

/// The description `simulate --model` makes of the case's model.
pub fn description_of(case: &Case, prepared: &Prepared) -> Result<ModelDescription, String> {
    match case.model {
        CaseModel::LinearStack { .. } => {
            ModelDescription::from_model_index(&prepared.index, case.batch as u64, None)
        }
        CaseModel::Decoder { .. } | CaseModel::Encoder { .. } => {
            ModelDescription::from_prepared(prepared, 1)
        }
    }
    .map_err(|error| error.to_string())
}

/// Where the case's reads come from on this machine: O_DIRECT with `--fast-disk`,
/// else the page cache (the run's reference pass has just read the whole file).
pub fn read_path(case: &Case) -> ReadPath {
    if case.fast_disk {
        ReadPath::Direct
    } else {
        ReadPath::PageCache
    }
}

/// The simulated run of the case on `profile` with the real run's budgets.
pub fn simulate_case(
    case: &Case,
    model: &ModelDescription,
    profile: &HardwareProfile,
    settings: &Settings,
    budgets: Budgets,
    prefetch_depth: u32,
) -> Result<PolicyRun, String> {
    let mut fit = FitSettings::from_settings(settings);
    fit.prefetch_depth = prefetch_depth;
    let options = RunOptions {
        steps: case.steps,
        vram_budget_bytes: budgets.vram_budget_bytes,
        pin_ceiling_bytes: budgets.pin_ceiling_bytes,
        settings: fit,
        faults: FaultPlan::default(),
        trace: None,
        max_reads_in_flight: settings.reader_threads as usize,
        virtual_time_limit: None,
    };
    let hardware = profile.clone().reading(read_path(case));
    run_policy(model, &hardware, Policy::Stagehand, &options).map_err(|error| error.to_string())
}

/// Simulates and runs one case; the row compares them.
pub fn validate_case(case: &Case, profile: &HardwareProfile) -> Result<Row, ValidateError> {
    let fail = |reason: String| ValidateError::Case {
        case: describe(case),
        reason,
    };
    let mut settings = settings_of(case);
    let prepared = prepare(case, &settings).map_err(fail)?;
    let budgets = budgets_of(case, &prepared, &mut settings);
    let model = description_of(case, &prepared).map_err(fail)?;
    let predicted = simulate_case(
        case,
        &model,
        profile,
        &settings,
        budgets,
        case.prefetch_depth,
    )
    .map_err(|reason| fail(format!("simulation: {reason}")))?;
    let mut runs = run_repeats(case, &prepared, &settings, budgets).map_err(fail)?;
    let steady_repeats = Repeats::new(
        runs.iter()
            .map(|run| median(steady_window(&run.step_seconds)))
            .collect(),
    );
    let cold_repeats = Repeats::new(
        runs.iter()
            .map(|run| run.step_seconds.first().copied().unwrap_or(0.0))
            .collect(),
    );
    // Bytes, peaks and rates from the first run (the plan is the same in every one).
    let measured = runs.swap_remove(0);
    let at_run = at_rates(profile, case, measured.rates);
    let predicted_at_run = simulate_case(
        case,
        &model,
        &at_run,
        &settings,
        budgets,
        case.prefetch_depth,
    )
    .map_err(|reason| fail(format!("simulation at the run's rates: {reason}")))?;
    let used = profile.clone().reading(read_path(case));
    let rates = RowRates {
        profile_copy_gb_per_s: used.link.pinned_gb_per_s,
        profile_read_gb_per_s: used.disk.read_gb_per_s,
        run_copy_gb_per_s: measured.rates.copy_bytes_per_second / 1e9,
        run_read_gb_per_s: measured.rates.read_bytes_per_second / 1e9,
    };
    Ok(compare(
        case,
        &predicted,
        &predicted_at_run,
        &measured,
        rates,
        (steady_repeats, cold_repeats),
    ))
}

/// The case's real runs, `repeats` of them. A page-cache row reads its model through
/// the page cache before each: the premise of the row (an earlier run dropped the
/// pages of what it pinned).
fn run_repeats(
    case: &Case,
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
) -> Result<Vec<Measured>, String> {
    let mut runs = Vec::new();
    for _ in 0..case.repeats.max(1) {
        if read_path(case) == ReadPath::PageCache {
            warm_page_cache(case.model.path())
                .map_err(|error| format!("reading the model into the page cache: {error}"))?;
        }
        runs.push(
            run_real(case, prepared, settings, budgets)
                .map_err(|reason| format!("real run: {reason}"))?,
        );
    }
    Ok(runs)
}

/// Reads every safetensors file of `path` (a file, or a folder's `*.safetensors`)
/// once through the page cache.
fn warm_page_cache(path: &Path) -> std::io::Result<()> {
    use std::io::Read;
    let files = if path.is_dir() {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let file = entry?.path();
            if file
                .extension()
                .is_some_and(|extension| extension == "safetensors")
            {
                files.push(file);
            }
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut buffer = vec![0u8; 8 << 20];
    for file in files {
        let (mut reader, _) = crate::model::open_regular(&file)?;
        while reader.read(&mut buffer)? > 0 {}
    }
    Ok(())
}

/// `profile` with its pinned copy rate and, on the O_DIRECT path, its read rate
/// replaced by the rates the real run measured (each kept where the run measured
/// none). On the page-cache path the run's read figure mixes cached pages with pages
/// it dropped after pinning them, so the profile's two rates stay.
fn at_rates(
    profile: &HardwareProfile,
    case: &Case,
    rates: crate::workload::bound::LinkRates,
) -> HardwareProfile {
    let mut hardware = profile.clone();
    if rates.copy_bytes_per_second > 0.0 {
        hardware.link.pinned_gb_per_s = rates.copy_bytes_per_second / 1e9;
    }
    if rates.read_bytes_per_second > 0.0 && read_path(case) == ReadPath::Direct {
        hardware.disk.direct_read_gb_per_s = Some(rates.read_bytes_per_second / 1e9);
    }
    hardware
}

fn compare(
    case: &Case,
    predicted: &PolicyRun,
    predicted_at_run: &PolicyRun,
    measured: &Measured,
    link_rates: RowRates,
    (steady_repeats, cold_repeats): (Repeats, Repeats),
) -> Row {
    let measured_steps: Vec<LinkBytes> = measured
        .boundaries
        .windows(2)
        .map(|pair| minus(pair[1], pair[0]))
        .collect();
    let mean = |steps: &[LinkBytes], field: fn(&LinkBytes) -> u64| {
        let window = steady_window(steps);
        window.iter().map(field).sum::<u64>() as f64 / window.len().max(1) as f64
    };
    let link = |field: fn(&LinkBytes) -> u64| {
        Figure::new(
            mean(&predicted.bytes_per_step, field),
            mean(&measured_steps, field),
        )
    };
    let exact = |predicted: u64, measured: u64| Figure::new(predicted as f64, measured as f64);
    let steady_measured = median(&steady_repeats.seconds);
    let cold_measured = median(&cold_repeats.seconds);
    let mut row = Row {
        case: case.clone(),
        vram_budget_bytes: measured.budgets.vram_budget_bytes,
        pin_ceiling_bytes: measured.budgets.pin_ceiling_bytes,
        steady_step_seconds: Figure::new(predicted.steady_step_seconds, steady_measured),
        cold_step_seconds: Figure::new(predicted.cold_step_seconds, cold_measured),
        steady_repeats,
        cold_repeats,
        disk_to_pinned_bytes: link(|bytes| bytes.disk_to_pinned),
        pinned_to_vram_bytes: link(|bytes| bytes.pinned_to_vram),
        disk_to_vram_bytes: link(|bytes| bytes.disk_to_vram),
        plan_streamed_bytes: exact(
            predicted.plan_streamed_bytes_per_step,
            measured.plan_streamed_bytes,
        ),
        plan_disk_bytes: exact(predicted.plan_disk_bytes_per_step, measured.plan_disk_bytes),
        peak_vram_bytes: exact(predicted.peak_vram_bytes, measured.peak_vram_bytes),
        peak_pinned_bytes: exact(predicted.peak_pinned_bytes, measured.peak_pinned_bytes),
        verified: measured.verified,
        verdict: Verdict::Pass,
        link_rates,
        steady_at_run_rates: Figure::new(predicted_at_run.steady_step_seconds, steady_measured),
        cold_at_run_rates: Figure::new(predicted_at_run.cold_step_seconds, cold_measured),
        verdict_at_run_rates: Verdict::Pass,
    };
    row.judge();
    row
}

fn minus(later: LinkBytes, earlier: LinkBytes) -> LinkBytes {
    LinkBytes {
        disk_to_pinned: later.disk_to_pinned.saturating_sub(earlier.disk_to_pinned),
        pinned_to_vram: later.pinned_to_vram.saturating_sub(earlier.pinned_to_vram),
        disk_to_vram: later.disk_to_vram.saturating_sub(earlier.disk_to_vram),
    }
}

fn median(values: &[f64]) -> f64 {
    super::median(values)
}

#[cfg(test)]
mod tests {
    use super::Repeats;

    #[test]
    fn repeats_explain_a_miss_only_when_they_spread_and_bracket_the_prediction() {
        // Identical runs at 11, 12 and 27 ms: spread 133 %.
        let noisy = Repeats::new(vec![0.011, 0.027, 0.012]);
        assert!((noisy.spread - 16.0 / 12.0).abs() < 1e-9);
        assert!(
            noisy.explains(0.0105, 0.10),
            "within the range widened by 10 %"
        );
        assert!(!noisy.explains(0.009, 0.10), "below the fastest run − 10 %");
        assert!(!noisy.explains(0.031, 0.10), "above the slowest run + 10 %");
        // Runs within 5 % of each other explain nothing.
        let steady = Repeats::new(vec![0.0100, 0.0102, 0.0104]);
        assert!(!steady.explains(0.0125, 0.10));
    }
}
