//! `stagehand validate`: one configuration both simulated on a hardware profile and
//! really run on this machine's backend, through the same budgets, so the prediction
//! and the measurement are about the same work.
//!
//! The real run is `stagehand run`'s path (`run::prepare_with`, `run::execute`); the
//! simulation is `sim::run_policy` of the description `simulate --model` makes of the
//! same file, with the budgets the real run resolved. Bytes per link per step are
//! counted from the real session's observer at each step's end, as the simulator
//! counts them from its session's stats.

mod measure;
mod row;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use stagehand_actors::ResidencyPolicy;

pub use row::{Figure, Repeats, Row, RowRates, Verdict, COLD_TOLERANCE, STEADY_TOLERANCE};

use super::median;
use crate::run::{Budgets, Extras, Prepared, WorkloadKind};
use crate::settings::Settings;
use crate::sim::{FaultPlan, HardwareProfile, ReadPath};
use crate::simulate::{
    run_policy, steady_window, FitSettings, ModelDescription, Policy, PolicyRun, RunOptions,
};
use crate::telemetry::trace::TraceRecorder;
use measure::run_repeats;
use row::compare;

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

impl Case {
    /// The case in a table's words: `linear-stack b64 v30% d2 fast`.
    pub fn short_label(&self) -> String {
        format!(
            "{} b{} v{:.0}% d{}{}",
            self.model.label(),
            self.batch,
            self.vram_share * 100.0,
            self.prefetch_depth,
            if self.fast_disk { " fast" } else { "" }
        )
    }
}

/// The file stem of the case's traces, its short label as a name:
/// `linear-stack-b64-v30-d2-fast`.
pub fn trace_stem(case: &Case) -> String {
    case.short_label().replace('%', "").replace(' ', "-")
}

fn settings_of(case: &Case) -> Settings {
    Settings {
        prefetch_depth: case.prefetch_depth,
        fast_disk: case.fast_disk,
        ..Settings::default()
    }
}

fn prepare(case: &Case, settings: &Settings) -> Result<Prepared, String> {
    // The case's model is its own family's (a generated one for linear-stack).
    let is_demo = matches!(case.model, CaseModel::LinearStack { .. });
    crate::run::prepare_with(
        case.model.path(),
        WorkloadKind::Auto,
        case.batch,
        settings,
        is_demo,
        &Extras::default(),
    )
    .map_err(|error| error.to_string())
}

/// The budgets of the case: the one budget policy `stagehand run` applies, starting
/// from the case's share of the model.
fn budgets_of(case: &Case, prepared: &Prepared, settings: &Settings) -> Budgets {
    crate::run::budgets_for(
        prepared,
        settings,
        crate::run::BudgetAsk {
            steps: case.steps,
            policy: ResidencyPolicy::Planned,
            vram_share: case.vram_share,
        },
    )
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
    trace: Option<Arc<TraceRecorder>>,
) -> Result<PolicyRun, String> {
    let mut fit = FitSettings::from_settings(settings);
    fit.prefetch_depth = prefetch_depth;
    let options = RunOptions {
        steps: case.steps,
        vram_budget_bytes: budgets.vram_budget_bytes,
        pin_ceiling_bytes: budgets.pin_ceiling_bytes,
        settings: fit,
        faults: FaultPlan::default(),
        trace,
        max_reads_in_flight: settings.reader_threads as usize,
        virtual_time_limit: None,
    };
    let hardware = profile.clone().reading(read_path(case));
    run_policy(model, &hardware, Policy::Stagehand, &options).map_err(|error| error.to_string())
}

/// Simulates and runs one case; the row compares them. With `traces`, the simulated
/// run's Chrome trace is written there as `<stem>.sim.json` and the last real run's as
/// `<stem>.run.json` ([`trace_stem`]): where a row misses, the two timelines show
/// which lane differs.
pub fn validate_case(
    case: &Case,
    profile: &HardwareProfile,
    traces: Option<&Path>,
) -> Result<Row, ValidateError> {
    let fail = |reason: String| ValidateError::Case {
        case: describe(case),
        reason,
    };
    let mut settings = settings_of(case);
    let prepared = prepare(case, &settings).map_err(fail)?;
    let budgets = budgets_of(case, &prepared, &settings);
    // The run and the simulation take the budget as set, as a user would give it.
    settings.vram_budget = Some(bytesize::ByteSize(budgets.vram_budget_bytes));
    let model = description_of(case, &prepared).map_err(fail)?;
    let sim_trace = traces.map(|_| Arc::new(TraceRecorder::new()));
    let predicted = simulate_case(
        case,
        &model,
        profile,
        &settings,
        budgets,
        case.prefetch_depth,
        sim_trace.clone(),
    )
    .map_err(|reason| fail(format!("simulation: {reason}")))?;
    if let (Some(dir), Some(trace)) = (traces, &sim_trace) {
        let stem = trace_stem(case);
        let path = dir.join(format!("{stem}.sim.json"));
        trace
            .write_chrome_trace(&path)
            .map_err(|error| fail(format!("writing {}: {error}", path.display())))?;
        settings.trace = Some(dir.join(format!("{stem}.run.json")));
    }
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
        None,
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

/// `profile` with its pinned copy rate and, on the O_DIRECT path, its read rate
/// replaced by the rates the real run measured (each kept where the run measured
/// none). On the page-cache path the run's read figure mixes cached pages with pages
/// it dropped after pinning them, so the profile's two rates stay.
fn at_rates(
    profile: &HardwareProfile,
    case: &Case,
    rates: crate::run::bound::LinkRates,
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
