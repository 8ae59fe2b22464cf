//! Each expectation of a scenario, checked against what the simulation produced.

use stagehand_actors::Bytes;

use super::{Expectations, ScenarioOutcome};
use crate::simulate::policy::Policy;
use crate::simulate::simulation::{PolicyFigures, Simulation};

/// One expectation: what was expected, what the run gave, and whether it held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub name: String,
    pub expected: String,
    pub got: String,
    pub passed: bool,
}

impl Check {
    fn new(name: &str, expected: String, got: String, passed: bool) -> Self {
        Self {
            name: name.to_string(),
            expected,
            got,
            passed,
        }
    }
}

pub(super) fn check(expect: &Expectations, outcome: &ScenarioOutcome) -> Vec<Check> {
    let mut checks = Vec::new();
    let wants_failure = expect.run_fails == Some(true);
    match outcome {
        ScenarioOutcome::RunFailed { message, released } => {
            checks.push(Check::new(
                "run",
                if wants_failure { "fails" } else { "completes" }.to_string(),
                format!("failed: {message}"),
                wants_failure,
            ));
            if let Some(expected) = expect.budgets_released {
                checks.push(Check::new(
                    "budgets_released",
                    expected.to_string(),
                    released.to_string(),
                    *released == expected,
                ));
            }
        }
        ScenarioOutcome::Stalled { message } => checks.push(Check::new(
            "run",
            "ends within its virtual-time limit".to_string(),
            message.clone(),
            false,
        )),
        ScenarioOutcome::Simulated(simulation) => {
            if wants_failure {
                checks.push(Check::new(
                    "run",
                    "fails".to_string(),
                    "completed".to_string(),
                    false,
                ));
            }
            check_simulation(expect, simulation, &mut checks);
        }
    }
    checks
}

fn check_simulation(expect: &Expectations, simulation: &Simulation, checks: &mut Vec<Check>) {
    check_fit(expect, simulation, checks);
    check_stagehand_times(expect, simulation, checks);
    check_stagehand_bytes(expect, simulation, checks);
    check_speedups(expect, simulation, checks);
    check_within_budgets(expect, simulation, checks);
}

/// Whether it fits, which budgets fail, and what bounds a step.
fn check_fit(expect: &Expectations, simulation: &Simulation, checks: &mut Vec<Check>) {
    let fit = &simulation.fit;
    if let Some(expected) = expect.fits {
        let got = if simulation.fits {
            "fits".to_string()
        } else {
            format!("does not fit: {}", simulation.failure_messages.join("; "))
        };
        checks.push(Check::new(
            "fits",
            expected.to_string(),
            got,
            simulation.fits == expected,
        ));
    }
    if let Some(expected) = &expect.failing_budgets {
        let mut got: Vec<String> = fit
            .failures
            .iter()
            .map(|failure| failure.budget().to_string())
            .collect();
        got.dedup();
        let mut wanted = expected.clone();
        wanted.sort();
        let mut sorted = got.clone();
        sorted.sort();
        checks.push(Check::new(
            "failing_budgets",
            format!("{expected:?}"),
            format!("{got:?} ({})", simulation.failure_messages.join("; ")),
            sorted == wanted,
        ));
    }
    if let Some(expected) = expect.bottleneck {
        checks.push(Check::new(
            "bottleneck",
            format!("{expected:?}"),
            format!(
                "{:?} (compute {:.4} s, pcie {:.4} s, disk {:.4} s)",
                fit.bottleneck, fit.compute_seconds, fit.pcie_seconds, fit.disk_seconds
            ),
            fit.bottleneck == expected,
        ));
    }
}

/// Stagehand's steady step against the bound, the plan's bound and the compute.
fn check_stagehand_times(expect: &Expectations, simulation: &Simulation, checks: &mut Vec<Check>) {
    let stagehand = simulation.stagehand.as_ref();
    let mut figure = |name: &str,
                      limit: Option<f64>,
                      at_least: bool,
                      value: &dyn Fn(&PolicyFigures) -> f64,
                      detail: &dyn Fn(&PolicyFigures) -> String| {
        let Some(limit) = limit else { return };
        let expected = format!("{} {limit}", if at_least { "≥" } else { "≤" });
        let (got, passed) = match stagehand {
            Some(figures) => {
                let got = value(figures);
                let passed = if at_least { got >= limit } else { got <= limit };
                (format!("{got:.4} ({})", detail(figures)), passed)
            }
            None => ("no run: the model does not fit".to_string(), false),
        };
        checks.push(Check::new(name, expected, got, passed));
    };
    let times = |figures: &PolicyFigures| {
        format!(
            "steady {:.4} s, bound {:.4} s, plan bound {:.4} s",
            figures.run.steady_step_seconds, figures.bound_seconds, figures.plan_bound_seconds
        )
    };
    figure(
        "efficiency_min",
        expect.efficiency_min,
        true,
        &|f| f.efficiency,
        &times,
    );
    figure(
        "steady_over_bound_max",
        expect.steady_over_bound_max,
        false,
        &|f| f.steady_over_bound,
        &times,
    );
    figure(
        "steady_over_plan_bound_max",
        expect.steady_over_plan_bound_max,
        false,
        &|f| f.steady_over_plan_bound,
        &times,
    );
    let compute_seconds = simulation.fit.compute_seconds;
    figure(
        "streaming_overhead_max",
        expect.streaming_overhead_max,
        false,
        &|f| f.run.steady_step_seconds / compute_seconds - 1.0,
        &|f| {
            format!(
                "steady {:.4} s over compute {compute_seconds:.4} s",
                f.run.steady_step_seconds
            )
        },
    );
}

/// The bytes stagehand moves per steady step, over PCIe and from disk.
fn check_stagehand_bytes(expect: &Expectations, simulation: &Simulation, checks: &mut Vec<Check>) {
    let stagehand = simulation.stagehand.as_ref();
    let bytes = |name: &str, limit: Option<u64>, value: &dyn Fn(&PolicyFigures) -> f64| {
        limit.map(|limit| {
            let (got, passed) = match stagehand {
                Some(figures) => {
                    let got = value(figures);
                    (
                        format!("{got:.0} B ({})", Bytes(got.round() as u64)),
                        got <= limit as f64,
                    )
                }
                None => ("no run: the model does not fit".to_string(), false),
            };
            Check::new(name, format!("≤ {limit} B ({})", Bytes(limit)), got, passed)
        })
    };
    checks.extend(bytes(
        "pcie_bytes_per_step_max",
        expect.pcie_bytes_per_step_max,
        &|f| f.run.steady_bytes_per_step.to_vram(),
    ));
    checks.extend(bytes(
        "disk_bytes_per_step_max",
        expect.disk_bytes_per_step_max,
        &|f| f.run.steady_bytes_per_step.from_disk(),
    ));
}

/// Stagehand's speedup over each baseline.
fn check_speedups(expect: &Expectations, simulation: &Simulation, checks: &mut Vec<Check>) {
    for (name, limit, policy) in [
        (
            "faster_than_naive_min",
            expect.faster_than_naive_min,
            Policy::Naive,
        ),
        (
            "faster_than_lru_min",
            expect.faster_than_lru_min,
            Policy::LruPrefetch,
        ),
    ] {
        let Some(limit) = limit else { continue };
        let (got, passed) = match simulation.baseline(policy) {
            Some(baseline) => match (baseline.stagehand_speedup, &baseline.figures) {
                (Some(speedup), Some(figures)) => (
                    format!(
                        "{speedup:.3}× ({} steady {:.4} s)",
                        policy.label(),
                        figures.run.steady_step_seconds
                    ),
                    speedup >= limit,
                ),
                _ => (
                    format!(
                        "{} could not run: {}",
                        policy.label(),
                        baseline.error.as_deref().unwrap_or("unknown")
                    ),
                    false,
                ),
            },
            None => (format!("{} was not run", policy.label()), false),
        };
        checks.push(Check::new(name, format!("≥ {limit}×"), got, passed));
    }
}

/// Every run's peaks within its budgets.
fn check_within_budgets(expect: &Expectations, simulation: &Simulation, checks: &mut Vec<Check>) {
    let ran = simulation.stagehand.is_some();
    if expect.within_budgets.unwrap_or(ran) {
        let mut runs: Vec<&PolicyFigures> = simulation.stagehand.iter().collect();
        runs.extend(
            simulation
                .baselines
                .iter()
                .filter_map(|b| b.figures.as_ref()),
        );
        let over: Vec<String> = runs
            .iter()
            .filter(|f| {
                f.run.peak_vram_bytes > f.run.vram_budget_bytes
                    || f.run.peak_pinned_bytes > f.run.pinned_limit_bytes
            })
            .map(|f| {
                format!(
                    "{}: vram {} / {}, pinned {} / {}",
                    f.run.policy.label(),
                    f.run.peak_vram_bytes,
                    f.run.vram_budget_bytes,
                    f.run.peak_pinned_bytes,
                    f.run.pinned_limit_bytes
                )
            })
            .collect();
        checks.push(Check::new(
            "within_budgets",
            "every peak ≤ its budget".to_string(),
            if !ran {
                "no run".to_string()
            } else if over.is_empty() {
                format!("{} runs within budgets", runs.len())
            } else {
                over.join("; ")
            },
            ran && over.is_empty(),
        ));
    }
}
