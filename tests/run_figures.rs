//! The figures a run's summary states are ones a user can trust: the roofline is a
//! bound no step beats (a step faster than the cached one raises it, and the share
//! printed is at most 100 %, with a note and where the roofline came from), and the
//! peak resident set is "ABOVE" what the budgets account for only when the run itself
//! held more — never because the roofline was measured in the same process.

mod common;

use std::path::Path;
use std::process::Output;

use common::demo::small_demo_model;
use common::stagehand;
use stagehand::run::roofline::{unix_now, Machine, Roofline, Rounds, CACHED_ROOFLINE_FILE};

/// `stagehand run` on the small demo model with `args`, its cache in `cache_home`.
fn run(cache_home: &Path, model: &Path, args: &[&str]) -> Output {
    stagehand()
        .env("XDG_CACHE_HOME", cache_home)
        .args(["run", "--device", "cpu", "--log", "warn", "--model"])
        .arg(model)
        .args(args)
        .output()
        .expect("binary runs")
}

fn stdout_of(output: &Output) -> String {
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    stdout
}

/// The summary's `peak RSS` line.
fn peak_rss_line(stdout: &str) -> String {
    let line = stdout.lines().find(|line| line.contains("peak RSS"));
    line.expect("a peak RSS line").to_string()
}

/// A roofline of this machine a thousand times slower than any CPU, measured a minute
/// ago with an optimised build's rounds: every step beats it.
fn far_too_low_roofline() -> Roofline {
    Roofline {
        memory_bytes_per_second: 1e6,
        flops_per_second: 1e6,
        bf16_flops_per_second: 1e6,
        copy_bytes_per_second: 1e6,
        measured_at_unix: unix_now() - 60,
        machine: Machine::this_one(),
        rounds: Rounds::OPTIMISED,
        raised: None,
    }
}

#[test]
fn a_step_faster_than_the_cached_roofline_raises_it_and_reads_at_most_100_percent() {
    // Proves a beaten bound is raised to what the step reached: the share printed is
    // 100 % with a note saying so, the summary says which measurement the roofline is,
    // and the cache keeps the raised figures for the next run.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = small_demo_model(dir.path());
    let cache_home = dir.path().join("cache");
    let cache_dir = cache_home.join("stagehand");
    let too_low = far_too_low_roofline();
    too_low.store(&cache_dir).expect("roofline cached");
    let stdout = stdout_of(&run(&cache_home, &model, &["--steps", "3"]));
    let compute = stdout.lines().find(|line| line.contains("of the roofline"));
    let compute = compute.expect("a compute line").to_string();
    assert!(
        compute.contains("compute at 100 % of the roofline"),
        "{compute}"
    );
    assert!(
        compute.contains("faster than the roofline allowed")
            && compute.contains("raised to what this step reached"),
        "{compute}"
    );
    let efficiency = stdout
        .split("efficiency ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|figure| figure.parse::<f64>().ok())
        .expect("an efficiency");
    assert!(efficiency <= 1.0, "{stdout}");
    assert!(
        stdout.contains("roofline measured ")
            && stdout.contains("best of 5 rounds of 0.25 s")
            && stdout.contains("raised memory bandwidth"),
        "{stdout}"
    );
    let text = std::fs::read_to_string(cache_dir.join(CACHED_ROOFLINE_FILE)).expect("cache");
    let cached: Roofline = serde_json::from_str(&text).expect("cache parses");
    assert!(cached.memory_bytes_per_second > 1e6, "{cached:?}");
    assert!(cached.raised.is_some(), "{cached:?}");
    assert_eq!(cached.measured_at_unix, too_low.measured_at_unix);
}

#[test]
fn measuring_the_roofline_in_the_run_does_not_count_against_the_budgets() {
    // Proves a run that measures the roofline (an empty cache: this build measures it
    // once a process, ~140 MiB of buffers for its copy and bandwidth figures) reports
    // its peak resident set within what its budgets account for.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = small_demo_model(dir.path());
    let stdout = stdout_of(&run(&dir.path().join("cache"), &model, &["--steps", "2"]));
    let line = peak_rss_line(&stdout);
    assert!(line.contains("(within the"), "{line}");
}

#[test]
fn a_run_that_holds_more_than_its_budgets_is_reported_above_them() {
    // Proves "ABOVE" still appears when the run itself holds more than the budgets
    // account for: a batch whose activations (host memory on the CPU backend, outside
    // the VRAM and pinned budgets) are well over the 64 MiB margin.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = small_demo_model(dir.path());
    let args = ["--steps", "1", "--batch", "32768", "--verify", "off"];
    let stdout = stdout_of(&run(&dir.path().join("cache"), &model, &args));
    let line = peak_rss_line(&stdout);
    assert!(line.contains("(ABOVE the"), "{line}");
}
