//! Flux transformers end to end on the CPU backend: generated checkpoints in the three
//! layouts (original, ComfyUI, diffusers), BF16 and FP8, sampled streamed under a VRAM
//! budget well below the model, every step equal to the fully-resident pass bit for
//! bit, and the three layouts of the same weights giving the same latents.

#[path = "flux/support.rs"]
mod support;

use stagehand::actors::Link;
use stagehand::compute::DType;
use std::collections::HashMap;
use std::path::Path;

use stagehand::families::flux::{
    write_flux_lora, FluxLoraNaming, FluxPreset, Layout, AXES_METADATA, QUANTIZATION_METADATA,
};
use stagehand::lora::LoraSpec;
use stagehand::run::{prepare_with, Extras, RunError, WorkloadKind};
use support::{generated, input, last_latent, sample, LAYOUTS};

#[test]
fn the_three_layouts_stream_bit_exact_and_give_the_same_latents() {
    // Proves each layout's streamed steps equal its resident pass bit for bit under a
    // budget below the model, and the three layouts of the same weights compute the
    // same latents.
    let dir = tempfile::tempdir().unwrap();
    let mut latents = Vec::new();
    for layout in LAYOUTS {
        let (model, cond) = generated(dir.path(), FluxPreset::Small, layout, DType::Bf16);
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

#[test]
fn fp8_checkpoints_stream_at_their_stored_bytes_bit_exact() {
    // Proves ComfyUI's scaled FP8 (F8_E4M3 with a per-layer scale_weight and the
    // scaled_fp8 marker) streams bit-exact against its resident pass, at 0.50–0.56 of
    // the BF16 checkpoint's bytes and moving its plan's bytes per step, the same in
    // the original and ComfyUI layouts.
    let dir = tempfile::tempdir().unwrap();
    let mut moved = Vec::new();
    let mut latents = Vec::new();
    for (layout, dtype) in [
        (Layout::Original, DType::Bf16),
        (Layout::Original, DType::F8E4M3),
        (Layout::ComfyUi, DType::F8E4M3),
    ] {
        let (model, cond) = generated(dir.path(), FluxPreset::Small, layout, dtype);
        let outcome = sample(&model, input(&cond, 2), 0.4);
        assert_eq!(outcome.report.verified_steps, 2, "{layout:?} {dtype}");
        let streamed = outcome.report.steady_bytes_per_step(Link::PinnedToVram);
        let planned = outcome.report.plan.vram.streamed_bytes_per_step as f64;
        // Each load counts for the step that uses it, no resident block gives way and
        // nothing is prefetched past the last step: the steady step moves its plan.
        assert_eq!(streamed, planned, "{layout:?} {dtype}: moved vs planned");
        moved.push((outcome.model_bytes, streamed));
        latents.push(last_latent(&outcome));
        if dtype == DType::F8E4M3 {
            let bf16 = &latents[0];
            let latent = latents.last().unwrap();
            let close = latent
                .iter()
                .zip(bf16)
                .all(|(a, b)| (a - b).abs() < 0.25 * (1.0 + b.abs()));
            assert!(close, "{layout:?}: FP8 far from BF16");
        }
    }
    assert_eq!(latents[1], latents[2], "FP8: ComfyUI differs from original");
    eprintln!("(model bytes, pinned→vram bytes per steady step): {moved:?}");
    let model_ratio = moved[1].0 as f64 / moved[0].0 as f64;
    let moved_ratio = moved[1].1 / moved[0].1;
    assert!(
        (0.5..0.56).contains(&model_ratio),
        "FP8 model is {model_ratio} of BF16"
    );
    assert!(
        (0.45..0.6).contains(&moved_ratio),
        "FP8 moves {moved_ratio} of BF16"
    );
}

#[test]
fn kohya_and_peft_adapters_stream_against_their_merged_reference() {
    // Proves a kohya adapter on the fused original weights (qkv, linear1; also under
    // ComfyUI's `model.diffusion_model.` prefix) and a PEFT
    // adapter on diffusers' pieces run streamed (low-rank on streamed blocks, baked
    // into resident ones) within the stated tolerance of the merged reference, change
    // the latent, and count their bytes apart from the model's.
    let dir = tempfile::tempdir().unwrap();
    for (layout, naming) in [
        (Layout::Original, FluxLoraNaming::Kohya),
        (Layout::ComfyUi, FluxLoraNaming::Kohya),
        (Layout::Diffusers, FluxLoraNaming::Peft),
    ] {
        // F32 weights: a resident block bakes W + s·B·A rounded to its storage dtype,
        // which for BF16 is coarser than the low-rank tolerance against the merge.
        let (model, cond) = generated(dir.path(), FluxPreset::Small, layout, DType::F32);
        let lora = dir
            .path()
            .join(format!("{}.safetensors", layout.describe()));
        write_flux_lora(&lora, &FluxPreset::Small.shape(), naming, 4, 9).unwrap();
        let spec = LoraSpec::parse(&format!("{}:0.8", lora.display())).unwrap();
        let prepared = support::prepare(&model, input(&cond, 2), vec![spec]);
        let outcome = support::run(&prepared, 2, 0.3);
        let report = &outcome.report;
        assert_eq!(report.verified_steps, 2, "{layout:?}");
        assert!(
            report.tolerance_steps > 0,
            "{layout:?}: no streamed block applied low-rank"
        );
        assert!(
            report.stats.pinned_to_vram.lora_bytes > 0,
            "{layout:?}: LoRA bytes not counted apart"
        );
        let plain = sample(&model, input(&cond, 2), 0.5);
        assert_ne!(
            last_latent(&plain),
            last_latent(&outcome),
            "{layout:?}: the LoRA changed nothing"
        );
    }
}

/// A tensor of a rewritten checkpoint: name, dtype, shape, bytes.
type Raw = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// Rewrites the checkpoint `from` into `to` through `edit`, with `metadata`.
fn rewrite(
    from: &Path,
    to: &Path,
    edit: impl Fn(&mut Vec<Raw>),
    metadata: HashMap<String, String>,
) {
    let bytes = std::fs::read(from).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<Raw> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit(&mut tensors);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data).unwrap();
            (name.clone(), view)
        })
        .collect();
    std::fs::write(to, safetensors::serialize(views, Some(metadata)).unwrap()).unwrap();
}

/// ComfyUI's newer per-layer format: `weight_scale`, `input_scale` and a
/// `comfy_quant` JSON tensor per layer, in place of `scale_weight` and the marker.
fn to_comfy_quant(tensors: &mut Vec<Raw>, format: &str) {
    tensors.retain(|(name, ..)| name != "scaled_fp8");
    let mut added = Vec::new();
    for (name, _, _, data) in tensors.iter_mut() {
        if let Some(layer) = name.strip_suffix(".scale_weight") {
            let layer = layer.to_string();
            *name = format!("{layer}.weight_scale");
            added.push((
                format!("{layer}.input_scale"),
                safetensors::Dtype::F32,
                vec![],
                1f32.to_le_bytes().to_vec(),
            ));
            let json = format!("{{\"format\": \"{format}\"}}").into_bytes();
            added.push((
                format!("{layer}.comfy_quant"),
                safetensors::Dtype::U8,
                vec![json.len()],
                json,
            ));
            let _ = data;
        }
    }
    tensors.extend(added);
}

#[test]
fn comfy_quant_fp8_computes_as_scaled_fp8_and_other_formats_are_refused_by_name() {
    // Proves the newer per-layer format (weight_scale, input_scale, comfy_quant JSON)
    // computes the same bits as the older scaled FP8 of the same values, and a layer
    // declared in a format stagehand does not implement is refused by name, whether
    // by its comfy_quant tensor or by the header's _quantization_metadata.
    let dir = tempfile::tempdir().unwrap();
    let (model, cond) = generated(
        dir.path(),
        FluxPreset::Small,
        Layout::Original,
        DType::F8E4M3,
    );
    let metadata = || {
        HashMap::from([
            ("format".to_string(), "pt".to_string()),
            (AXES_METADATA.to_string(), "[8, 12, 12]".to_string()),
        ])
    };
    let quant = dir.path().join("comfy_quant.safetensors");
    rewrite(
        &model,
        &quant,
        |tensors| to_comfy_quant(tensors, "float8_e4m3fn"),
        metadata(),
    );
    let scaled = last_latent(&sample(&model, input(&cond, 2), 0.4));
    assert_eq!(last_latent(&sample(&quant, input(&cond, 2), 0.4)), scaled);
    let refused = |path: &Path, format: &str| {
        let extras = Extras::default().with(input(&cond, 1));
        let settings = stagehand::settings::Settings::default();
        let Err(RunError::UnsupportedModel { found, message, .. }) =
            prepare_with(path, WorkloadKind::Auto, 1, &settings, false, &extras)
        else {
            panic!("{format} was not refused as unsupported");
        };
        assert_eq!(found, format);
        assert!(
            message.contains(format) && message.contains("does not implement"),
            "{message}"
        );
    };
    let nvfp4 = dir.path().join("nvfp4.safetensors");
    rewrite(
        &model,
        &nvfp4,
        |tensors| to_comfy_quant(tensors, "nvfp4"),
        metadata(),
    );
    refused(&nvfp4, "nvfp4");
    let mxfp8 = dir.path().join("mxfp8.safetensors");
    let mut header = metadata();
    header.insert(
        QUANTIZATION_METADATA.to_string(),
        r#"{"format_version": "1.0", "layers": {"double_blocks.0.img_attn.qkv": {"format": "mxfp8"}}}"#.to_string(),
    );
    rewrite(&model, &mxfp8, |_| {}, header);
    refused(&mxfp8, "mxfp8");
}
