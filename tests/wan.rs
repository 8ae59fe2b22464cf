//! Generated WAN transformers end to end on the CPU backend: the small preset in BF16
//! streamed under a VRAM budget well below the model, every step equal to the fully
//! resident pass bit for bit, moving the bytes its plan says.

use stagehand::actors::Link;
use stagehand::compute::DType;
use stagehand::families::wan::{WanDemo, WanInput, WanPreset};
use stagehand::run::{execute, prepare_with, Budgets, Extras, RunPlan, WorkloadKind};
use stagehand::settings::Settings;

#[test]
fn a_generated_wan_streams_bit_exact_below_its_size() {
    // Proves a generated small WAN (4 blocks of width 128, BF16) computes under a
    // budget of three of its largest blocks what its resident pass computes, bit for
    // bit, each steady step moving the bytes its plan streams, and that its velocity
    // is finite and not zero.
    let dir = tempfile::tempdir().unwrap();
    let demo = WanDemo {
        preset: WanPreset::Small,
        dtype: DType::Bf16,
        seed: 42,
    };
    let model = demo.write(dir.path()).expect("writes");
    let config = WanPreset::Small.config();
    let input = WanInput::seeded(&config, [3, 8, 8], 20);
    let extras = Extras::default().with(input);
    let settings = Settings::default();
    let prepared =
        prepare_with(&model, WorkloadKind::Auto, 1, &settings, false, &extras).expect("opens");
    let layout = prepared.facts().layout();
    let weights = 3 * layout.largest_block_bytes();
    assert!(weights < layout.total_bytes(), "the ring holds the model");
    let budgets = Budgets {
        vram_budget_bytes: weights + prepared.activation_bytes(3),
        pin_ceiling_bytes: 64 << 20,
    };
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, 3)
    };
    let outcome = execute(&prepared, plan).expect("runs");
    assert_eq!(outcome.report.verified_steps, 3, "streamed = resident");
    let streamed = outcome.report.steady_bytes_per_step(Link::PinnedToVram);
    let planned = outcome.report.plan.vram.streamed_bytes_per_step as f64;
    assert!(planned > 0.0, "nothing streams");
    assert_eq!(streamed, planned, "moved vs planned");
    let velocity = outcome.report.outputs.values().next().expect("an output");
    assert_eq!(velocity.len(), 16 * 3 * 8 * 8);
    assert!(velocity.iter().all(|v| v.is_finite()) && velocity.iter().any(|v| v.abs() > 0.01));
}
