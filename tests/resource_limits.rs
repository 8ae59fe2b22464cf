//! Sizes a user gives that cannot fit are refused before anything is allocated: exit
//! 2 with the limit, never an abort (SIGABRT) from a failed allocation.

mod common;

use common::process::output_within_deadline;
use common::{assert_bad_input, stagehand};

#[test]
fn a_batch_too_large_for_memory_is_refused_with_the_largest_that_fits() {
    // Proves `run --batch <huge>` exits 2 naming the batch, what it needs, what the
    // machine can spare and the largest batch that fits, instead of aborting.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    for batch in ["100000000000", "18446744073709551615"] {
        let output = output_within_deadline(stagehand().args([
            "run",
            "--device",
            "cpu",
            "--quiet",
            "--model",
            &model.to_string_lossy(),
            "--batch",
            batch,
        ]));
        assert_bad_input(&output, &["--batch"]);
    }
}

#[test]
fn a_lora_rank_above_the_width_is_refused_before_the_model_is_written() {
    // Proves `demo-model --lora-rank <huge>` exits 2 naming the rank and the width,
    // and writes nothing (it aborted allocating the factors).
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("out");
    let output = output_within_deadline(stagehand().args([
        "demo-model",
        "--out",
        &out.to_string_lossy(),
        "--blocks",
        "1",
        "--dim",
        "8",
        "--lora-out",
        &out.join("adapter.safetensors").to_string_lossy(),
        "--lora-rank",
        "100000000000",
    ]));
    assert_bad_input(&output, &["rank 100000000000", "width 8"]);
    assert!(!out.exists(), "nothing written");
}
