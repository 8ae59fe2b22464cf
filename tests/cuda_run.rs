#![cfg(feature = "cuda")]
//! `execute_cuda`, the `--device cuda` run: the one run path with the CUDA adapters.
//! Without a GPU: a clean bad-input error naming `--device cpu`. With
//! `STAGEHAND_GPU_TESTS=1` on a GPU machine: the demo model streamed under a budget
//! through the real session, every step equal bit for bit to the fully-resident run on
//! the same GPU (the driver checks it); stream-verify against the file; a LoRA within
//! its tolerance of the merged weights; the MoE model through the expert cache; a
//! generated BERT encoder in f32/f16/bf16, equal to its resident pass on the GPU and
//! close to the CPU backend's embeddings; generated Llama (bf16, FP8) and Mixtral
//! decoders, likewise.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use bytesize::ByteSize;
use common::decoder::tiny_decoder;
use stagehand::actors::{Link, ResidencyPolicy};
use stagehand::compute::DType;
use stagehand::device::cuda;
use stagehand::families::bert::{write_bert_folder, BertDemo, BertPreset};
use stagehand::families::llama::DecoderArch;
use stagehand::lora::{write_demo_lora, DemoLora, LoraSpec};
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::model::demo_moe::{write_moe_model, MoeSpec};
use stagehand::run::{
    execute, execute_cuda, execute_cuda_with, no_observer, prepare, prepare_with, resolve_budgets,
    CudaOutcome, CudaRunOptions, Extras, Outcome, Prepared, RunError, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;

/// GPU tests one at a time: they read the driver's memory figures.
static GPU: Mutex<()> = Mutex::new(());

/// The lock for a GPU test (they are `#[ignore]`d unless asked for). Asked for without
/// STAGEHAND_GPU_TESTS=1 or without a device is a failure: a GPU check must not pass
/// by skipping.
fn gpu_tests() -> Option<MutexGuard<'static, ()>> {
    if std::env::var("STAGEHAND_GPU_TESTS").as_deref() != Ok("1") {
        // GPU tests are #[ignore]d: reaching here means they were asked for
        // (--include-ignored) without saying there is a GPU. Passing would hide that.
        panic!(
            "GPU test run without STAGEHAND_GPU_TESTS=1: set it on a machine with a CUDA device"
        );
    }
    let count = cuda::device_count().unwrap_or(0);
    assert!(count > 0, "STAGEHAND_GPU_TESTS=1 but no CUDA device");
    Some(GPU.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

fn plan(settings: &Settings, model_bytes: u64, steps: u64, is_demo: bool) -> RunPlan<'_> {
    RunPlan {
        settings,
        budgets: resolve_budgets(settings, model_bytes, is_demo),
        prefetch_depth: settings.prefetch_depth,
        policy: ResidencyPolicy::Planned,
        steps,
        stop: Arc::new(AtomicBool::new(false)),
        observer: no_observer(),
        on_step: Box::new(|_, _| {}),
        fail_after_reads: None,
        keep_outputs: false,
        on_token: None,
        measure_links: false,
        shared: None,
    }
}

fn demo(dir: &Path, spec: &DemoSpec) -> PathBuf {
    write_linear_stack(dir, spec).expect("demo model")
}

fn run(prepared: &Prepared, plan: RunPlan<'_>) -> CudaOutcome {
    execute_cuda_with(prepared, plan, CudaRunOptions::default())
        .unwrap_or_else(|error| panic!("cuda run: {error}"))
}

/// `model` streamed under 40 % of its bytes (at least a ring of two of its largest
/// blocks, prefetching one ahead; plus one step's activations with `activations`):
/// `gpu_steps` on the GPU, checked clean and moving weights every steady step, then
/// one step on the CPU backend, both keeping their outputs.
///
/// Depth 1, not the default 2: the CUDA weight arena is whole 2 MiB driver pages, and a
/// ring of three of the tiny f32 BERT's blocks (2.27 MiB) only fits in 4 MiB, more
/// than the 3.85 MiB model, so nothing would stream.
fn gpu_and_cpu_at_40_percent(
    model: &Path,
    batch: usize,
    gpu_steps: u64,
    activations: bool,
    name: &str,
) -> (CudaOutcome, Outcome) {
    let probe = prepare(
        model,
        WorkloadKind::Auto,
        batch,
        &Settings::default(),
        false,
    )
    .unwrap();
    let layout = probe.workload.layout();
    let ring = 2 * layout.largest_block_bytes().div_ceil(256) * 256;
    let mut budget = ((layout.total_bytes() as f64 * 0.4) as u64).max(ring);
    if activations {
        budget += probe.activation_bytes(1);
    }
    let settings = Settings {
        vram_budget: Some(ByteSize::b(budget)),
        prefetch_depth: 1,
        ..Settings::default()
    };
    let prepared = prepare(model, WorkloadKind::Auto, batch, &settings, false).unwrap();
    let plan = |steps| RunPlan {
        keep_outputs: true,
        ..plan(&settings, layout.total_bytes(), steps, false)
    };
    let gpu = run(&prepared, plan(gpu_steps));
    assert_clean(&gpu, gpu_steps);
    // Weights cross the link every steady step: ring blocks, or for Mixtral (whose
    // dense layers may all fit) the experts the cache misses.
    let moved = gpu.outcome.report.steady_bytes_per_step(Link::PinnedToVram);
    assert!(moved > 0.0, "{name}: streams ({moved} B per steady step)");
    let cpu = execute(&prepared, plan(1)).unwrap_or_else(|error| panic!("cpu run: {error}"));
    (gpu, cpu)
}

/// What every GPU run must show: steps verified, budgets back at zero, the driver's
/// VRAM figure for the weights within budget + headroom.
fn assert_clean(run: &CudaOutcome, steps: u64) {
    let report = &run.outcome.report;
    println!(
        "steps {:?} s, device compute {:?} s, bound {:.4} s ({}), vram {:?}",
        report.step_seconds,
        report.compute_seconds,
        run.outcome.bound.seconds(),
        run.outcome.bound.limited_by(),
        run.vram
    );
    assert_eq!(report.verified_steps, steps);
    assert_eq!(report.stats.vram.used_bytes, 0, "VRAM budget released");
    assert_eq!(report.stats.pinned.used_bytes, 0, "pinned budget released");
    assert_eq!(run.vram.used_bytes_per_step.len() as u64, steps);
    assert!(run.vram.within_budget_and_headroom, "{:?}", run.vram);
    assert!(run.outcome.device.starts_with("cuda:0"));
}

#[test]
fn without_a_gpu_the_cuda_run_is_bad_input_naming_device_cpu() {
    // Proves `--device cuda` on a machine without CUDA ends as exit-2 input error that
    // says to use the CPU backend, never a panic or a run failure.
    if cuda::device_count().is_ok_and(|count| count > 0) {
        println!("a CUDA device is present: the no-GPU path is not exercised here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec {
        blocks: 2,
        layers_per_block: 1,
        dim: 16,
        seed: 3,
    };
    let model = demo(dir.path(), &spec);
    let settings = Settings::default();
    let prepared = prepare(&model, WorkloadKind::Auto, 2, &settings, true).unwrap();
    for attempt in 0..2 {
        match execute_cuda(&prepared, plan(&settings, spec.total_bytes(), 2, true)) {
            Err(RunError::MissingCapability {
                capability,
                message,
                ..
            }) => {
                println!("attempt {attempt}: {message}");
                assert_eq!(capability, "cuda");
                assert!(message.contains("--device cpu"), "{message}");
                assert!(message.contains("--device cuda"), "{message}");
            }
            Err(other) => panic!("expected a missing capability, got: {other:?}"),
            Ok(_) => panic!("a CUDA run succeeded on a machine without a CUDA device"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_the_demo_model_streams_bit_for_bit_equal_to_its_resident_run() {
    // Proves the real path on the default demo model: streamed under 40 % of its size,
    // every step equal bit for bit to the fully-resident pass on the same GPU (the
    // driver fails the run otherwise), bytes crossing to VRAM each step, device
    // compute measured, every budget released, VRAM within budget + headroom.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec::default();
    let model = demo(dir.path(), &spec);
    let settings = Settings::default();
    let prepared = prepare(&model, WorkloadKind::LinearStack, 64, &settings, true).unwrap();
    let run = run(&prepared, plan(&settings, spec.total_bytes(), 3, true));
    assert_clean(&run, 3);
    let report = &run.outcome.report;
    assert_eq!(report.tolerance_steps, 0, "checked bit for bit");
    assert!(
        report.plan.vram.streamed_bytes_per_step > 0,
        "the demo must stream"
    );
    assert!(report.stats.link(Link::PinnedToVram).model_bytes > 0);
    assert!(report.compute_seconds.iter().all(|seconds| *seconds > 0.0));
    assert!(run.link.pinned_h2d_bytes_per_second > 0.0);
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_stream_verify_checks_every_block_on_the_device() {
    // Proves stream-verify on the GPU: every block's device checksum equals the file's
    // over several streamed steps.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim: 512,
        seed: 5,
    };
    let model = demo(dir.path(), &spec);
    // A non-demo run without --vram-budget takes the device's budget: set one so this
    // streams.
    let settings = Settings {
        vram_budget: Some(ByteSize::b(spec.total_bytes() * 2 / 5)),
        ..Settings::default()
    };
    let prepared = prepare(&model, WorkloadKind::StreamVerify, 1, &settings, false).unwrap();
    let run = run(&prepared, plan(&settings, spec.total_bytes(), 3, false));
    assert_clean(&run, 3);
    assert!(run.outcome.report.plan.vram.streamed_bytes_per_step > 0);
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_a_lora_streams_low_rank_within_tolerance_of_the_merged_weights() {
    // Proves LoRA on the GPU: resident layers bake the adapter in VRAM (merge kernel),
    // streamed layers apply it low-rank (two thin GEMMs), and every step is within the
    // stated tolerance of the merged-weights reference computed on the same GPU.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 16 blocks of 512 KiB: 40 % leaves room for the adapter's packs beside the ring.
    let spec = DemoSpec {
        blocks: 16,
        layers_per_block: 2,
        dim: 256,
        seed: 7,
    };
    let model = demo(dir.path(), &spec);
    let adapter = dir.path().join("adapter.safetensors");
    write_demo_lora(&adapter, &spec, &DemoLora::default()).unwrap();
    let settings = Settings::default();
    let extras = Extras {
        loras: vec![LoraSpec {
            path: adapter,
            strength: 1.0,
        }],
        ..Extras::default()
    };
    let prepared = prepare_with(
        &model,
        WorkloadKind::LinearStack,
        16,
        &settings,
        true,
        &extras,
    )
    .unwrap();
    let run = run(&prepared, plan(&settings, spec.total_bytes(), 3, true));
    assert_clean(&run, 3);
    let report = &run.outcome.report;
    assert!(
        report.tolerance_steps > 0,
        "streamed layers took the low-rank path"
    );
    assert!(
        report.stats.pinned_to_vram.lora_bytes > 0,
        "LoRA packs crossed"
    );
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_the_moe_model_streams_experts_through_the_cache() {
    // Proves the MoE family on the GPU: experts acquired in router order through the
    // expert cache, every token bit for bit equal to its resident pass.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = MoeSpec::default();
    let model = write_moe_model(dir.path(), &spec).expect("moe model");
    let settings = Settings::default();
    let prepared = prepare(&model, WorkloadKind::Moe, 4, &settings, true).unwrap();
    let bytes = prepared.index.total_bytes();
    let run = run(&prepared, plan(&settings, bytes, 4, true));
    assert_clean(&run, 4);
    let report = &run.outcome.report;
    assert!(report.expert_hits + report.expert_misses > 0);
    assert_eq!(report.tolerance_steps, 0, "checked bit for bit");
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_a_generated_bert_encoder_embeds_like_the_cpu_backend() {
    // Proves the BERT family on the GPU (embedding gathers, LayerNorm, attention with
    // the padding mask, GELU, weights cast from f32, f16 and bf16): most layers stream
    // under 40 % of the model, every step equals the resident pass on the GPU bit for
    // bit, and the embeddings agree with the CPU backend's within 1e-4.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        let demo = BertDemo {
            preset: BertPreset::Tiny,
            dtype,
            ..BertDemo::default()
        };
        let model = write_bert_folder(&dir.path().join(dtype.to_string()), &demo).unwrap();
        let (gpu, cpu) = gpu_and_cpu_at_40_percent(&model, 4, 3, false, &dtype.to_string());
        let (gpu_outputs, cpu_outputs) = (&gpu.outcome.report.outputs, &cpu.report.outputs);
        assert!(!cpu_outputs.is_empty());
        for (key, expected) in cpu_outputs {
            let got = &gpu_outputs[key];
            assert_eq!(got.len(), expected.len());
            let worst = got
                .iter()
                .zip(expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            println!("{dtype}: embeddings {key}: largest difference from the cpu {worst:.3e}");
            assert!(worst <= 1e-4, "{dtype}: {worst} from the cpu's embeddings");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_a_budget_larger_than_the_device_is_bad_input() {
    // Proves --vram-budget above what the device can give is refused up front, naming
    // the knob, and no session starts.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec {
        blocks: 2,
        layers_per_block: 1,
        dim: 64,
        seed: 9,
    };
    let model = demo(dir.path(), &spec);
    let settings = Settings {
        vram_budget: Some(ByteSize::tib(64)),
        ..Settings::default()
    };
    let prepared = prepare(&model, WorkloadKind::LinearStack, 2, &settings, true).unwrap();
    match execute_cuda(&prepared, plan(&settings, spec.total_bytes(), 2, true)) {
        Err(RunError::BadSetting { key, message }) => {
            assert_eq!(key, "vram_budget");
            assert!(message.contains("--vram-budget"), "{message}")
        }
        Err(other) => panic!("expected a refused setting: {other:?}"),
        Ok(_) => panic!("a 64 TiB budget was accepted"),
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_generated_decoders_decode_like_the_cpu_backend() {
    // Proves the decoder families on the GPU (RoPE, grouped-query attention over the
    // KV cache in the device tier, SwiGLU, the tied head; bf16 and FP8 weights widened
    // on the device; Mixtral's experts through the expert cache): layers stream under
    // 40 % of the model, every token's logits equal the GPU's resident pass bit for
    // bit, and the prefill logits agree with the CPU backend's within 1e-3 of their
    // scale.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    for (arch, dtype) in [
        (DecoderArch::Llama, DType::Bf16),
        (DecoderArch::Llama, DType::F8E4M3),
        (DecoderArch::Mixtral, DType::F32),
    ] {
        let name = format!("{arch:?}-{dtype}");
        let model = tiny_decoder(&dir.path().join(&name), arch, dtype, 11);
        let (gpu, cpu) = gpu_and_cpu_at_40_percent(&model, 1, 6, true, &name);
        let (key, expected) = cpu.report.outputs.iter().next().expect("prefill logits");
        let got = &gpu.outcome.report.outputs[key];
        assert_eq!(got.len(), expected.len());
        let scale = expected
            .iter()
            .fold(1f32, |top, value| top.max(value.abs()));
        let worst = got
            .iter()
            .zip(expected)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        println!("{name}: prefill logits: largest difference from the cpu {worst:.3e} (scale {scale:.3})");
        assert!(
            worst <= 1e-3 * scale,
            "{name}: {worst} from the cpu's logits"
        );
    }
}
