//! Inputs that used to hang `stagehand` (spinning, and deaf to SIGTERM) now end on
//! their own: a run of models with tiny blocks, a staging ring too large to pin, a
//! FIFO where a file belongs, a huge step count. Each command runs under a watchdog
//! that fails the test instead of hanging the suite.

mod common;

use std::path::Path;

use common::process::{output_within_deadline, shell_status};
use common::{assert_bad_input, stagehand, write_safetensors};
use safetensors::Dtype;

fn stream_verify(model: &Path, vram_budget: &str) -> std::process::Output {
    output_within_deadline(stagehand().args([
        "run",
        "--device",
        "cpu",
        "--model",
        &model.to_string_lossy(),
        "--workload",
        "stream-verify",
        "--quiet",
        "--steps",
        "2",
        "--vram-budget",
        vram_budget,
    ]))
}

fn assert_verified(output: &std::process::Output, what: &str) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(shell_status(output.status), 0, "{what}: {stderr}");
    assert!(
        stdout.contains("vram 0 B pinned 0 B held"),
        "{what}: every budget released: {stdout}"
    );
}

#[test]
fn stream_verify_of_models_with_tiny_blocks_finishes() {
    // Proves a model of one 1-, 4- or two 16-byte tensors streams and verifies: the
    // end-of-run calibration used to make 128 MiB / block size copies (134 million
    // for one byte) and never finished.
    let dir = tempfile::tempdir().expect("temp dir");
    let cases: [(&str, &[common::Spec<'_>]); 3] = [
        ("one-byte", &[("w", Dtype::U8, &[1])]),
        ("four-bytes", &[("w", Dtype::U8, &[4])]),
        (
            "two-sixteen",
            &[
                ("layers.0.w", Dtype::U8, &[16]),
                ("layers.1.w", Dtype::U8, &[16]),
            ],
        ),
    ];
    for (name, tensors) in cases {
        let path = dir.path().join(format!("{name}.safetensors"));
        write_safetensors(&path, tensors, None);
        assert_verified(&stream_verify(&path, "64KiB"), name);
    }
}

#[test]
fn stream_verify_of_twenty_thousand_one_byte_blocks_finishes() {
    // Proves a model of 20,000 one-byte blocks streams and verifies (it hung in the
    // calibration and the checksum pass).
    let dir = tempfile::tempdir().expect("temp dir");
    let names: Vec<String> = (0..20_000)
        .map(|layer| format!("layers.{layer}.w"))
        .collect();
    let tensors: Vec<(&str, Dtype, &[usize])> = names
        .iter()
        .map(|name| (name.as_str(), Dtype::U8, &[1usize][..]))
        .collect();
    let path = dir.path().join("many.safetensors");
    write_safetensors(&path, &tensors, None);
    assert_verified(&stream_verify(&path, "8MiB"), "20,000 blocks");
}

#[test]
fn a_staging_ring_too_large_to_pin_is_refused_at_start() {
    // Proves `--fast-disk --staging-buffer-size 64GiB` exits 2 naming the ring and the
    // RAM it can have, instead of warning and then waiting forever for a buffer.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let output = output_within_deadline(stagehand().args([
        "run",
        "--device",
        "cpu",
        "--model",
        &model.to_string_lossy(),
        "--quiet",
        "--fast-disk",
        "--staging-buffer-size",
        "64GiB",
    ]));
    assert_bad_input(&output, &["staging ring", "staging_buffer_size"]);
}

fn fifo(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    let text = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(text.as_ptr(), 0o600) }, 0, "mkfifo");
    path
}

#[test]
fn a_fifo_given_as_a_lora_file_is_refused_at_once() {
    // Proves `--lora FIFO` exits 2 saying what the path is, instead of blocking in
    // open() until a writer appears.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let pipe = fifo(dir.path(), "adapter.safetensors");
    let output = output_within_deadline(stagehand().args([
        "run",
        "--device",
        "cpu",
        "--model",
        &model.to_string_lossy(),
        "--quiet",
        "--lora",
        &pipe.to_string_lossy(),
    ]));
    assert_bad_input(&output, &["FIFO"]);
}

#[test]
fn a_fifo_or_an_unwritable_trace_path_is_refused_before_any_step() {
    // Proves `--trace` to a FIFO with no reader, or into a folder that does not exist,
    // exits 2 at start (no summary: no step ran), instead of hanging or failing after
    // every step ran.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let pipe = fifo(dir.path(), "trace.json");
    let missing = dir.path().join("no-such-folder").join("trace.json");
    for trace in [pipe, missing] {
        let output = output_within_deadline(stagehand().args([
            "run",
            "--device",
            "cpu",
            "--model",
            &model.to_string_lossy(),
            "--quiet",
            "--trace",
            &trace.to_string_lossy(),
        ]));
        assert_bad_input(&output, &["trace.json"]);
        assert!(output.stdout.is_empty(), "no step ran, no summary");
    }
}

#[test]
fn a_huge_simulated_step_count_is_refused() {
    // Proves `simulate --steps <huge>` exits 2 stating the limit instead of running
    // for days.
    let output = output_within_deadline(stagehand().args([
        "simulate",
        "--model",
        "llama3-8b",
        "--hardware",
        "rtx4090",
        "--steps",
        "18446744073709551615",
    ]));
    assert_bad_input(&output, &["--steps", "10000"]);
}

#[test]
fn a_lora_run_at_a_budget_just_above_the_model_finishes() {
    // Proves `run --lora` at a VRAM budget just above the 4 MiB model (every block
    // resident, no spare ring) computes its steps: the adapter's VRAM region used to
    // take the room of the last resident block, which then waited forever.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let lora = common::lora::lora_file(dir.path(), "l.safetensors", &Default::default());
    for budget in ["4100KiB", "4300KiB"] {
        let output = output_within_deadline(stagehand().args([
            "run",
            "--device",
            "cpu",
            "--model",
            &model.to_string_lossy(),
            "--lora",
            &lora.to_string_lossy(),
            "--steps",
            "3",
            "--vram-budget",
            budget,
        ]));
        assert_verified(&output, budget);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            stdout.contains("linear-stack, 3 steps"),
            "{budget}: {stdout}"
        );
    }
}

#[test]
fn a_four_block_lora_run_at_the_automatic_budget_or_65_to_71_kib_finishes() {
    // Proves the 4-block, 64-wide linear stack with the demo adapter computes its
    // steps at the automatic budget and at every budget of 65..=71 KiB (each of
    // which hung in the first step before the adapter's regions had room planned
    // beside the blocks): a run ends verified, under the watchdog.
    use stagehand::lora::{write_demo_lora, DemoLora};
    use stagehand::model::demo::{write_linear_stack, DemoSpec};
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = DemoSpec {
        blocks: 4,
        layers_per_block: 1,
        dim: 64,
        seed: 7,
    };
    let model = write_linear_stack(&dir.path().join("linear"), &spec).expect("model");
    let lora = dir.path().join("lora.safetensors");
    write_demo_lora(&lora, &spec, &DemoLora::default()).expect("adapter");
    let budgets: Vec<Option<String>> = std::iter::once(None)
        .chain((65..=71).map(|kib| Some(format!("{kib}KiB"))))
        .collect();
    for budget in budgets {
        let mut command = stagehand();
        command.args([
            "run",
            "--device",
            "cpu",
            "--model",
            &model.to_string_lossy(),
            "--lora",
            &lora.to_string_lossy(),
            "--steps",
            "3",
            "--quiet",
        ]);
        if let Some(budget) = &budget {
            command.args(["--vram-budget", budget]);
        }
        let output = output_within_deadline(&mut command);
        let what = budget.as_deref().unwrap_or("the automatic budget");
        assert_verified(&output, what);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("linear-stack, 3 steps"), "{what}: {stdout}");
    }
}
