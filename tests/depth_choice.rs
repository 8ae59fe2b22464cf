//! A run chooses its prefetch depth when the user set none: the deepest (up to the
//! default 2) that fits the VRAM budget, instead of refusing a budget a smaller depth
//! fits; an explicit depth stays exact; a budget no depth fits is refused naming the
//! least budget, the one at depth 0.

mod common;

use common::decoder::tiny_decoder;
use stagehand::compute::DType;
use stagehand::families::llama::DecoderArch;
use stagehand::run::{prepare, WorkloadKind};
use stagehand::settings::Settings;

/// The least VRAM budget of the decoder's plan at `depth`, with the KV cache of a
/// 3-token generation after its prompt (the prompt "hi": up to three tokens).
fn minimum(prepared: &stagehand::run::Prepared, depth: u32) -> u64 {
    let (minimum, _) =
        prepared.plan_minimum_bytes(depth, stagehand::actors::ResidencyPolicy::Planned);
    minimum + prepared.activation_bytes(3)
}

fn generate(model: &std::path::Path, budget: u64, depth: Option<u32>) -> std::process::Output {
    let mut command = common::stagehand();
    command
        .arg("generate")
        .arg("--model")
        .arg(model)
        .args(["--prompt", "hi", "--max-tokens", "3", "--vram-budget"])
        .arg(format!("{budget}B"));
    if let Some(depth) = depth {
        command.args(["--prefetch-depth", &depth.to_string()]);
    }
    command.output().expect("stagehand runs")
}

#[test]
fn an_unset_depth_is_the_deepest_the_budget_fits() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = tiny_decoder(dir.path(), DecoderArch::Llama, DType::F32, 3);
    let prepared = prepare(
        &model,
        WorkloadKind::Decoder,
        1,
        &Settings::default(),
        false,
    )
    .expect("the decoder opens");
    let (depth0, depth1, depth2) = (
        minimum(&prepared, 0),
        minimum(&prepared, 1),
        minimum(&prepared, 2),
    );
    assert!(
        depth0 < depth1 && depth1 < depth2,
        "{depth0} {depth1} {depth2}"
    );

    // Between the depth-1 and depth-2 minimums: depth 1 is chosen, and said.
    let output = generate(&model, depth1, None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("prefetch depth 1: the deepest the vram budget"),
        "{stderr}"
    );

    // The same budget with the depth given: exact, so refused, naming depth 1.
    let output = generate(&model, depth1, Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--prefetch-depth 1"), "{stderr}");

    // Below the depth-0 minimum no depth fits: refused naming the least budget.
    let output = generate(&model, depth0 - 1, None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("prefetch_depth 0"), "{stderr}");
}
