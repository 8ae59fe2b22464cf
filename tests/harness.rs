//! The scenario harness: every scenario in tests/scenarios holds, and a scenario that
//! does not hold reports what it expected, what it got and its seed.

use std::path::{Path, PathBuf};

use stagehand::harness::{run_scenario, scenario_files, HarnessError, ScenarioOutcome};

fn scenarios() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios")
}

#[test]
fn every_scenario_holds() {
    // Proves each shipped scenario's expectations hold when simulated through the actors.
    let files = scenario_files(&scenarios()).unwrap();
    assert!(files.len() >= 6, "scenarios: {files:?}");
    let mut failures = Vec::new();
    for file in &files {
        match run_scenario(file) {
            Ok(report) => print!("{report}"),
            Err(error) => failures.push(error.to_string()),
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn the_required_scenarios_report_their_verdicts() {
    // Proves the cases come out as stated: link-bound at ≥ 0.95 of its bound,
    // compute-bound with < 2 % streaming cost, a no-fit naming its budgets, MoE runs.
    let report = run_scenario(&scenarios().join("llama3-8b-decode-rtx3060.toml")).unwrap();
    let simulation = report.simulation().unwrap();
    let stagehand = simulation.stagehand.as_ref().unwrap();
    assert!(stagehand.efficiency >= 0.95, "{report}");

    let report = run_scenario(&scenarios().join("flux1-dev-rtx3060.toml")).unwrap();
    let simulation = report.simulation().unwrap();
    let steady = simulation
        .stagehand
        .as_ref()
        .unwrap()
        .run
        .steady_step_seconds;
    assert!(steady / simulation.fit.compute_seconds < 1.02, "{report}");

    let report = run_scenario(&scenarios().join("llama3-70b-12gb-hdd-tight.toml")).unwrap();
    let simulation = report.simulation().unwrap();
    assert!(!simulation.fits && simulation.stagehand.is_none());
    assert!(
        simulation.failure_messages[0].contains("vram_budget 5 GiB is 3.41 GiB short"),
        "{:?}",
        simulation.failure_messages
    );

    let report = run_scenario(&scenarios().join("mixtral-8x7b-rtx3060.toml")).unwrap();
    assert!(report.simulation().unwrap().stagehand.is_some());

    let report = run_scenario(&scenarios().join("llama3-8b-failed-read.toml")).unwrap();
    match &report.outcome {
        ScenarioOutcome::RunFailed { message, released } => {
            assert!(*released, "{message}");
            assert!(message.contains("seed 6"), "{message}");
        }
        other => panic!("expected a failed run, got {other:?}"),
    }
}

#[test]
fn an_unmet_expectation_prints_expected_got_and_seed() {
    // Proves a failing scenario is an error whose message says what was expected,
    // what was got, and the seed to reproduce it.
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("too-hopeful.toml");
    std::fs::write(
        &path,
        "model = \"llama3-8b\"\nhardware = \"rtx3060-12gb\"\nsteps = 3\nseed = 42\nbaselines = false\n[expect]\nfits = true\nbottleneck = \"compute\"\nefficiency_min = 0.95\n",
    )
    .unwrap();
    let error = run_scenario(&path).unwrap_err();
    let HarnessError::Unmet(report) = &error else {
        panic!("expected unmet expectations, got {error}");
    };
    let failed: Vec<&str> = report
        .failed_checks()
        .map(|check| check.name.as_str())
        .collect();
    assert_eq!(failed, ["bottleneck"]);
    let message = error.to_string();
    assert!(
        message.contains("seed 42")
            && message.contains("expected Compute, got Link")
            && message.contains("FAILED"),
        "{message}"
    );
}

#[test]
fn bad_scenarios_name_the_file_and_the_key() {
    // Proves a typo in a scenario is refused with the file and the key, not ignored.
    let folder = tempfile::tempdir().unwrap();
    let path = folder.path().join("typo.toml");
    std::fs::write(
        &path,
        "model = \"llama3-8b\"\nhardware = \"rtx3060-12gb\"\n[settings]\nprefetch_dept = 2\n",
    )
    .unwrap();
    let message = run_scenario(&path).unwrap_err().to_string();
    assert!(
        message.contains("typo.toml") && message.contains("prefetch_dept"),
        "{message}"
    );
    std::fs::write(
        &path,
        "model = \"llama3-8b\"\nhardware = \"rtx3060-12gb\"\n[expect]\nefficency_min = 0.9\n",
    )
    .unwrap();
    let message = run_scenario(&path).unwrap_err().to_string();
    assert!(message.contains("efficency_min"), "{message}");
}
