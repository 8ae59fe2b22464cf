//! The scenario harness: a TOML file names a model, a machine, settings and what must
//! hold (`fits = true`, `efficiency_min = 0.95`, ...); [`run_scenario`] simulates it
//! and checks every expectation. A scenario that does not hold is an error that
//! prints what was expected, what was got, and the seed to reproduce it.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let scenario = std::path::Path::new("tests/scenarios/llama3-8b-decode-rtx3060.toml");
//! let report = stagehand::harness::run_scenario(scenario)?;
//! println!("{report}");
//! # Ok(()) }
//! ```
//!
//! The format is documented in docs/simulator.md ("Scenarios").

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytesize::ByteSize;
use serde::Deserialize;

use super::fit::{Bottleneck, FitSettings};
use super::model::ModelDescription;
use super::run::SimRunError;
use super::simulation::{simulate, SimulateOptions, Simulation};
use crate::settings::{self, LoadOptions, SettingsArgs};
use crate::sim::FaultPlan;
use crate::sim::HardwareProfile;
use crate::telemetry::trace::TraceRecorder;

mod checks;

pub use checks::Check;

/// A scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScenarioFile {
    #[serde(default)]
    pub description: String,
    /// A shipped model or a description TOML (relative to the scenario's folder).
    pub model: String,
    /// A shipped hardware profile or a profile TOML (relative to the scenario's folder).
    pub hardware: String,
    pub ram: Option<ByteSize>,
    pub disk: Option<String>,
    #[serde(default = "default_steps")]
    pub steps: u64,
    #[serde(default)]
    pub seed: u64,
    /// Also run the naive and LRU baselines.
    #[serde(default = "yes")]
    pub baselines: bool,
    /// Settings by their `config/default.toml` names, layered over the built-in
    /// defaults only (no default file, no environment: a scenario means the same
    /// everywhere).
    #[serde(default)]
    pub settings: toml::Table,
    /// Jitter and faults (the seed is the scenario's).
    #[serde(default)]
    pub faults: Faults,
    #[serde(default)]
    pub expect: Expectations,
}

fn default_steps() -> u64 {
    6
}

fn yes() -> bool {
    true
}

/// The perturbations of [`FaultPlan`], without its seed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Faults {
    #[serde(default)]
    pub jitter: f64,
    #[serde(default)]
    pub slow_read_probability: f64,
    #[serde(default)]
    pub slow_read_factor: f64,
    pub fail_read_after: Option<u64>,
}

/// What must hold. Every key is optional; only the given ones are checked.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectations {
    pub fits: Option<bool>,
    /// With `fits = false`: the budgets that fail, e.g. `["vram_budget"]`.
    pub failing_budgets: Option<Vec<String>>,
    pub bottleneck: Option<Bottleneck>,
    /// Bound ÷ stagehand's steady step, at least.
    pub efficiency_min: Option<f64>,
    /// Stagehand's steady step ÷ bound, at most.
    pub steady_over_bound_max: Option<f64>,
    /// Stagehand's steady step ÷ the bound of the bytes its plan moves, at most.
    pub steady_over_plan_bound_max: Option<f64>,
    /// Stagehand's steady step ÷ pure compute − 1, at most (what streaming costs).
    pub streaming_overhead_max: Option<f64>,
    /// Stagehand's measured bytes to VRAM per steady step, at most.
    pub pcie_bytes_per_step_max: Option<u64>,
    /// Stagehand's measured bytes from disk per steady step, at most.
    pub disk_bytes_per_step_max: Option<u64>,
    /// Baseline's steady step ÷ stagehand's, at least.
    pub faster_than_naive_min: Option<f64>,
    pub faster_than_lru_min: Option<f64>,
    /// Peaks never above the budgets (default: checked whenever a run completes).
    pub within_budgets: Option<bool>,
    /// The stagehand run must fail (fault injection).
    pub run_fails: Option<bool>,
    /// After a failed run, VRAM and pinned usage are back to zero.
    pub budgets_released: Option<bool>,
}

/// What came of a scenario.
#[derive(Debug, Clone)]
pub enum ScenarioOutcome {
    Simulated(Box<Simulation>),
    /// The stagehand run failed (fault injection, or a pipeline error).
    RunFailed {
        message: String,
        released: bool,
    },
    /// The run made no progress within its virtual-time limit.
    Stalled {
        message: String,
    },
}

/// A scenario's result and every check made.
#[derive(Debug, Clone)]
pub struct ScenarioReport {
    pub name: String,
    pub path: PathBuf,
    pub description: String,
    pub seed: u64,
    pub outcome: ScenarioOutcome,
    pub checks: Vec<Check>,
}

impl ScenarioReport {
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|check| check.passed)
    }

    pub fn failed_checks(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|check| !check.passed)
    }

    pub fn simulation(&self) -> Option<&Simulation> {
        match &self.outcome {
            ScenarioOutcome::Simulated(simulation) => Some(simulation),
            _ => None,
        }
    }
}

impl fmt::Display for ScenarioReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.passed() { "ok" } else { "FAILED" };
        writeln!(
            f,
            "scenario {} ({}): {verdict}, seed {}",
            self.name,
            self.path.display(),
            self.seed
        )?;
        if !self.description.is_empty() {
            writeln!(f, "  {}", self.description)?;
        }
        match &self.outcome {
            ScenarioOutcome::Simulated(_) => {}
            ScenarioOutcome::RunFailed { message, .. } => writeln!(f, "  run failed: {message}")?,
            ScenarioOutcome::Stalled { message } => writeln!(f, "  stalled: {message}")?,
        }
        for check in &self.checks {
            let mark = if check.passed { "ok  " } else { "FAIL" };
            writeln!(
                f,
                "  {mark} {}: expected {}, got {}",
                check.name, check.expected, check.got
            )?;
        }
        Ok(())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("scenario {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("scenario {path}: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error("{0}")]
    Unmet(Box<ScenarioReport>),
}

/// A loaded scenario, ready to run.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub name: String,
    pub path: PathBuf,
    pub file: ScenarioFile,
    pub model: ModelDescription,
    pub hardware: HardwareProfile,
    pub options: SimulateOptions,
}

impl Scenario {
    pub fn load(path: &Path) -> Result<Self, HarnessError> {
        let invalid = |reason: String| HarnessError::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|error| HarnessError::Read {
            path: path.to_path_buf(),
            reason: error.to_string(),
        })?;
        let file: ScenarioFile = toml::from_str(&text).map_err(|e| invalid(e.to_string()))?;
        let folder = path.parent().unwrap_or(Path::new("."));
        let resolve = |name: &str| {
            let local = folder.join(name);
            if local.is_file() {
                local.display().to_string()
            } else {
                name.to_string()
            }
        };
        let model = ModelDescription::load(&resolve(&file.model))
            .map_err(|e| invalid(format!("model: {e}")))?;
        let mut hardware = HardwareProfile::load(&resolve(&file.hardware))
            .map_err(|e| invalid(format!("hardware: {e}")))?;
        if let Some(ram) = file.ram {
            hardware = hardware.with_ram(ram);
        }
        if let Some(disk) = &file.disk {
            hardware = hardware
                .with_disk(disk)
                .map_err(|e| invalid(format!("disk: {e}")))?;
        }
        let (args, auto_prefetch_depth) = settings_args(&file.settings).map_err(&invalid)?;
        let loaded = settings::load_with(&args, &LoadOptions::default())
            .map_err(|e| invalid(format!("[settings]: {e}")))?;
        let faults = FaultPlan {
            seed: file.seed,
            jitter: file.faults.jitter,
            slow_read_probability: file.faults.slow_read_probability,
            slow_read_factor: file.faults.slow_read_factor,
            fail_read_after: file.faults.fail_read_after,
        };
        faults
            .validate()
            .map_err(|e| invalid(format!("[faults]: {e}")))?;
        if file.steps == 0 {
            return Err(invalid("steps = 0: simulate at least 1 step".to_string()));
        }
        let options = SimulateOptions {
            steps: file.steps,
            settings: FitSettings::from_settings(&loaded.settings),
            faults,
            trace: None,
            max_reads_in_flight: loaded.settings.reader_threads as usize,
            baselines: file.baselines,
            auto_prefetch_depth,
        };
        let name = path.file_stem().map_or_else(
            || path.display().to_string(),
            |stem| stem.to_string_lossy().into_owned(),
        );
        Ok(Self {
            name,
            path: path.to_path_buf(),
            file,
            model,
            hardware,
            options,
        })
    }

    /// Simulates the scenario (recording the stagehand run into `trace` if given)
    /// and checks its expectations. Unmet expectations are an error carrying the report.
    pub fn run(&self, trace: Option<Arc<TraceRecorder>>) -> Result<ScenarioReport, HarnessError> {
        let options = SimulateOptions {
            trace,
            ..self.options.clone()
        };
        let outcome = match simulate(&self.model, &self.hardware, &options) {
            Ok(simulation) => ScenarioOutcome::Simulated(Box::new(simulation)),
            Err(error) => {
                let message = error.to_string();
                match error {
                    SimRunError::Failed { released, .. } => {
                        ScenarioOutcome::RunFailed { message, released }
                    }
                    SimRunError::Stalled { .. } => ScenarioOutcome::Stalled { message },
                    SimRunError::Setup(_) | SimRunError::Plan { .. } => {
                        return Err(HarnessError::Invalid {
                            path: self.path.clone(),
                            reason: message,
                        })
                    }
                }
            }
        };
        let checks = checks::check(&self.file.expect, &outcome);
        let report = ScenarioReport {
            name: self.name.clone(),
            path: self.path.clone(),
            description: self.file.description.clone(),
            seed: self.file.seed,
            outcome,
            checks,
        };
        if report.passed() {
            Ok(report)
        } else {
            Err(HarnessError::Unmet(Box::new(report)))
        }
    }
}

/// Loads, simulates and checks one scenario file.
pub fn run_scenario(path: &Path) -> Result<ScenarioReport, HarnessError> {
    Scenario::load(path)?.run(None)
}

/// Every `*.toml` in a folder, sorted by name.
pub fn scenario_files(folder: &Path) -> Result<Vec<PathBuf>, HarnessError> {
    let entries = std::fs::read_dir(folder).map_err(|error| HarnessError::Read {
        path: folder.to_path_buf(),
        reason: error.to_string(),
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    files.sort();
    Ok(files)
}

/// The `[settings]` table as the flags it stands for, so it is parsed and validated
/// by the same code as the command line; `true` with `prefetch_depth = "auto"` (the
/// simulator chooses the depth; the configured one is then the built-in default).
fn settings_args(table: &toml::Table) -> Result<(SettingsArgs, bool), String> {
    let mut args = SettingsArgs::default();
    let mut auto_prefetch_depth = false;
    for (key, value) in table {
        if key == "prefetch_depth" && value.as_str() == Some("auto") {
            auto_prefetch_depth = true;
            continue;
        }
        let text = match value {
            toml::Value::String(text) => text.clone(),
            toml::Value::Integer(number) => number.to_string(),
            toml::Value::Float(number) => number.to_string(),
            toml::Value::Boolean(flag) => flag.to_string(),
            other => {
                return Err(format!(
                    "[settings] {key} = {other}: give a string, number or boolean"
                ))
            }
        };
        let slot = match key.as_str() {
            "device" => &mut args.device,
            "vram_budget" => &mut args.vram_budget,
            "reserve_vram" => &mut args.reserve_vram,
            "vram_headroom" => &mut args.vram_headroom,
            "pin_ceiling" => &mut args.pin_ceiling,
            "ram_floor" => &mut args.ram_floor,
            "prefetch_depth" => &mut args.prefetch_depth,
            "staging_buffers" => &mut args.staging_buffers,
            "staging_buffer_size" => &mut args.staging_buffer_size,
            "read_request_size" => &mut args.read_request_size,
            "reader_threads" => &mut args.reader_threads,
            "fast_disk" => {
                let flag = value.as_bool().ok_or_else(|| {
                    format!("[settings] fast_disk = {value}: give true or false")
                })?;
                args.set_fast_disk(flag);
                continue;
            }
            other => {
                return Err(format!(
                    "[settings] unknown key `{other}`: a scenario takes device, vram_budget, reserve_vram, vram_headroom, pin_ceiling, ram_floor, fast_disk, prefetch_depth, staging_buffers, staging_buffer_size, read_request_size, reader_threads"
                ))
            }
        };
        *slot = Some(text);
    }
    Ok((args, auto_prefetch_depth))
}
