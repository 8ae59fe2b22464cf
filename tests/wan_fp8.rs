//! ComfyUI's scaled-FP8 WAN transformer files against diffusers:
//! `tests/fixtures/wan_fp8` (`scripts/make-wan-fp8-fixtures.py`) holds the tiny A14B
//! experts of `tests/fixtures/wan_comfy` with their Linear weights quantised as
//! ComfyUI's `*_fp8_scaled` files are (F8_E4M3, a per-tensor F32 `scale_weight` of
//! amax/448, a `scale_input` of 1, the `scaled_fp8` marker), one with every Linear in
//! F8_E5M2, and the velocity diffusers' `WanTransformer3DModel` computes from each
//! file's weights dequantised as ComfyUI dequantises them (`fp8 × scale` in f32).

mod common;

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use stagehand::families::flux::read_tensors;
use stagehand::families::wan::WanInput;
use stagehand::pipeline::{generate_video, PipelineError, PipelineRun, VideoFiles, WanParts};
use stagehand::run::WorkloadKind;
use stagehand::run::{execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunPlan};
use stagehand::settings::Settings;

use common::wan::{fixtures, pipeline, seeded_request as request};

/// Largest difference allowed, relative to the largest magnitude of diffusers'
/// velocity. Both sides compute in f32 from the same dequantised weights (each FP8
/// code widened exactly, times its F32 scale: one f32 rounding, the same on both
/// sides); what differs is the summation order (the patch embedding a Conv3d there,
/// a product here), as in `tests/wan_reference.rs`, whose bound this is. An FP8
/// weight read without its scale is off by the whole quantisation (the E4M3 expert's
/// velocity is 2.5e-2 of its largest from the BF16 expert's; unscaled weights are
/// orders of magnitude off), far outside it.
const TOLERANCE: f32 = 1e-4;

/// Steps each run computes (the second finds its blocks where the first left them).
const STEPS: u64 = 2;

const PREFIX: &str = "model.diffusion_model.";

fn fp8(name: &str) -> PathBuf {
    fixtures().join("wan_fp8").join(name)
}

const HIGH_E4M3: &str = "wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors";
const LOW_E4M3: &str = "wan2.2_t2v_low_noise_tiny_fp8_scaled.safetensors";
const HIGH_E5M2: &str = "wan2.2_t2v_high_noise_tiny_fp8_e5m2_all_linears.safetensors";

/// The tensor `name` of expected.safetensors, with its shape.
fn expected(name: &str) -> (Vec<usize>, Vec<f32>) {
    let (_, shape, values) = read_tensors(&fp8("expected.safetensors"))
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("expected.safetensors has no {name}"));
    (shape, values)
}

fn input() -> WanInput {
    let (shape, latent) = expected("latent");
    WanInput {
        latent,
        frames: shape[2],
        height: shape[3],
        width: shape[4],
        timestep: expected("timestep").1[0],
        context: expected("encoder_hidden_states").1,
        guidance: None,
        condition: None,
        first_frame: None,
    }
}

fn prepare(model: &Path) -> Result<Prepared, String> {
    let extras = Extras::default().with(input());
    prepare_with(
        model,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .map_err(|error| error.to_string())
}

/// Runs `prepared` for [`STEPS`] under `weights_bytes` of VRAM for weights.
fn run_within(prepared: &Prepared, weights_bytes: u64) -> Outcome {
    let settings = Settings::default();
    let budgets = Budgets {
        vram_budget_bytes: weights_bytes + prepared.activation_bytes(STEPS),
        pin_ceiling_bytes: 64 << 20,
    };
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, STEPS)
    };
    execute(prepared, plan).expect("runs")
}

/// Largest |a − b|, and that over the largest |b|.
fn differences(a: &[f32], b: &[f32]) -> (f32, f32) {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    let absolute = a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    (absolute, absolute / scale)
}

#[test]
fn scaled_fp8_experts_match_diffusers_on_their_dequantised_weights() {
    // Proves an E4M3 file as ComfyUI writes it (blocks' Linears, under
    // model.diffusion_model.) and an E5M2 one with every Linear quantised compute
    // diffusers' velocity of the dequantised weights within the tolerance, streamed
    // under less than the model equal to resident bit for bit, and that the FP8 weights
    // move at their stored bytes (less than the BF16 expert's).
    let bf16 = prepare(&fixtures().join("wan_comfy/wan2.2_t2v_high_noise_tiny.safetensors"))
        .expect("the BF16 expert opens");
    let bf16_bytes = bf16.facts().layout().total_bytes();
    for (file, velocity_name) in [(HIGH_E4M3, "velocity_e4m3"), (HIGH_E5M2, "velocity_e5m2")] {
        let prepared = prepare(&fp8(file)).expect("the FP8 expert opens");
        let layout = prepared.facts().layout();
        assert!(
            layout.total_bytes() < bf16_bytes,
            "{file}: {} bytes streamed, the BF16 expert's {bf16_bytes}",
            layout.total_bytes()
        );
        // The FP8 blocks are small beside the BF16 embedders (the largest block): two
        // of those, what a prefetch of one needs, is less than the model.
        let largest = layout.largest_block_bytes();
        let streamed_budget = 2 * largest + largest / 8;
        assert!(
            streamed_budget < layout.total_bytes(),
            "{file}: nothing to stream"
        );
        let streamed = run_within(&prepared, streamed_budget);
        let resident = run_within(&prepared, 2 * layout.total_bytes());
        assert!(
            streamed.report.plan.vram.resident.iter().any(|r| !r),
            "{file}: the streamed budget keeps every block"
        );
        for outcome in [&streamed, &resident] {
            assert_eq!(outcome.report.verified_steps, STEPS, "{file}: unverified");
        }
        assert_eq!(
            streamed.report.outputs, resident.report.outputs,
            "{file}: streamed differs from resident"
        );
        let velocity = streamed.report.outputs.values().next().expect("an output");
        let (absolute, relative) = differences(velocity, &expected(velocity_name).1);
        eprintln!("{file}: velocity {absolute:e} max abs, {relative:e} relative");
        assert!(
            relative < TOLERANCE,
            "{file}: velocity differs by {relative}"
        );
    }
}

/// The other parts as files, the low-noise expert `model_2`.
fn files(dir: &Path, model_2: PathBuf) -> VideoFiles {
    let umt5 = dir.join("umt5_xxl_tiny.safetensors");
    std::fs::copy(pipeline().join("text_encoder/model.safetensors"), &umt5).expect("copies");
    VideoFiles {
        model_2: Some(model_2),
        umt5: Some(umt5),
        umt5_tokenizer: Some(pipeline().join("tokenizer")),
        vae: Some(pipeline().join("vae")),
        scheduler: Some(pipeline().join("scheduler/scheduler_config.json")),
    }
}

#[test]
fn the_fp8_experts_make_a_video() {
    // Proves `video` runs end to end from the two scaled-FP8 expert files, each expert
    // taking its steps of the boundary 0.875, into finite frames; its latent is printed
    // beside the BF16 files' (quantisation moves it: no reference for the difference).
    let dir = tempfile::tempdir().expect("a temporary folder");
    let settings = Settings::default();
    let run = PipelineRun::quiet(&settings);
    let parts = WanParts::locate(&fp8(HIGH_E4M3), &files(dir.path(), fp8(LOW_E4M3)))
        .expect("the FP8 files");
    let video = generate_video(&parts, &request(), &run).expect("the FP8 files' video");
    let comfy = fixtures().join("wan_comfy");
    let bf16_parts = WanParts::locate(
        &comfy.join("wan2.2_t2v_high_noise_tiny.safetensors"),
        &files(
            dir.path(),
            comfy.join("wan2.2_t2v_low_noise_tiny.safetensors"),
        ),
    )
    .expect("the BF16 files");
    let bf16 = generate_video(&bf16_parts, &request(), &run).expect("the BF16 files' video");
    let steps = |video: &stagehand::pipeline::Video| -> Vec<u64> {
        (video.stages.iter())
            .map(|stage| stage.outcome.report.steps)
            .collect()
    };
    assert_eq!(steps(&video), steps(&bf16));
    assert_eq!(video.frames.len(), 5);
    assert!(video.latent.iter().all(|value| value.is_finite()));
    let (absolute, relative) = differences(&video.latent, &bf16.latent);
    eprintln!("FP8 experts' latent vs BF16's: {absolute:e} max abs, {relative:e} relative");
}

/// A safetensors file's header entries (name → dtype, shape, data) and metadata.
struct Tensors {
    metadata: Value,
    list: Vec<(String, String, Vec<usize>, Vec<u8>)>,
}

fn read_raw(path: &Path) -> Tensors {
    let bytes = std::fs::read(path).expect("reads");
    let length = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Map<String, Value> = serde_json::from_slice(&bytes[8..8 + length]).expect("json");
    let data = &bytes[8 + length..];
    let mut list = Vec::new();
    let mut metadata = Value::Null;
    for (name, entry) in header {
        if name == "__metadata__" {
            metadata = entry;
            continue;
        }
        let offsets: Vec<usize> =
            serde_json::from_value(entry["data_offsets"].clone()).expect("offsets");
        let shape: Vec<usize> = serde_json::from_value(entry["shape"].clone()).expect("shape");
        let dtype = entry["dtype"].as_str().expect("dtype").to_string();
        list.push((name, dtype, shape, data[offsets[0]..offsets[1]].to_vec()));
    }
    Tensors { metadata, list }
}

fn write_raw(path: &Path, tensors: &Tensors) {
    let mut header = Map::new();
    header.insert("__metadata__".into(), tensors.metadata.clone());
    let mut offset = 0usize;
    for (name, dtype, shape, data) in &tensors.list {
        let entry = serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + data.len()]});
        header.insert(name.clone(), entry);
        offset += data.len();
    }
    let text = serde_json::to_vec(&Value::Object(header)).expect("json");
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(text);
    tensors
        .list
        .iter()
        .for_each(|(.., data)| bytes.extend(data));
    std::fs::write(path, bytes).expect("writes");
}

/// The E4M3 high-noise expert, edited by `edit`, written into `dir`.
fn edited(dir: &Path, name: &str, edit: impl FnOnce(&mut Tensors)) -> PathBuf {
    let mut tensors = read_raw(&fp8(HIGH_E4M3));
    edit(&mut tensors);
    let path = dir.join(name);
    write_raw(&path, &tensors);
    path
}

fn position(tensors: &Tensors, name: &str) -> usize {
    let full = format!("{PREFIX}{name}");
    (tensors.list.iter())
        .position(|(found, ..)| *found == full)
        .unwrap_or_else(|| panic!("no {full}"))
}

#[test]
fn fp8_files_without_a_reference_are_refused_by_name() {
    // Proves an FP8 weight without its scale, a scale of two values, an FP8 patch
    // embedding (a Conv3d ComfyUI casts without a scale) and weights of another format
    // than the marker's are refused before anything runs, naming the tensor as the
    // file does; and that the family refuses the first when the file is opened alone.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let scale = "blocks.0.self_attn.q.scale_weight";
    let unscaled = edited(dir.path(), "unscaled.safetensors", |tensors| {
        let at = position(tensors, scale);
        tensors.list.remove(at);
    });
    let two_scales = edited(dir.path(), "two_scales.safetensors", |tensors| {
        let at = position(tensors, scale);
        tensors.list[at].2 = vec![2];
        tensors.list[at].3 = [1f32, 1f32].iter().flat_map(|v| v.to_le_bytes()).collect();
    });
    let conv = edited(dir.path(), "fp8_conv.safetensors", |tensors| {
        let at = position(tensors, "patch_embedding.weight");
        let elements: usize = tensors.list[at].2.iter().product();
        tensors.list[at].1 = "F8_E4M3".into();
        tensors.list[at].3 = vec![0x38; elements];
        let scale = 1f32.to_le_bytes().to_vec();
        let name = format!("{PREFIX}patch_embedding.scale_weight");
        tensors.list.push((name, "F32".into(), vec![], scale));
    });
    let marker = edited(dir.path(), "e5m2_marker.safetensors", |tensors| {
        let at = position(tensors, "scaled_fp8");
        tensors.list[at].1 = "F8_E5M2".into();
    });
    let cases = [
        (&unscaled, ["`blocks.0.self_attn.q.weight`", "no scale"]),
        (&two_scales, ["`blocks.0.self_attn.q.scale_weight`", "[2]"]),
        (&conv, ["`patch_embedding.weight` is F8_E4M3", "Conv3d"]),
        (&marker, ["is F8_E4M3 but the marker", "F8_E5M2"]),
    ];
    let low = fixtures().join("wan_comfy/wan2.2_t2v_low_noise_tiny.safetensors");
    for (file, words) in cases {
        let error = WanParts::locate(file, &files(dir.path(), low.clone()))
            .expect_err("refused")
            .to_string();
        for word in words {
            assert!(error.contains(word), "{}: {error}", file.display());
        }
        eprintln!("{error}");
    }
    let as_model_2 = WanParts::locate(&fp8(HIGH_E4M3), &files(dir.path(), unscaled.clone()));
    assert!(
        matches!(&as_model_2, Err(PipelineError::Layout { path, .. }) if *path == unscaled),
        "--model-2 is checked too"
    );
    let alone = prepare(&unscaled).err().expect("the family refuses it");
    assert!(alone.contains("no scale"), "{alone}");
}
