//! `verify = full | first | weights | off`: what each checks, that `weights` catches a
//! block whose bytes changed on their way to the device (and `off` does not), the file
//! checksums kept between runs, and the setting as users give it.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use stagehand::actors::{
    Device, DeviceArena, DeviceError, DevicePtr, HostBuffer, MemoryInfo, MemorySpace, OpFuture,
};
use stagehand::device::{CpuCompute, CpuDevice};
use stagehand::model::{KnownChecksums, ModelIndex};
use stagehand::run::{execute_on, Budgets, Outcome, RunError, RunPlan, WorkloadKind};
use stagehand::settings::{Settings, Verify};

/// The CPU device, but the `corrupt_copy`-th copy of a model block to the device (0:
/// none) lands damaged: a bus or a driver that damaged a block on its way. The damage
/// is the sign bit of every byte of its first KiB, which negates the first weight row
/// whatever the dtype (f32, f16, bf16): a single flipped low byte, as before, could be
/// absorbed by the step's rounding, so `full` (which compares outputs, not bytes)
/// missed it in a CI run (2026-12-07). Copies smaller than a block (LoRA packs) are not counted. Which block the
/// N-th copy carries may differ between runs (reads finish in any order), but every
/// copy is used by a step that runs — none is made for a step that never comes, none
/// gives way unused — so each check that looks at that step sees it.
/// How much of a damaged block is damaged: one 256-wide f32 row of the demo model.
const DAMAGED_BYTES: u64 = 1024;

struct Corrupting {
    inner: CpuDevice,
    copies: AtomicU64,
    corrupt_copy: u64,
    block_bytes: u64,
}

impl Device for Corrupting {
    fn name(&self) -> String {
        self.inner.name()
    }

    fn memory_info(&self) -> Result<MemoryInfo, DeviceError> {
        self.inner.memory_info()
    }

    fn memory_space(&self) -> MemorySpace {
        self.inner.memory_space()
    }

    fn allocate_arena(&self, bytes: u64) -> Result<DeviceArena, DeviceError> {
        self.inner.allocate_arena(bytes)
    }

    fn free_arena(&self, arena: DeviceArena) {
        self.inner.free_arena(arena)
    }

    fn allocate_pinned(&self, bytes: u64) -> Result<HostBuffer, DeviceError> {
        self.inner.allocate_pinned(bytes)
    }

    fn copy_to_device(
        &self,
        source: HostBuffer,
        source_offset: u64,
        bytes: u64,
        destination: DevicePtr,
    ) -> OpFuture<HostBuffer, (DeviceError, HostBuffer)> {
        let copy = self
            .inner
            .copy_to_device(source, source_offset, bytes, destination);
        let corrupt = bytes >= self.block_bytes
            && self.copies.fetch_add(1, Ordering::SeqCst) + 1 == self.corrupt_copy;
        Box::pin(async move {
            let done = copy.await;
            if corrupt && done.is_ok() && bytes > 0 {
                let damaged = bytes.min(DAMAGED_BYTES) as usize;
                let first = destination.0 as *mut u8;
                for offset in 0..damaged {
                    // SAFETY: the CPU device's memory is host memory, the copy of
                    // `bytes` into `destination` has completed, and no one reads the
                    // block until the allocator publishes it, after this resolves.
                    unsafe { *first.add(offset) ^= 0x80 };
                }
            }
            done
        })
    }
}

/// Four steps of the small demo model under VRAM for 3 of its 8 blocks, so blocks
/// land every step, checked as `verify` says; the 10th block copy lands corrupted
/// when `corrupt` is set.
fn run(verify: Verify, corrupt: bool) -> Result<Outcome, RunError> {
    run_with(verify, corrupt, false)
}

/// [`run`], with the demo LoRA adapter (every layer patched) when `lora` is set.
fn run_with(verify: Verify, corrupt: bool, lora: bool) -> Result<Outcome, RunError> {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    run_on(dir.path(), &model, verify, corrupt, lora)
}

/// [`run_with`] on `model`, an adapter (if any) written to `dir`.
fn run_on(
    dir: &Path,
    model: &Path,
    verify: Verify,
    corrupt: bool,
    lora: bool,
) -> Result<Outcome, RunError> {
    let settings = Settings {
        verify: Some(verify),
        ..Settings::default()
    };
    let loras = if lora {
        let adapter = common::lora::lora_file(
            dir,
            "adapter.safetensors",
            &stagehand::lora::DemoLora::default(),
        );
        vec![stagehand::lora::LoraSpec {
            path: adapter,
            strength: 1.0,
        }]
    } else {
        Vec::new()
    };
    let extras = stagehand::families::Extras {
        loras,
        ..Default::default()
    };
    let prepared =
        stagehand::run::prepare_with(model, WorkloadKind::Auto, 2, &settings, false, &extras)
            .expect("prepares");
    let block = prepared.facts().layout().largest_block_bytes();
    let budgets = Budgets {
        // Room for 3 of the 8 blocks (the adapter's regions besides, with one).
        vram_budget_bytes: 3 * block + stagehand::run::lora_region_bytes(&prepared, 2),
        pin_ceiling_bytes: 4 * block,
    };
    let device = Corrupting {
        inner: CpuDevice::new(budgets.vram_budget_bytes).expect("device"),
        copies: AtomicU64::new(0),
        corrupt_copy: if corrupt { 10 } else { 0 },
        block_bytes: prepared
            .facts()
            .layout()
            .blocks
            .iter()
            .map(|block| block.bytes)
            .min()
            .unwrap_or(1),
    };
    execute_on(
        &prepared,
        RunPlan::new(&settings, budgets, 4),
        Arc::new(device),
        &CpuCompute::new(),
    )
}

#[test]
fn each_mode_checks_what_it_says() {
    // Proves what each mode checks: full every step, first one step then landings,
    // weights every landing, off nothing.
    let full = run(Verify::Full, false).expect("full");
    assert_eq!(full.report.verified_steps, 4);
    assert_eq!(full.report.landings_checked, 0);
    let first = run(Verify::First, false).expect("first");
    assert_eq!(first.report.verified_steps, 1);
    assert!(first.report.landings_checked > 0);
    let weights = run(Verify::Weights, false).expect("weights");
    assert_eq!(weights.report.verified_steps, 0);
    // Every block lands at least once; the 5 streamed ones land again each step.
    assert!(
        weights.report.landings_checked >= 8 + 3 * 5,
        "{}",
        weights.report.landings_checked
    );
    let off = run(Verify::Off, false).expect("off");
    assert_eq!(
        (off.report.verified_steps, off.report.landings_checked),
        (0, 0)
    );
}

#[test]
fn a_block_damaged_on_its_way_fails_the_weights_check_and_nothing_else_misses_it() {
    // Proves one damaged copy (the 10th block copy, whichever block it carries) fails
    // the weights, first and full checks alike, and only `off` runs on regardless.
    for verify in [Verify::Weights, Verify::First, Verify::Full] {
        let failed = run(verify, true).err();
        let message = failed.map(|error| error.to_string()).unwrap_or_default();
        assert!(
            message.contains("differ from the file") || message.contains("mismatch"),
            "{verify:?}: {message}"
        );
        assert!(message.contains("every budget was released"), "{message}");
    }
    // Nothing checks with `off`: the run completes on damaged weights, as asked.
    assert!(run(Verify::Off, true).is_ok());
}

#[test]
fn a_second_run_takes_the_kept_checksums_and_a_damaged_cache_costs_a_read_not_a_verdict() {
    // Proves the checksums kept between runs: the first run reads every block's
    // checksum from the file, the second none (and still checks every landing); a
    // damage on the way still fails; and a cache whose checksums are wrong makes the
    // run read the file again and pass, never call a clean landing corrupt.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let blocks = ModelIndex::open(&model, None).expect("index").blocks.len() as u64;
    let first = run_on(dir.path(), &model, Verify::Weights, false, false).expect("first run");
    assert_eq!(first.report.checksums_read_from_files, blocks);
    let second = run_on(dir.path(), &model, Verify::Weights, false, false).expect("second run");
    assert_eq!(second.report.checksums_read_from_files, 0);
    assert_eq!(
        second.report.landings_checked,
        first.report.landings_checked
    );
    let damaged = run_on(dir.path(), &model, Verify::Weights, true, false).err();
    let message = damaged.map(|error| error.to_string()).unwrap_or_default();
    assert!(message.contains("differ from the file"), "{message}");

    let index = ModelIndex::open(&model, None).expect("index");
    let cache = KnownChecksums::cache_file(&stagehand::run::default_cache_dir(), &index);
    let mut kept: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cache).expect("the cache file")).expect("json");
    let sums = kept["blocks"].as_object_mut().expect("blocks");
    assert_eq!(sums.len() as u64, blocks);
    for sum in sums.values_mut() {
        *sum = serde_json::json!(sum.as_u64().expect("a checksum") ^ 1);
    }
    std::fs::write(&cache, serde_json::to_vec(&kept).expect("json")).expect("written");
    let after = run_on(dir.path(), &model, Verify::Weights, false, false).expect("wrong cache");
    assert_eq!(after.report.checksums_read_from_files, blocks);
}

#[test]
fn blocks_an_adapter_patches_are_checked_as_they_land_too() {
    // Proves a LoRA leaves no hole in the weights check: with the demo adapter on
    // every layer, every landing is still checked (a streamed block keeps the file's
    // bytes; a resident one is checked before the adapter is baked into it), a clean
    // run passes, and a block damaged on its way fails the run.
    let clean = run_with(Verify::Weights, false, true).expect("a clean run with a LoRA");
    assert!(
        clean.report.landings_checked >= 8 + 3 * 5,
        "{}",
        clean.report.landings_checked
    );
    let failed = run_with(Verify::Weights, true, true).err();
    let message = failed.map(|error| error.to_string()).unwrap_or_default();
    assert!(message.contains("differ from the file"), "{message}");
}

#[test]
fn the_setting_takes_its_values_and_refuses_others_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    for (value, heading) in [
        ("off", "not verified (verify = off)"),
        ("weights", "checked against the file (verify = weights, "),
        (
            "first",
            "1 verified against the fully-resident reference, then",
        ),
        ("full", "2 verified against the fully-resident reference"),
    ] {
        let output = common::stagehand()
            .args([
                "run", "--device", "cpu", "--steps", "2", "--quiet", "--verify", value, "--model",
            ])
            .arg(&model)
            .output()
            .expect("stagehand runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "{value}: {stdout}");
        assert!(stdout.contains(heading), "{value}: {stdout}");
    }
    let output = common::stagehand()
        .args(["run", "--verify", "sometimes", "--model"])
        .arg(&model)
        .output()
        .expect("stagehand runs");
    common::assert_bad_input(
        &output,
        &["verify", "sometimes", "full, first, weights, off"],
    );
}
