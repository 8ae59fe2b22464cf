//! Flux against diffusers: `tests/fixtures/flux` holds tiny FluxTransformer2DModels
//! diffusers built (seeded, bf16 weights), their inputs and what diffusers computed
//! (`scripts/make-flux-fixtures.py`). Sampled streamed under half the model from the
//! same initial latent, stagehand's sigmas, first velocity and final latent agree with
//! diffusers' within the stated tolerance, and the original layout of the same
//! weights gives the same bits as the diffusers folder.

#[path = "flux/support.rs"]
mod support;

use std::path::{Path, PathBuf};

use stagehand::families::flux::{read_tensors, SampleInput, Start};
use stagehand::run::driver::Model;

/// Largest difference allowed, relative to the largest magnitude of the reference:
/// f32 both sides, different summation orders (measured: dev 5.0e-6 on the first
/// velocity, 3.5e-6 on the latent after 3 steps; schnell 1.5e-6 and 5.9e-7).
const TOLERANCE: f32 = 1e-4;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux")
}

fn expected(variant: &str, name: &str) -> Vec<f32> {
    let tensors =
        read_tensors(&fixtures().join(variant).join("expected.safetensors")).expect("reads");
    tensors
        .into_iter()
        .find(|(found, ..)| found == name)
        .expect("tensor")
        .2
}

fn input(steps: usize) -> SampleInput {
    SampleInput {
        cond: fixtures().join("cond.safetensors"),
        width: 48,
        height: 64,
        steps,
        guidance: None,
        start: Start::Init {
            path: fixtures().join("init.safetensors"),
            strength: None,
            seed: 0,
        },
    }
}

/// Largest |a − b| over the largest |b|.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// Samples `model` (`steps` steps); returns (sigmas, first velocity packed, final
/// latent unpacked).
fn sampled(model: &Path, steps: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let prepared = support::prepare(model, input(steps), Vec::new());
    let Model::Flux(flux) = &prepared.workload.model else {
        panic!("not opened as a Flux model");
    };
    let outcome = support::run(&prepared, steps as u64, 0.5);
    assert_eq!(
        outcome.report.verified_steps, steps as u64,
        "streamed = resident"
    );
    let first = outcome
        .report
        .outputs
        .values()
        .next()
        .expect("a first latent");
    let init = read_tensors(&fixtures().join("init.safetensors"))
        .expect("init")
        .remove(0)
        .2;
    let start = stagehand::families::flux::pack(&init, 16, 4, 3);
    let dt = flux.sigmas[1] - flux.sigmas[0];
    let velocity = first
        .iter()
        .zip(&start)
        .map(|(x1, x0)| (x1 - x0) / dt)
        .collect();
    let latent = flux.unpack(&support::last_latent(&outcome));
    (flux.sigmas.clone(), velocity, latent)
}

#[test]
fn flux_dev_matches_diffusers_in_both_layouts() {
    // Proves the dev transformer (guidance embedder, shifted schedule) agrees with
    // diffusers' FluxTransformer2DModel and FlowMatchEulerDiscreteScheduler: the
    // sigmas, the first step's velocity and the latent after 3 steps; and the
    // original-layout file of the same weights computes the same bits.
    let (sigmas, velocity, latent) = sampled(&fixtures().join("dev/transformer"), 3);
    let sigma_difference = relative_difference(&sigmas, &expected("dev", "sigmas"));
    assert!(sigma_difference < 1e-6, "sigmas {sigmas:?}");
    let velocity_difference = relative_difference(&velocity, &expected("dev", "velocity"));
    let latent_difference = relative_difference(&latent, &expected("dev", "latent"));
    eprintln!("dev: velocity {velocity_difference:e}, latent {latent_difference:e} (relative)");
    assert!(
        velocity_difference < TOLERANCE,
        "velocity differs by {velocity_difference}"
    );
    assert!(
        latent_difference < TOLERANCE,
        "latent differs by {latent_difference}"
    );
    let (_, _, original) = sampled(&fixtures().join("dev/original/flux.safetensors"), 3);
    assert_eq!(
        original, latent,
        "the original layout differs from diffusers'"
    );
}

#[test]
fn flux_schnell_matches_diffusers_unshifted() {
    // Proves the guidance-free (schnell) transformer and the unshifted schedule agree
    // with diffusers after 2 steps.
    let (sigmas, velocity, latent) = sampled(&fixtures().join("schnell/transformer"), 2);
    assert_eq!(sigmas, expected("schnell", "sigmas"));
    let velocity_difference = relative_difference(&velocity, &expected("schnell", "velocity"));
    let latent_difference = relative_difference(&latent, &expected("schnell", "latent"));
    eprintln!("schnell: velocity {velocity_difference:e}, latent {latent_difference:e} (relative)");
    assert!(velocity_difference < TOLERANCE && latent_difference < TOLERANCE);
}
