//! WAN sampling against diffusers' WanPipeline: the tiny T2V transformer of
//! tests/fixtures/wan samples 4 steps of Wan 2.2's UniPC schedule with classifier-free
//! guidance from a given latent and given prompt and negative prompt states, as one
//! expert and as two (the same weights on both sides of `boundary_ratio` 0.875, the
//! guidance changing from 4.0 to 2.5 at the switch): the final latent agrees with
//! WanPipeline's (`scripts/make-wan-sampling-fixtures.py`), and a streamed run gives
//! the resident run's bits. The same with flow-matching Euler (shift 5) from the same
//! latent and states (`scripts/make-wan-euler-fixtures.py`).

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::families::wan::scheduler::{read_solver, read_unipc, Solver, UniPc};
use stagehand::families::wan::{high_noise_steps, Guidance, WanInput, WanSample};
use stagehand::run::{execute, prepare_with, Budgets, Extras, Outcome, RunPlan, WorkloadKind};
use stagehand::settings::Settings;

/// Relative to the final latent's largest magnitude: f32 both sides, four steps of a
/// velocity that agrees within 4.3e-7 (tests/wan_reference.rs).
const TOLERANCE: f32 = 1e-4;
const STEPS: usize = 4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn tensor(name: &str) -> Vec<f32> {
    tensor_of("sampling", name)
}

/// `name` of tests/fixtures/wan/t2v/`file`.safetensors.
fn tensor_of(file: &str, name: &str) -> Vec<f32> {
    let path = fixtures().join(format!("wan/t2v/{file}.safetensors"));
    read_tensors(&path)
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("{file}.safetensors has no {name}"))
        .2
}

fn solver() -> UniPc {
    let config = read_unipc(&fixtures().join("unipc/wan-t2v/scheduler_config.json"))
        .expect("the scheduler config reads");
    UniPc::new(config, STEPS)
}

/// The share `steps` from `latent` and `solver`, guided at `scale`.
fn sample(latent: Vec<f32>, solver: impl Into<Solver>, (steps, scale): (usize, f32)) -> WanSample {
    WanSample {
        input: WanInput {
            latent,
            frames: 3,
            height: 8,
            width: 6,
            timestep: 0.0,
            context: tensor("context"),
            guidance: Some(Guidance {
                negative: tensor("negative"),
                scale,
            }),
            condition: None,
            first_frame: None,
        },
        solver: solver.into(),
        steps,
    }
}

/// Runs the share under `weights_bytes` for weights (plus its activations); returns
/// the outcome and the latent and solver after it.
fn run(share: &WanSample, weights_bytes: Option<u64>) -> (Outcome, Vec<f32>, Solver) {
    let model = fixtures().join("wan/t2v/transformer");
    let extras = Extras::default().with(share.clone());
    let settings = Settings::default();
    let prepared =
        prepare_with(&model, WorkloadKind::Auto, 1, &settings, false, &extras).expect("opens");
    let layout = prepared.facts().layout();
    let weights = weights_bytes.unwrap_or(2 * layout.total_bytes());
    let budgets = Budgets {
        vram_budget_bytes: weights + prepared.activation_bytes(share.steps as u64),
        pin_ceiling_bytes: 64 << 20,
    };
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, share.steps as u64)
    };
    let outcome = execute(&prepared, plan).expect("runs");
    let velocities = outcome.report.outputs.values().map(Vec::as_slice);
    let (latent, solver) = share.replay(velocities).expect("replays");
    (outcome, latent, solver)
}

fn relative(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

#[test]
fn guided_sampling_matches_wanpipeline_streamed_as_resident() {
    // Proves four guided UniPC steps (both passes under each block's one acquire)
    // end at WanPipeline's latent, and a run streamed under half the model gives the
    // resident run's velocities bit for bit, every step checked.
    let share = sample(tensor("latent"), solver(), (STEPS, 4.0));
    streamed_as_resident(&share, &tensor("guided_final"));
}

/// Runs `share` resident and streamed under half the model: the final latent is
/// `expected` within the tolerance, and the streamed run gives the resident bits.
fn streamed_as_resident(share: &WanSample, expected: &[f32]) {
    let (resident, latent, _) = run(share, None);
    let error = relative(&latent, expected);
    eprintln!(
        "guided sampling: final latent {error:e} of its largest magnitude from WanPipeline's"
    );
    assert!(error < TOLERANCE, "final latent off by {error}");
    let layout_bytes = {
        let extras = Extras::default().with(share.clone());
        let model = fixtures().join("wan/t2v/transformer");
        let prepared = prepare_with(
            &model,
            WorkloadKind::Auto,
            1,
            &Settings::default(),
            false,
            &extras,
        )
        .expect("opens");
        let layout = prepared.facts().layout();
        (layout.total_bytes() / 2).max(3 * layout.largest_block_bytes())
    };
    let (streamed, streamed_latent, _) = run(share, Some(layout_bytes));
    assert!(
        streamed.report.plan.vram.resident.iter().any(|held| !held),
        "some block streams"
    );
    assert_eq!(
        streamed.report.verified_steps, STEPS as u64,
        "every step checked"
    );
    assert_eq!(
        streamed.report.outputs, resident.report.outputs,
        "streamed = resident"
    );
    assert_eq!(streamed_latent, latent);
}

#[test]
fn two_experts_hand_the_solver_over_at_the_boundary() {
    // Proves the A14B hand-over's arithmetic: the high-noise expert takes the steps at
    // or above timestep 875 (2 of 999, 900, 750, 500) at guidance 4.0, the low-noise
    // one the rest at 2.5 from the latent and solver the first left, and the final
    // latent is WanPipeline's with transformer_2 and boundary_ratio 0.875.
    let solver = solver();
    let high = high_noise_steps(
        &solver
            .timesteps()
            .iter()
            .map(|&t| t as f32)
            .collect::<Vec<_>>(),
        0.875,
        1000,
    );
    assert_eq!((solver.timesteps(), high), (&[999, 900, 750, 500][..], 2));
    let (_, latent, solver) = run(&sample(tensor("latent"), solver, (high, 4.0)), None);
    let (_, latent, solver) = run(&sample(latent, solver, (STEPS - high, 2.5)), None);
    assert_eq!(solver.steps_taken(), STEPS);
    let error = relative(&latent, &tensor("experts_final"));
    eprintln!("two experts: final latent {error:e} of its largest magnitude from WanPipeline's");
    assert!(error < TOLERANCE, "final latent off by {error}");
    // One expert at one scale throughout is not that latent: the switch mattered.
    assert!(relative(&tensor("guided_final"), &tensor("experts_final")) > 1e-3);
}

fn euler() -> Solver {
    let path = fixtures().join("euler/wan-t2v/scheduler_config.json");
    read_solver(&path)
        .expect("the scheduler config reads")
        .solver(STEPS)
}

#[test]
fn flow_matching_euler_matches_wanpipeline_streamed_as_resident() {
    // Proves FlowMatchEulerDiscreteScheduler (shift 5, diffusers' twice-shifted
    // schedule) samples four guided steps to WanPipeline's latent, streamed = resident.
    let solver = euler();
    assert_eq!(solver.timesteps(), tensor_of("euler", "timesteps"));
    let Solver::Euler(euler) = &solver else {
        panic!("the config names FlowMatchEulerDiscreteScheduler")
    };
    assert_eq!(euler.sigmas(), tensor_of("euler", "sigmas"));
    let share = sample(tensor("latent"), solver, (STEPS, 4.0));
    streamed_as_resident(&share, &tensor_of("euler", "guided_final"));
}

#[test]
fn flow_matching_euler_hands_over_between_experts() {
    // Proves the Euler sampler's hand-over: the high-noise expert takes the timesteps
    // at or above 875 at guidance 4.0, the low-noise one the rest at 2.5, ending at
    // WanPipeline's latent with transformer_2 and boundary_ratio 0.875.
    let solver = euler();
    let high = high_noise_steps(&solver.timesteps(), 0.875, 1000);
    let expected_high = tensor_of("euler", "timesteps")
        .iter()
        .filter(|&&t| t >= 875.0)
        .count();
    assert_eq!(high, expected_high);
    assert!(
        0 < high && high < STEPS,
        "the boundary falls inside the run"
    );
    let (_, latent, solver) = run(&sample(tensor("latent"), solver, (high, 4.0)), None);
    let (_, latent, solver) = run(&sample(latent, solver, (STEPS - high, 2.5)), None);
    assert_eq!(solver.steps_taken(), STEPS);
    let error = relative(&latent, &tensor_of("euler", "experts_final"));
    eprintln!(
        "Euler, two experts: final latent {error:e} of its largest magnitude from WanPipeline's"
    );
    assert!(error < TOLERANCE, "final latent off by {error}");
}

#[test]
fn euler_options_that_change_the_math_are_refused_by_name() {
    // Proves a FlowMatchEulerDiscreteScheduler option not computed here (dynamic
    // shifting, stochastic sampling, inverted or Karras sigmas, a terminal shift, an
    // unknown key) is refused with the key that says so, never run as plain Euler.
    let path = fixtures().join("euler/wan-t2v/scheduler_config.json");
    let base: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(path).expect("config")).expect("JSON");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let cases = [
        ("use_dynamic_shifting", serde_json::Value::Bool(true)),
        ("stochastic_sampling", serde_json::Value::Bool(true)),
        ("invert_sigmas", serde_json::Value::Bool(true)),
        ("use_karras_sigmas", serde_json::Value::Bool(true)),
        ("shift_terminal", serde_json::Value::from(0.1)),
        ("a_new_knob", serde_json::Value::from(1)),
    ];
    for (key, value) in cases {
        let mut config = base.clone();
        config.insert(key.to_string(), value);
        let path = dir.path().join("scheduler_config.json");
        std::fs::write(&path, serde_json::to_string(&config).expect("JSON")).expect("write");
        let error = read_solver(&path).expect_err("refused").to_string();
        assert!(error.contains(key), "{key}: {error}");
    }
}
