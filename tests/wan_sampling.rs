//! WAN sampling against diffusers' WanPipeline: the tiny T2V transformer of
//! tests/fixtures/wan samples 4 steps of Wan 2.2's UniPC schedule with classifier-free
//! guidance from a given latent and given prompt and negative prompt states, as one
//! expert and as two (the same weights on both sides of `boundary_ratio` 0.875, the
//! guidance changing from 4.0 to 2.5 at the switch): the final latent agrees with
//! WanPipeline's (`scripts/make-wan-sampling-fixtures.py`), and a streamed run gives
//! the resident run's bits.

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::families::wan::scheduler::{read_unipc, UniPc};
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
    let path = fixtures().join("wan/t2v/sampling.safetensors");
    read_tensors(&path)
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("sampling.safetensors has no {name}"))
        .2
}

fn solver() -> UniPc {
    let config = read_unipc(&fixtures().join("unipc/wan-t2v/scheduler_config.json"))
        .expect("the scheduler config reads");
    UniPc::new(config, STEPS)
}

/// The share `steps` from `latent` and `solver`, guided at `scale`.
fn sample(latent: Vec<f32>, solver: UniPc, (steps, scale): (usize, f32)) -> WanSample {
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
        solver,
        steps,
    }
}

/// Runs the share under `weights_bytes` for weights (plus its activations); returns
/// the outcome and the latent and solver after it.
fn run(share: &WanSample, weights_bytes: Option<u64>) -> (Outcome, Vec<f32>, UniPc) {
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
    let (resident, latent, _) = run(&share, None);
    let error = relative(&latent, &tensor("guided_final"));
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
    let (streamed, streamed_latent, _) = run(&share, Some(layout_bytes));
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
    let high = high_noise_steps(solver.timesteps(), 0.875, 1000);
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
