//! Flux transformers end to end on the CPU backend: generated checkpoints in the three
//! layouts (original, ComfyUI, diffusers), BF16 and FP8, sampled streamed under a VRAM
//! budget well below the model, every step equal to the fully-resident pass bit for
//! bit, and the three layouts of the same weights giving the same latents.

#[path = "flux/support.rs"]
mod support;

use stagehand::compute::DType;
use stagehand::families::flux::FluxPreset;
use support::{generated, input, last_latent, sample, LAYOUTS};

#[test]
fn the_three_layouts_stream_bit_exact_and_give_the_same_latents() {
    // Proves each layout's streamed steps equal its resident pass bit for bit under a
    // budget below the model, and the three layouts of the same weights compute the
    // same latents.
    let dir = tempfile::tempdir().unwrap();
    let mut latents = Vec::new();
    for layout in LAYOUTS {
        let (model, cond) = generated(dir.path(), FluxPreset::Tiny, layout, DType::Bf16);
        let outcome = sample(&model, input(&cond, 3), 0.5);
        assert_eq!(outcome.report.verified_steps, 3, "{layout:?}");
        assert!(
            outcome.report.stats.pinned_to_vram.model_bytes > 0,
            "{layout:?}: nothing streamed"
        );
        latents.push((layout, last_latent(&outcome)));
    }
    let (_, first) = &latents[0];
    assert!(first.iter().all(|v| v.is_finite()) && first.iter().any(|v| v.abs() > 0.1));
    for (layout, latent) in &latents[1..] {
        assert_eq!(latent, first, "{layout:?} differs from the original layout");
    }
}
