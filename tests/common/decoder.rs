//! Generated decoder folders, and the run plan the decoder tests run them under.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use stagehand::actors::{Observer, ResidencyPolicy};
use stagehand::compute::DType;
use stagehand::families::llama::{write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset};
use stagehand::run::{Budgets, RunPlan};
use stagehand::settings::Settings;

/// A VRAM budget for the tiny Llama (f32) that holds every block resident (3.02 MiB)
/// beside a spare ring of 3 × 709 KiB, so resident layers can turn into streamed
/// ones, and room for about one KV page beside the first one (128 KiB: 64 tokens × 4
/// layers × 2 × 64 f32), which the plan leaves free: a growing KV cache makes
/// weights give way.
pub const KV_GROWTH_BUDGET: u64 = 5_450_000 + 64 * 4 * 2 * 64 * 4;

/// A tiny `arch` decoder in `dtype`, seeded with `seed`, written to `dir`.
pub fn tiny_decoder(dir: &Path, arch: DecoderArch, dtype: DType, seed: u64) -> PathBuf {
    let demo = DecoderDemo {
        arch,
        preset: DecoderPreset::Tiny,
        dtype,
        seed,
        shard_bytes: 1 << 30,
    };
    write_decoder_folder(dir, &demo).unwrap()
}

/// `steps` tokens under `vram` bytes of VRAM and a 64 MiB pin ceiling, prefetch depth
/// 2, the planned residency, reporting to `observer`.
pub fn decoder_plan(
    settings: &Settings,
    vram: u64,
    steps: u64,
    observer: Arc<dyn Observer>,
) -> RunPlan<'_> {
    RunPlan {
        settings,
        budgets: Budgets {
            vram_budget_bytes: vram,
            pin_ceiling_bytes: 64 << 20,
        },
        prefetch_depth: 2,
        policy: ResidencyPolicy::Planned,
        steps,
        stop: Arc::new(AtomicBool::new(false)),
        observer,
        on_step: Box::new(|_, _| {}),
        fail_after_reads: None,
        keep_outputs: false,
        on_token: None,
        measure_links: false,
        shared: None,
    }
}
