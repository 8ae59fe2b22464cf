//! A whole simulation: the fit check, then stagehand and the two baselines run through
//! the same simulated machine, compared with the bound and with each other. This is
//! what `stagehand simulate` prints and what the scenario harness checks.

use std::sync::Arc;

use serde::Serialize;

use super::depth::{candidate_depths, pick_depth, search_prefetch_depth, DepthCandidate};
use super::fit::{Bottleneck, FitCheck, FitSettings};
use super::model::ModelDescription;
use super::output::{OutputRate, StepOutput};
use super::policy::Policy;
use super::run::{run_policy, PolicyRun, RunOptions, SimRunError};
use crate::sim::FaultPlan;
use crate::sim::HardwareProfile;
use crate::telemetry::trace::TraceRecorder;

/// What to simulate besides the model and the machine.
#[derive(Debug, Clone)]
pub struct SimulateOptions {
    pub steps: u64,
    pub settings: FitSettings,
    pub faults: FaultPlan,
    /// Records the stagehand run (not the baselines).
    pub trace: Option<Arc<TraceRecorder>>,
    pub max_reads_in_flight: usize,
    /// Also run the naive and LRU baselines.
    pub baselines: bool,
    /// Choose stagehand's prefetch depth by simulating each candidate (see
    /// `sim::depth`) instead of using `settings.prefetch_depth`.
    pub auto_prefetch_depth: bool,
}

impl Default for SimulateOptions {
    fn default() -> Self {
        Self {
            steps: 10,
            settings: FitSettings::default(),
            faults: FaultPlan::default(),
            trace: None,
            max_reads_in_flight: 4,
            baselines: true,
            auto_prefetch_depth: false,
        }
    }
}

/// The verdict and every figure behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Simulation {
    pub model: String,
    pub hardware: String,
    pub gpu: String,
    pub link: String,
    pub disk: String,
    pub ram_bytes: u64,
    pub steps: u64,
    pub seed: u64,
    pub fits: bool,
    /// Each failing budget, in words (empty when it fits).
    pub failure_messages: Vec<String>,
    pub fit: FitCheck,
    /// `None` when the model does not fit.
    pub stagehand: Option<PolicyFigures>,
    /// Naive and LRU-prefetch, when asked for and the model fits.
    pub baselines: Vec<BaselineFigures>,
    /// The depth the settings give.
    pub prefetch_depth_configured: u32,
    /// The depth was chosen by simulation (`--prefetch-depth auto`).
    pub prefetch_depth_auto: bool,
    /// With auto: the depth the search chose, which the stagehand run and the fit check
    /// above use. `None` without auto, or when no candidate could run.
    pub prefetch_depth_chosen: Option<u32>,
    /// With auto: every depth tried, with its steady step over a short run.
    pub depth_candidates: Vec<DepthCandidate>,
    /// What a step produces (the description's `[output]`), when it says.
    pub output: Option<StepOutput>,
    /// The fit check's bound in the model's unit (tokens/s, s/image, s/video, s/step).
    pub bound_rate: OutputRate,
    /// Stagehand's steady step in the model's unit, when it ran.
    pub stagehand_rate: Option<OutputRate>,
    /// Things a user must know even though the model fits (e.g. impractically slow).
    pub warnings: Vec<String>,
    /// The activation tensors a step reserves and each kind of block's working set,
    /// when the description carries them (a Flux checkpoint).
    pub activations: Option<crate::families::Activations>,
    /// Where the reserve beside the weights comes from, in words; `None`: the
    /// description states none, so the fit counts none.
    pub reserve_basis: Option<String>,
}

/// What the simulation says to put in the config: the chosen depth, and how it
/// compares with the configured one (both from the search's short runs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DepthAdvice {
    pub depth: u32,
    pub steady_step_seconds: f64,
    pub configured_depth: u32,
    /// `None` when the configured depth could not run (e.g. its ring does not fit).
    pub configured_steady_step_seconds: Option<f64>,
}

/// One policy's run, with its ratio to the bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyFigures {
    #[serde(flatten)]
    pub run: PolicyRun,
    /// The fit check's bound at this policy's prefetch depth (a deeper ring leaves
    /// less VRAM to keep blocks resident, so the bound depends on the depth).
    pub bound_seconds: f64,
    /// Steady step ÷ bound: 1.0 is as fast as physically possible.
    pub steady_over_bound: f64,
    /// Bound ÷ steady step: the fraction of the bound reached.
    pub efficiency: f64,
    /// The bound of the bytes the session's plan actually moves:
    /// `max(compute, plan streamed / link, plan disk / disk)`. The plan keeps whole
    /// blocks resident, so it streams slightly more than the fit check's arithmetic.
    pub plan_bound_seconds: f64,
    /// Steady step ÷ plan bound: how well the pipeline overlaps what it must move.
    pub steady_over_plan_bound: f64,
}

/// A baseline's run, or why it could not run, and how stagehand compares.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BaselineFigures {
    pub policy: Policy,
    pub description: &'static str,
    pub figures: Option<PolicyFigures>,
    /// Why the baseline could not run under these budgets.
    pub error: Option<String>,
    /// Baseline's steady step ÷ stagehand's: how many times faster stagehand is.
    pub stagehand_speedup: Option<f64>,
}

impl PolicyFigures {
    fn new(
        run: PolicyRun,
        model: &ModelDescription,
        hardware: &HardwareProfile,
        settings: &FitSettings,
    ) -> Self {
        let at_depth = FitSettings {
            prefetch_depth: run.prefetch_depth,
            ..*settings
        };
        let fit = FitCheck::new(model, hardware, &at_depth);
        let link = hardware.link_rates().pinned_bytes_per_second as f64;
        let disk = hardware.disk_rates().bytes_per_second as f64;
        let plan_bound_seconds = fit
            .compute_seconds
            .max(run.plan_streamed_bytes_per_step as f64 / link)
            .max(run.plan_disk_bytes_per_step as f64 / disk);
        let steady = run.steady_step_seconds;
        Self {
            bound_seconds: fit.bound_seconds,
            steady_over_bound: ratio(steady, fit.bound_seconds),
            efficiency: ratio(fit.bound_seconds, steady),
            plan_bound_seconds,
            steady_over_plan_bound: ratio(steady, plan_bound_seconds),
            run,
        }
    }
}

impl Simulation {
    /// With auto, the depth to configure for this model on this machine.
    pub fn depth_advice(&self) -> Option<DepthAdvice> {
        let depth = self.prefetch_depth_chosen?;
        let steady = |wanted: u32| {
            self.depth_candidates
                .iter()
                .find(|candidate| candidate.depth == wanted)
                .and_then(|candidate| candidate.steady_step_seconds)
        };
        Some(DepthAdvice {
            depth,
            steady_step_seconds: steady(depth)?,
            configured_depth: self.prefetch_depth_configured,
            configured_steady_step_seconds: steady(self.prefetch_depth_configured),
        })
    }

    /// The baseline of a policy, if it was run.
    pub fn baseline(&self, policy: Policy) -> Option<&BaselineFigures> {
        self.baselines
            .iter()
            .find(|baseline| baseline.policy == policy)
    }
}

fn seconds_text(value: f64) -> String {
    if value >= 1.0 {
        format!("{value:.1} s")
    } else {
        format!("{:.1} ms", value * 1e3)
    }
}

/// Budgets below 1 ns of work would divide by zero: report 1.0 for "both nothing".
fn ratio(numerator: f64, denominator: f64) -> f64 {
    if denominator > 0.0 {
        numerator / denominator
    } else if numerator > 0.0 {
        f64::INFINITY
    } else {
        1.0
    }
}

/// Checks the fit and, when it fits, runs stagehand and (optionally) both baselines.
/// With `auto_prefetch_depth`, first chooses stagehand's depth by simulation (when no
/// depth can run, the configured one is checked and run as without auto).
/// A failed stagehand run is an error; a baseline that cannot run is reported in its
/// figures (e.g. LRU's slots do not fit a budget stagehand's ring does).
pub fn simulate(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    options: &SimulateOptions,
) -> Result<Simulation, SimRunError> {
    let configured = options.settings.prefetch_depth;
    let DepthChoice {
        settings,
        candidates: depth_candidates,
        chosen: prefetch_depth_chosen,
    } = choose_depth(model, hardware, options);
    let fit = FitCheck::new(model, hardware, &settings);
    let output = model.output;
    let bound_rate = StepOutput::rate(output.as_ref(), fit.bound_seconds, model.tokens_per_step);
    let mut simulation = Simulation {
        model: model.name.clone(),
        hardware: hardware.name.clone(),
        gpu: hardware.gpu.name.clone(),
        link: hardware.link.name.clone(),
        disk: hardware.disk.name.clone(),
        ram_bytes: hardware.ram_bytes,
        steps: options.steps.max(1),
        seed: options.faults.seed,
        fits: fit.fits,
        failure_messages: fit.failures.iter().map(ToString::to_string).collect(),
        fit,
        stagehand: None,
        baselines: Vec::new(),
        prefetch_depth_configured: configured,
        prefetch_depth_auto: options.auto_prefetch_depth,
        prefetch_depth_chosen,
        depth_candidates,
        output,
        bound_rate,
        stagehand_rate: None,
        warnings: Vec::new(),
        activations: model.activations.clone(),
        reserve_basis: model.reserve_basis.clone(),
    };
    if !simulation.fits {
        return Ok(simulation);
    }
    let run_options = RunOptions {
        steps: simulation.steps,
        vram_budget_bytes: simulation.fit.vram_budget_bytes,
        pin_ceiling_bytes: simulation.fit.pin_ceiling_bytes,
        settings,
        faults: options.faults.clone(),
        trace: options.trace.clone(),
        max_reads_in_flight: options.max_reads_in_flight,
        virtual_time_limit: None,
    };
    let stagehand = run_policy(model, hardware, Policy::Stagehand, &run_options)?;
    let stagehand_steady = stagehand.steady_step_seconds;
    simulation.stagehand_rate = Some(StepOutput::rate(
        output.as_ref(),
        stagehand_steady,
        model.tokens_per_step,
    ));
    simulation
        .warnings
        .extend(too_slow(model, stagehand_steady, &simulation.fit));
    simulation.stagehand = Some(PolicyFigures::new(stagehand, model, hardware, &settings));
    if options.baselines {
        let baseline_options = RunOptions {
            trace: None,
            ..run_options
        };
        for policy in [Policy::Naive, Policy::LruPrefetch] {
            let outcome = run_policy(model, hardware, policy, &baseline_options);
            simulation.baselines.push(BaselineFigures::new(
                policy,
                outcome,
                stagehand_steady,
                model,
                hardware,
                &settings,
            ));
        }
    }
    Ok(simulation)
}

/// The settings stagehand runs with, and how their prefetch depth was chosen.
struct DepthChoice {
    settings: FitSettings,
    /// Every depth tried, with its figure (none without auto).
    candidates: Vec<DepthCandidate>,
    /// The depth the search chose, if any could run.
    chosen: Option<u32>,
}

/// With `auto_prefetch_depth`, simulates each candidate depth and runs with the
/// fastest; otherwise (or when none can run) the configured depth.
fn choose_depth(
    model: &ModelDescription,
    hardware: &HardwareProfile,
    options: &SimulateOptions,
) -> DepthChoice {
    let mut settings = options.settings;
    if !options.auto_prefetch_depth {
        return DepthChoice {
            settings,
            candidates: Vec::new(),
            chosen: None,
        };
    }
    let candidates = search_prefetch_depth(
        model,
        hardware,
        &settings,
        &options.faults,
        options.max_reads_in_flight,
        &candidate_depths(settings.prefetch_depth),
    );
    let chosen = pick_depth(&candidates);
    if let Some(depth) = chosen {
        settings.prefetch_depth = depth;
    }
    DepthChoice {
        settings,
        candidates,
        chosen,
    }
}

/// The warning for a steady step slower than the model's output needs, with what
/// limits it.
fn too_slow(model: &ModelDescription, steady_seconds: f64, fit: &FitCheck) -> Option<String> {
    let warning =
        StepOutput::too_slow(model.output.as_ref(), steady_seconds, model.tokens_per_step)?;
    Some(format!(
        "{warning}; limited by {} (the bound is {} per step)",
        what_helps(fit.bottleneck),
        seconds_text(fit.bound_seconds)
    ))
}

/// What would make a step bound by `bottleneck` faster.
fn what_helps(bottleneck: Bottleneck) -> &'static str {
    match bottleneck {
        Bottleneck::Compute => "compute: only a faster GPU helps",
        Bottleneck::Link => "the PCIe link: more VRAM would keep more blocks resident",
        Bottleneck::Disk => "the disk: more RAM would cache more blocks, or a faster disk",
    }
}

impl BaselineFigures {
    /// A baseline's figures and its ratio to stagehand's steady step, or why it
    /// could not run.
    fn new(
        policy: Policy,
        outcome: Result<PolicyRun, SimRunError>,
        stagehand_steady: f64,
        model: &ModelDescription,
        hardware: &HardwareProfile,
        settings: &FitSettings,
    ) -> Self {
        match outcome {
            Ok(run) => BaselineFigures {
                policy,
                description: policy.description(),
                stagehand_speedup: Some(ratio(run.steady_step_seconds, stagehand_steady)),
                figures: Some(PolicyFigures::new(run, model, hardware, settings)),
                error: None,
            },
            Err(error) => BaselineFigures {
                policy,
                description: policy.description(),
                figures: None,
                error: Some(error.to_string()),
                stagehand_speedup: None,
            },
        }
    }
}
