//! Flux against diffusers: `tests/fixtures/flux` holds tiny FluxTransformer2DModels
//! diffusers built (seeded, bf16 weights), their inputs and what diffusers computed
//! (`scripts/make-flux-fixtures.py`). Sampled streamed under half the model from the
//! same initial latent, stagehand's sigmas, first velocity and final latent agree with
//! diffusers' within the stated tolerance, and the original layout of the same
//! weights gives the same bits as the diffusers folder. With a LoRA
//! (`tests/fixtures/flux/lora`, `scripts/make-flux-lora-fixtures.py`: a PEFT adapter
//! as diffusers saves one and a kohya one, each loaded by diffusers' own loader) the
//! same holds on both layouts, streamed and resident alike.

#[path = "flux/support.rs"]
mod support;

use std::path::{Path, PathBuf};

use stagehand::families::flux::{read_tensors, SampleInput, Start};
use stagehand::lora::LoraSpec;
use stagehand::run::driver::Model;
use stagehand::run::{Outcome, Prepared};

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
        .unwrap_or_else(|| panic!("{variant}/expected.safetensors has no {name}"))
        .2
}

fn input(steps: usize) -> SampleInput {
    SampleInput {
        cond: fixtures().join("cond.safetensors").into(),
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
    let outcome = support::run(&prepared, steps as u64, 0.5);
    assert_eq!(
        outcome.report.verified_steps, steps as u64,
        "streamed = resident"
    );
    let (velocity, latent) = velocity_and_latent(&prepared, &outcome);
    (flux_of(&prepared).sigmas.clone(), velocity, latent)
}

fn flux_of(prepared: &Prepared) -> &stagehand::families::flux::Flux {
    let Model::Flux(flux) = &prepared.workload.model else {
        panic!("not opened as a Flux model");
    };
    flux
}

/// The first step's velocity (packed) and the final latent (unpacked) of `outcome`.
fn velocity_and_latent(prepared: &Prepared, outcome: &Outcome) -> (Vec<f32>, Vec<f32>) {
    let flux = flux_of(prepared);
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
    (velocity, flux.unpack(&support::last_latent(outcome)))
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

/// Largest |a − b|.
fn absolute_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs()))
}

fn expected_lora(name: &str) -> Vec<f32> {
    expected("lora", name)
}

/// The dev fixture with `adapter` at the fixture's strength, sampled 3 steps streamed
/// (weights: a ring of three of the largest block, under the model's bytes) and fully
/// resident, each checked step by step against the run's own reference.
fn with_lora(model: &Path, adapter: &str) -> (Prepared, Outcome, Outcome) {
    let strength = expected_lora("strength")[0];
    let lora = fixtures()
        .join("lora")
        .join(format!("{adapter}.safetensors"));
    let spec = LoraSpec::parse(&format!("{}:{strength}", lora.display())).expect("a spec");
    let prepared = support::prepare(model, input(3), vec![spec]);
    let layout = prepared.facts().layout();
    let regions = prepared.activation_bytes(3) + stagehand::run::lora_region_bytes(&prepared, 1);
    let ring = 3 * layout.largest_block_bytes();
    assert!(ring < layout.total_bytes(), "the ring holds the model");
    let streamed = support::run_within(&prepared, 3, ring + regions);
    let everything = layout.total_bytes() * 2 + regions + (64 << 20);
    let resident = support::run_within(&prepared, 3, everything);
    let plan = &resident.report.plan.vram.resident;
    assert!(plan.iter().all(|r| *r), "the resident run streams");
    let streamed_blocks = streamed
        .report
        .plan
        .vram
        .resident
        .iter()
        .filter(|r| !**r)
        .count();
    assert!(
        2 * streamed_blocks >= layout.blocks.len(),
        "{streamed_blocks} of {} blocks streamed: not well below the model",
        layout.blocks.len()
    );
    for outcome in [&streamed, &resident] {
        assert_eq!(
            outcome.report.verified_steps, 3,
            "{adapter}: unverified steps"
        );
    }
    (prepared, streamed, resident)
}

/// Largest difference allowed between stagehand and diffusers with a LoRA, relative to
/// the largest magnitude of diffusers' output: the base model's [`TOLERANCE`], since
/// the BF16 factors widen exactly and both sides add the update unmerged
/// (`x·Wᵀ + s·(x·Aᵀ)·Bᵀ` in f32, diffusers' PEFT layers as stagehand's low-rank pass).
/// Measured (both layouts alike): the PEFT adapter 1.2e-6 on the first velocity
/// (9.4e-6 max abs), 4.3e-7 on the latent after 3 steps (3.8e-6 max abs); the kohya
/// adapter 2.1e-6 (1.6e-5) and 6.1e-7 (5.2e-6).
const LORA_TOLERANCE: f32 = TOLERANCE;

#[test]
fn flux_dev_with_lora_matches_diffusers_in_both_layouts_and_namings() {
    // Proves a PEFT adapter as diffusers saves it (alpha only in the header's
    // lora_adapter_metadata; pieces of the fused weights with their own A, on every
    // linear) and a kohya adapter (alpha per module, fused qkv, the final modulation's
    // swapped halves) sampled on the BF16 dev fixture in its diffusers and original
    // layouts agree with diffusers' FluxTransformer2DModel with the adapter loaded by
    // load_lora_weights at the same strength; that a run streamed under 0.3 of the
    // model gives the same bits as the fully resident one (a BF16 weight takes its
    // patch low-rank wherever its block is, so no step needs the LoRA tolerance); and
    // that both layouts give the same bits.
    let layouts = [
        fixtures().join("dev/transformer"),
        fixtures().join("dev/original/flux.safetensors"),
    ];
    for adapter in ["peft", "kohya"] {
        let expected_velocity = expected_lora(&format!("velocity_{adapter}"));
        let expected_latent = expected_lora(&format!("latent_{adapter}"));
        let base_latent = expected("dev", "latent");
        let moved = relative_difference(&base_latent, &expected_latent);
        assert!(
            moved > 0.05,
            "{adapter}: the fixture's adapter moves the latent {moved}"
        );
        let mut latents = Vec::new();
        for model in &layouts {
            let case = format!("{adapter} on {}", model.display());
            let (prepared, streamed, resident) = with_lora(model, adapter);
            assert_eq!(
                streamed.report.outputs, resident.report.outputs,
                "{case}: streamed differs from resident"
            );
            assert_eq!(
                streamed.report.tolerance_steps, 0,
                "{case}: a step needed the tolerance"
            );
            let (velocity, latent) = velocity_and_latent(&prepared, &streamed);
            let velocity_relative = relative_difference(&velocity, &expected_velocity);
            let latent_relative = relative_difference(&latent, &expected_latent);
            eprintln!(
                "{case}: velocity {velocity_relative:e} relative ({:e} max abs), latent {latent_relative:e} relative ({:e} max abs)",
                absolute_difference(&velocity, &expected_velocity),
                absolute_difference(&latent, &expected_latent),
            );
            assert!(
                velocity_relative < LORA_TOLERANCE,
                "{case}: velocity differs by {velocity_relative}"
            );
            assert!(
                latent_relative < LORA_TOLERANCE,
                "{case}: latent differs by {latent_relative}"
            );
            latents.push((case, latent));
        }
        let (first_case, first) = &latents[0];
        for (case, latent) in &latents[1..] {
            assert_eq!(latent, first, "{case} differs from {first_case}");
        }
    }
}
