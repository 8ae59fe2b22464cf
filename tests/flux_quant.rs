//! ComfyUI's integer formats for Flux on the CPU backend: generated `int8_tensorwise`
//! and `awq_w4a16` checkpoints sample streamed under a budget well below the model,
//! every step equal to the resident pass bit for bit, at their stored bytes (about ½
//! and ¼ of BF16 plus their scales), their weights within the quantization error of the
//! BF16 checkpoint of the same seeded values.

#[path = "flux/support.rs"]
mod support;

use std::path::Path;

use stagehand::actors::Link;
use stagehand::compute::DType;
use stagehand::families::flux::{FluxPreset, Layout};
use support::{generated, input, last_latent, sample};

/// The tensors of a safetensors file: name → (dtype, shape, bytes).
fn tensors(path: &Path) -> Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let shape = view.shape().to_vec();
            (name, view.dtype(), shape, view.data().to_vec())
        })
        .collect()
}

/// Bytes of the tensors a Flux pass computes with: all but the `comfy_quant`
/// markers (read once, at open) and a ComfyUI file's VAE.
fn computed_bytes(path: &Path) -> u64 {
    tensors(path)
        .iter()
        .filter(|(name, ..)| !name.ends_with(".comfy_quant") && !name.contains("first_stage_model"))
        .map(|(.., data)| data.len() as u64)
        .sum()
}

fn floats(dtype: safetensors::Dtype, data: &[u8]) -> Vec<f32> {
    match dtype {
        safetensors::Dtype::BF16 => DType::Bf16.decode(data),
        safetensors::Dtype::F32 => DType::F32.decode(data),
        other => panic!("{other:?} is no float table"),
    }
}

#[test]
fn int8_and_awq_checkpoints_stream_at_their_stored_bytes_bit_exact() {
    // Proves int8_tensorwise and awq_w4a16 checkpoints (original and ComfyUI layouts)
    // stream bit-exact against their resident passes, move exactly their plans' bytes
    // every steady step, place exactly the bytes stored in the file (nothing widened
    // on any tier), at about ½ and ¼ of BF16, and sample close to the BF16 latents.
    let dir = tempfile::tempdir().unwrap();
    let mut runs = Vec::new();
    for (layout, dtype) in [
        (Layout::Original, DType::Bf16),
        (Layout::Original, DType::I8),
        (Layout::ComfyUi, DType::I8),
        (Layout::Original, DType::U4),
        (Layout::ComfyUi, DType::U4),
    ] {
        let (model, cond) = generated(dir.path(), FluxPreset::Small, layout, dtype);
        let outcome = sample(&model, input(&cond, 2), 0.4);
        assert_eq!(outcome.report.verified_steps, 2, "{layout:?} {dtype}");
        let streamed = outcome.report.steady_bytes_per_step(Link::PinnedToVram);
        let planned = outcome.report.plan.vram.streamed_bytes_per_step as f64;
        // As in the FP8 test: each load counts for the step that uses it and nothing
        // is prefetched past the last step, so the steady step moves its plan.
        assert_eq!(streamed, planned, "{layout:?} {dtype}: moved vs planned");
        assert_eq!(
            outcome.model_bytes,
            computed_bytes(&model),
            "{layout:?} {dtype}: placed bytes are not the stored bytes"
        );
        runs.push((dtype, outcome.model_bytes, planned, last_latent(&outcome)));
    }
    let (_, bf16_bytes, bf16_planned, bf16) = runs[0].clone();
    for (dtype, bytes, planned, latent) in &runs[1..] {
        let model_ratio = *bytes as f64 / bf16_bytes as f64;
        let step_ratio = planned / bf16_planned;
        eprintln!("{dtype}: model {model_ratio:.3} of BF16, planned per step {step_ratio:.3}");
        // int8: 1 byte a weight (BF16's 2) and one F32 scale a layer, BF16 biases and
        // norms. AWQ: ½ byte plus a BF16 scale and zero per 64 (1/16 byte), the few
        // layers of 32 inputs left BF16.
        let expected = match dtype {
            DType::I8 => 0.50..0.52,
            _ => 0.27..0.30,
        };
        assert!(expected.contains(&model_ratio), "{dtype}: {model_ratio}");
        let tolerance = if *dtype == DType::I8 { 0.1 } else { 0.35 };
        let close = latent
            .iter()
            .zip(&bf16)
            .all(|(a, b)| (a - b).abs() < tolerance * (1.0 + b.abs()));
        assert!(close, "{dtype}: far from BF16");
        assert_ne!(latent, &bf16, "{dtype}: computed as BF16?");
    }
    assert_eq!(runs[1].3, runs[2].3, "int8: ComfyUI differs from original");
    assert_eq!(runs[3].3, runs[4].3, "awq: ComfyUI differs from original");
}

#[test]
fn the_quantized_weights_are_within_their_quantization_error_of_the_bf16_ones() {
    // Proves the written int8 (code × scale) and AWQ ((q − 8)·scale + zero) weights,
    // dequantised here as ComfyUI does, agree with the BF16 checkpoint of the same
    // seeded values within the quantization error: half a step (scale/2) plus the
    // BF16 rounding of the reference and of the zero (2⁻⁸ of the largest value).
    let dir = tempfile::tempdir().unwrap();
    let file = |dtype| {
        let (model, _) = generated(dir.path(), FluxPreset::Small, Layout::Original, dtype);
        tensors(&model)
    };
    let (bf16, int8, awq) = (file(DType::Bf16), file(DType::I8), file(DType::U4));
    let find = |list: &[(String, safetensors::Dtype, Vec<usize>, Vec<u8>)], name: &str| {
        list.iter()
            .find(|(tensor, ..)| tensor == name)
            .cloned()
            .unwrap_or_else(|| panic!("{name} missing"))
    };
    let mut layers = 0;
    for (name, _, shape, data) in bf16
        .iter()
        .filter(|(name, ..)| name.ends_with("qkv.weight") || name.ends_with("linear2.weight"))
    {
        let reference = DType::Bf16.decode(data);
        let largest = reference
            .iter()
            .fold(0f32, |most, value| most.max(value.abs()));
        let (rows, cols) = (shape[0], shape[1]);
        let stem = name.trim_end_matches(".weight");
        // int8_tensorwise.
        let (_, dtype, _, codes) = find(&int8, name);
        assert_eq!(dtype, safetensors::Dtype::I8);
        let (_, scale_dtype, _, scale) = find(&int8, &format!("{stem}.weight_scale"));
        let scale = floats(scale_dtype, &scale)[0];
        assert!(
            (scale - largest / 127.0).abs() <= largest / 127.0 * 0.01,
            "{name}"
        );
        for (code, value) in codes.iter().zip(&reference) {
            let dequantised = f32::from(*code as i8) * scale;
            assert!(
                (dequantised - value).abs() <= 0.5 * scale + largest / 256.0,
                "{name}"
            );
        }
        // awq_w4a16.
        let (_, dtype, packed_shape, packed) = find(&awq, name);
        assert_eq!(
            (dtype, packed_shape),
            (safetensors::Dtype::I8, vec![rows, cols / 2])
        );
        let (_, scale_dtype, table_shape, scales) = find(&awq, &format!("{stem}.weight_scale"));
        let (_, zero_dtype, _, zeros) = find(&awq, &format!("{stem}.weight_zeros"));
        assert_eq!(table_shape, vec![cols / 64, rows]);
        let (scales, zeros) = (floats(scale_dtype, &scales), floats(zero_dtype, &zeros));
        for n in 0..rows {
            for k in 0..cols {
                let index = n * cols + k;
                let code = (packed[index / 2] >> (4 * (index % 2))) & 0x0f;
                let at = (k / 64) * rows + n;
                let dequantised = (f32::from(code) - 8.0) * scales[at] + zeros[at];
                let error = (dequantised - reference[index]).abs();
                assert!(
                    error <= 0.5 * scales[at] + largest / 256.0,
                    "{name} [{n}, {k}]: {error}"
                );
            }
        }
        let (_, _, _, json) = find(&awq, &format!("{stem}.comfy_quant"));
        assert_eq!(
            String::from_utf8(json).unwrap(),
            r#"{"format": "awq_w4a16", "group_size": 64}"#
        );
        layers += 1;
    }
    assert_eq!(
        layers,
        2 * 4 + 8,
        "the qkv and linear2 weights of the Small preset"
    );
}

/// `from` rewritten into `to` with every `comfy_quant` JSON replaced by `json`.
fn with_comfy_quant(from: &Path, to: &Path, json: &str) {
    let list = tensors(from);
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = list
        .iter()
        .map(|(name, dtype, shape, data)| {
            let (shape, data) = match name.ends_with(".comfy_quant") {
                true => (vec![json.len()], json.as_bytes()),
                false => (shape.clone(), &data[..]),
            };
            let view = safetensors::tensor::TensorView::new(*dtype, shape, data).unwrap();
            (name.clone(), view)
        })
        .collect();
    let bytes = std::fs::read(from).unwrap();
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let metadata = header.metadata().clone();
    std::fs::write(to, safetensors::serialize(views, metadata).unwrap()).unwrap();
}

#[test]
fn integer_variants_stagehand_does_not_compute_are_refused_by_name() {
    // Proves an int8_tensorwise layer with ConvRot's rotation, an awq_w4a16 layer
    // whose declared group size its tables contradict, and ConvRot's W4A4 format are
    // refused with a one-line error naming what is wrong, before anything runs.
    let dir = tempfile::tempdir().unwrap();
    let (int8, cond) = generated(dir.path(), FluxPreset::Small, Layout::Original, DType::I8);
    let (awq, _) = generated(dir.path(), FluxPreset::Small, Layout::Original, DType::U4);
    let refused = |path: &Path, expected: &str| {
        let extras = stagehand::run::Extras::default().with(input(&cond, 1));
        let settings = stagehand::settings::Settings::default();
        let kind = stagehand::run::WorkloadKind::Auto;
        match stagehand::run::prepare_with(path, kind, 1, &settings, false, &extras) {
            Err(error) if error.is_bad_input() => {
                let message = error.to_string();
                assert!(message.contains(expected), "{message}");
                assert!(!message.contains('\n'), "{message}");
            }
            Err(other) => panic!("{expected}: {other}"),
            Ok(_) => panic!("{expected} was not refused"),
        }
    };
    let convrot = dir.path().join("convrot.safetensors");
    with_comfy_quant(
        &int8,
        &convrot,
        r#"{"format": "int8_tensorwise", "convrot": true}"#,
    );
    refused(&convrot, "convrot");
    let groups = dir.path().join("groups.safetensors");
    with_comfy_quant(
        &awq,
        &groups,
        r#"{"format": "awq_w4a16", "group_size": 32}"#,
    );
    refused(&groups, "groups of 32 inputs");
    let w4a4 = dir.path().join("w4a4.safetensors");
    with_comfy_quant(
        &awq,
        &w4a4,
        r#"{"format": "convrot_w4a4", "linear_dtype": "int4"}"#,
    );
    refused(
        &w4a4,
        "`convrot_w4a4`, a format stagehand does not implement",
    );
}

#[test]
fn a_lora_on_integer_weights_is_refused_by_name() {
    // Proves a kohya adapter on an int8_tensorwise or awq_w4a16 checkpoint is refused
    // at open with a one-line error: resident blocks and the reference bake a patch
    // into the weight, which in int8 codes rounds most of it away (seen: 7e-4 off
    // the low-rank pass at the first step) and in 4-bit groups has no merge.
    use stagehand::families::flux::{write_flux_lora, FluxLoraNaming};
    let dir = tempfile::tempdir().unwrap();
    let lora = dir.path().join("lora.safetensors");
    write_flux_lora(
        &lora,
        &FluxPreset::Small.shape(),
        FluxLoraNaming::Kohya,
        4,
        9,
    )
    .unwrap();
    let spec = stagehand::lora::LoraSpec::parse(&format!("{}:0.8", lora.display())).unwrap();
    for dtype in [DType::I8, DType::U4] {
        let (model, cond) = generated(dir.path(), FluxPreset::Small, Layout::Original, dtype);
        let extras = stagehand::run::Extras {
            loras: vec![spec.clone()],
            ..stagehand::run::Extras::default()
        }
        .with(input(&cond, 1));
        let settings = stagehand::settings::Settings::default();
        let kind = stagehand::run::WorkloadKind::Auto;
        match stagehand::run::prepare_with(&model, kind, 1, &settings, false, &extras) {
            Err(stagehand::run::RunError::BadRequest { field, message, .. }) => {
                assert_eq!(field, "lora", "{message}");
                assert!(message.contains("integer-quantized"), "{dtype}: {message}");
                assert!(!message.contains('\n'), "{message}");
            }
            Err(other) => panic!("{dtype}: not bad input: {other}"),
            Ok(_) => panic!("{dtype}: a LoRA on integer weights was accepted"),
        }
    }
}
