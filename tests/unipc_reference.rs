//! The UniPC flow scheduler against diffusers' `UniPCMultistepScheduler`: the same
//! sigmas and timesteps, and the same samples step after step when fed the velocities
//! diffusers was fed (fixtures written by scripts/make-unipc-fixtures.py).

use std::path::{Path, PathBuf};

use serde_json::Value;
use stagehand::families::wan::scheduler::{read_unipc, UniPc};

fn fixture(case: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/unipc")
        .join(case)
}

fn floats(value: &Value) -> Vec<f32> {
    value
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| v.as_f64().expect("a number") as f32)
        .collect()
}

/// Replays one case; returns the largest difference of a sample from diffusers'
/// over the largest magnitude of that sample.
fn replay(case: &str) -> f32 {
    let dir = fixture(case);
    let config = read_unipc(&dir.join("scheduler_config.json")).expect("the config reads");
    let record: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("steps.json")).expect("steps.json"))
            .expect("JSON");
    let steps = record["steps"].as_u64().expect("steps") as usize;
    let mut solver = UniPc::new(config, steps);
    assert_eq!(
        solver.sigmas(),
        floats(&record["sigmas"]).as_slice(),
        "{case}: sigmas"
    );
    let timesteps: Vec<i64> = record["timesteps"]
        .as_array()
        .expect("timesteps")
        .iter()
        .map(|t| t.as_i64().expect("int"))
        .collect();
    assert_eq!(
        solver.timesteps(),
        timesteps.as_slice(),
        "{case}: timesteps"
    );
    let mut sample = floats(&record["start"]);
    let mut worst = 0.0f32;
    for (step, (output, expected)) in record["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .zip(record["samples"].as_array().expect("samples"))
        .enumerate()
    {
        // The velocity diffusers saw at this step; the sample here follows its own path.
        solver.step(&floats(output), &mut sample).expect("a step");
        let expected = floats(expected);
        let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let difference = sample
            .iter()
            .zip(&expected)
            .fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            difference <= 1e-6 * scale,
            "{case}: step {step} is {difference} from diffusers' (scale {scale})"
        );
        worst = worst.max(difference / scale);
    }
    assert_eq!(solver.steps_taken(), steps);
    let mut spent = sample.clone();
    assert!(
        solver.step(&sample, &mut spent).is_err(),
        "{case}: a step past the schedule is an error"
    );
    worst
}

#[test]
fn wan_22s_scheduler_follows_diffusers() {
    // Proves the published Wan 2.2 config (order 2, bh2, shift 3) gives diffusers'
    // schedule and samples, to float rounding.
    let worst = replay("wan-t2v");
    eprintln!("wan-t2v: worst relative difference {worst:e}");
}

#[test]
fn the_other_orders_and_options_follow_diffusers() {
    // Proves order 3 (a solved 2×2 system), a disabled corrector and bh1 with a
    // sigma_min ending also match.
    for case in ["order3-shift5", "no-corrector", "bh1-sigma-min"] {
        let worst = replay(case);
        eprintln!("{case}: worst relative difference {worst:e}");
    }
}

#[test]
fn configs_that_change_the_math_are_refused_by_name() {
    // Proves a scheduler stagehand does not compute is refused with the key that
    // says so, never run as something else.
    let base: serde_json::Map<String, Value> = serde_json::from_str(
        &std::fs::read_to_string(fixture("wan-t2v").join("scheduler_config.json")).expect("config"),
    )
    .expect("JSON");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let cases = [
        ("use_karras_sigmas", Value::Bool(true), "use_karras_sigmas"),
        ("use_flow_sigmas", Value::Bool(false), "use_flow_sigmas"),
        ("prediction_type", Value::from("epsilon"), "flow_prediction"),
        ("_class_name", Value::from("DDIMScheduler"), "DDIMScheduler"),
        ("solver_p", Value::from("x"), "solver_p"),
        ("a_new_knob", Value::from(1), "a_new_knob"),
        ("solver_type", Value::from("bh1"), "bh1"),
    ];
    for (key, value, named) in cases {
        let mut config = base.clone();
        config.insert(key.to_string(), value);
        let path = dir.path().join("scheduler_config.json");
        std::fs::write(&path, serde_json::to_string(&config).expect("JSON")).expect("write");
        let error = read_unipc(&path).expect_err("refused").to_string();
        assert!(error.contains(named), "{key}: {error}");
    }
}
