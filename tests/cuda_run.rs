//! `execute_cuda`, the `--device cuda` run path. Without a GPU: a clean bad-input error
//! naming `--device cpu`. With `STAGEHAND_GPU_TESTS=1` on a GPU machine: the demo model
//! streamed under a budget through the real session, every step checked against the
//! CPU backend's reference, and stream-verify against the file.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};

use bytesize::ByteSize;
use stagehand::actors::ResidencyPolicy;
use stagehand::device::cuda::run::{execute_cuda, execute_cuda_with, CudaRunOptions};
use stagehand::device::cuda::{self, DType};
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::run::{no_observer, prepare, resolve_budgets, RunError, RunPlan, WorkloadKind};
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

fn plan(settings: &Settings, model_bytes: u64, steps: u64) -> RunPlan<'_> {
    RunPlan {
        settings,
        budgets: resolve_budgets(settings, model_bytes, true),
        prefetch_depth: settings.prefetch_depth,
        policy: ResidencyPolicy::Planned,
        steps,
        stop: Arc::new(AtomicBool::new(false)),
        observer: no_observer(),
        on_step: Box::new(|_, _| {}),
        fail_after_reads: None,
    }
}

fn demo(dir: &Path, spec: &DemoSpec) -> PathBuf {
    write_linear_stack(dir, spec).expect("demo model")
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
        match execute_cuda(&prepared, plan(&settings, spec.total_bytes(), 2)) {
            Err(RunError::BadInput(message)) => {
                println!("attempt {attempt}: {message}");
                assert!(message.contains("--device cpu"), "{message}");
                assert!(message.contains("--device cuda"), "{message}");
            }
            Err(RunError::Failed(message)) => panic!("expected bad input, got failure: {message}"),
            Ok(_) => panic!("a CUDA run succeeded on a machine without a CUDA device"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: run with STAGEHAND_GPU_TESTS=1 and --include-ignored (scripts/gpu-check.sh does)"]
fn gpu_the_demo_model_streams_and_matches_the_cpu_reference() {
    // Proves the real path on the default demo model: streamed under 40 % of its size,
    // every step within the f32 tolerance of LinearStack::reference, bytes actually
    // crossing to VRAM each step, every budget released, and the driver's VRAM figure
    // within budget + headroom over its pre-weights baseline.
    let Some(_gpu) = gpu_tests() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec::default();
    let model = demo(dir.path(), &spec);
    let settings = Settings::default();
    let prepared = prepare(&model, WorkloadKind::LinearStack, 64, &settings, true).unwrap();
    let run = execute_cuda_with(
        &prepared,
        plan(&settings, spec.total_bytes(), 3),
        CudaRunOptions::default(),
    )
    .unwrap_or_else(|error| panic!("cuda run: {error}"));
    let report = &run.outcome.report;
    println!(
        "steps {:?} s, compute {:?} s, normalised errors {:?} (tolerance {:.0e}), bound {:.4} s ({})",
        report.step_seconds,
        report.compute_seconds,
        run.normalised_errors,
        cuda::tolerance(DType::F32),
        run.outcome.bound.seconds(),
        run.outcome.bound.limited_by()
    );
    println!("vram: {:?}", run.vram);
    assert_eq!(report.verified_steps, 3);
    assert_eq!(run.normalised_errors.len(), 3);
    assert!(run
        .normalised_errors
        .iter()
        .all(|error| *error <= cuda::tolerance(DType::F32)));
    assert!(
        report.plan.vram.streamed_bytes_per_step > 0,
        "the demo must stream"
    );
    assert!(
        report
            .stats
            .link(stagehand::actors::Link::PinnedToVram)
            .model_bytes
            > 0
    );
    assert!(report.compute_seconds.iter().all(|seconds| *seconds > 0.0));
    assert_eq!(report.stats.vram.used_bytes, 0, "VRAM budget released");
    assert_eq!(report.stats.pinned.used_bytes, 0, "pinned budget released");
    assert_eq!(run.vram.used_bytes_per_step.len(), 3);
    assert!(run.vram.within_budget_and_headroom, "{:?}", run.vram);
    assert!(run.link.pinned_h2d_bytes_per_second > 0.0);
    assert!(run.outcome.device.starts_with("cuda:0"));
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
    let mut run_plan = plan(&settings, spec.total_bytes(), 3);
    run_plan.budgets = resolve_budgets(&settings, spec.total_bytes(), false);
    let run = execute_cuda_with(&prepared, run_plan, CudaRunOptions::default())
        .unwrap_or_else(|error| panic!("cuda stream-verify: {error}"));
    assert_eq!(run.outcome.report.verified_steps, 3);
    assert!(run.outcome.report.plan.vram.streamed_bytes_per_step > 0);
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
    match execute_cuda(&prepared, plan(&settings, spec.total_bytes(), 2)) {
        Err(RunError::BadInput(message)) => {
            assert!(message.contains("--vram-budget"), "{message}")
        }
        Err(RunError::Failed(message)) => panic!("expected bad input: {message}"),
        Ok(_) => panic!("a 64 TiB budget was accepted"),
    }
}
