//! The simulator's prediction of two models used in turn under one shared budget
//! (issue 24): the leases the broker's ledger settles in, each model's steady step
//! in turn against alone, and what a switch moves.

use stagehand::actors::Lease;
use stagehand::sim::HardwareProfile;
use stagehand::simulate::{simulate_mix, ModelDescription, SimulateOptions};

fn uniform(name: &str, blocks: u64, bytes_per_block: u64) -> ModelDescription {
    let text = format!(
        "name = \"{name}\"\ndtype = \"bf16\"\ntokens_per_step = 1\nblock_count = {blocks}\n\
         bytes_per_block = {bytes_per_block}\nflops_per_token_per_block = 1e9\n"
    );
    ModelDescription::parse(name, "test", &text).unwrap()
}

#[test]
fn two_models_in_turn_settle_in_leases_that_add_up_to_the_shared_budget() {
    // Proves the prediction: each model in use holds what the other leaves above its
    // floor, never more than the budget together, runs no faster than alone, and a
    // switch moves the bytes it plans resident again.
    let first = uniform("embedder", 12, 64 << 20);
    let second = uniform("decoder", 24, 128 << 20);
    let hardware = HardwareProfile::load("rtx3060-12gb").unwrap();
    let both = first.total_bytes() + second.total_bytes();
    let shared = Lease {
        vram_bytes: both * 3 / 4,
        pin_bytes: both,
    };
    let options = SimulateOptions {
        steps: 4,
        baselines: false,
        ..SimulateOptions::default()
    };
    let mix = simulate_mix([&first, &second], &hardware, &options, shared).unwrap();
    for (index, model) in mix.models.iter().enumerate() {
        let other = &mix.models[1 - index];
        assert!(model.active.plus(other.idle).within(shared), "{mix:#?}");
        assert!(model.idle.vram_bytes >= model.floor.vram_bytes, "{mix:#?}");
        assert!(model.active.vram_bytes > model.idle.vram_bytes, "{mix:#?}");
        assert!(
            model.in_turn_step_seconds >= model.alone_step_seconds * 0.999,
            "{mix:#?}"
        );
        assert!(
            model.switch_bytes > 0 && model.switch_seconds > 0.0,
            "{mix:#?}"
        );
    }
}
