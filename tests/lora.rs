//! LoRA end to end on the CPU backend: adapters in both namings loaded against the demo
//! model, baked into resident blocks and applied low-rank on streamed ones, checked
//! against the fully merged reference; bad adapters refused with clear errors.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use stagehand::actors::{BlockId, NoObserver, ResidencyPolicy, Session, SessionConfig};
use stagehand::device::CpuDevice;
use stagehand::lora::{load_adapter, write_demo_lora, DemoLora, LoraError, LoraNaming, LoraSpec};
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::model::ModelIndex;
use stagehand::storage::{open_storage, StorageFile, StorageOptions};
use stagehand::workload::driver::{drive, DriverOptions, LoraPhase, Workload};
use stagehand::workload::linear_stack::LinearStack;
use stagehand::workload::lora_set::LoraSet;

fn spec() -> DemoSpec {
    DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim: 256,
        seed: 7,
    }
}

fn setup() -> (tempfile::TempDir, PathBuf, ModelIndex) {
    let dir = tempfile::tempdir().unwrap();
    let model = write_linear_stack(dir.path(), &spec()).unwrap();
    let index = ModelIndex::open(&model, None).unwrap();
    (dir, model, index)
}

fn lora_file(dir: &Path, name: &str, lora: &DemoLora) -> PathBuf {
    let path = dir.join(name);
    write_demo_lora(&path, &spec(), lora).unwrap();
    path
}

fn session(index: &ModelIndex, vram_budget_bytes: u64) -> Session {
    let layout = index.layout();
    let settings = stagehand::settings::Settings::default();
    let files: Vec<StorageFile> = index
        .files
        .iter()
        .map(|file| StorageFile {
            path: file.path.clone(),
            expected_bytes: file.bytes,
        })
        .collect();
    let storage = open_storage(&files, &StorageOptions::from_settings(&settings), false).unwrap();
    let device = Arc::new(CpuDevice::new(vram_budget_bytes).unwrap());
    let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
    Session::start(
        SessionConfig {
            vram_budget_bytes,
            pin_ceiling_bytes: 3 << 20,
            prefetch_depth: 1,
            staging_buffers: 3,
            fast_disk_chunk_bytes: None,
            policy: ResidencyPolicy::Planned,
            max_reads_in_flight: 2,
        },
        layout,
        order,
        device,
        storage,
        Arc::new(NoObserver),
    )
    .unwrap()
}

fn options(steps: u64) -> DriverOptions {
    DriverOptions {
        steps,
        stop: Arc::new(AtomicBool::new(false)),
        on_step: Box::new(|_, _| {}),
    }
}

fn phase(model: &LinearStack, index: &ModelIndex, from_step: u64, specs: &[LoraSpec]) -> LoraPhase {
    let set = LoraSet::load(model, index, specs).unwrap();
    let reference = model.reference_merged(index, Some(&set)).unwrap();
    LoraPhase {
        from_step,
        set,
        reference,
    }
}

#[test]
fn both_namings_load_to_the_same_factors() {
    // Proves a PEFT and a kohya file of the same factors map to the same base tensors
    // with the same scale, and alpha defaults to the rank without an alpha tensor.
    let (dir, _model, index) = setup();
    let peft = lora_file(dir.path(), "p.safetensors", &DemoLora::default());
    let kohya = lora_file(
        dir.path(),
        "k.safetensors",
        &DemoLora {
            naming: LoraNaming::Kohya,
            ..DemoLora::default()
        },
    );
    let a = load_adapter(&peft, 0.5, "p".into(), &index).unwrap();
    let b = load_adapter(&kohya, 0.5, "k".into(), &index).unwrap();
    assert_eq!(a.targets.len(), 16);
    assert_eq!(a.targets, b.targets);
    assert_eq!(a.targets[0].base, "blocks.0.linear0.weight");
    assert_eq!(a.targets[0].scale(0.5), 0.5 * 16.0 / 8.0);
    let plain = lora_file(
        dir.path(),
        "n.safetensors",
        &DemoLora {
            alpha: None,
            ..DemoLora::default()
        },
    );
    let c = load_adapter(&plain, 1.0, "n".into(), &index).unwrap();
    assert_eq!(c.targets[0].scale(1.0), 1.0);
}

#[test]
fn peft_alpha_comes_from_adapter_config() {
    // Proves PEFT's lora_alpha in adapter_config.json beside the file sets the scale.
    let (dir, _model, index) = setup();
    let sub = dir.path().join("peft");
    let path = lora_file(
        &sub,
        "adapter_model.safetensors",
        &DemoLora {
            alpha: None,
            ..DemoLora::default()
        },
    );
    std::fs::write(
        sub.join("adapter_config.json"),
        r#"{"r": 8, "lora_alpha": 32}"#,
    )
    .unwrap();
    let adapter = load_adapter(&path, 1.0, "a".into(), &index).unwrap();
    assert_eq!(adapter.targets[0].scale(1.0), 4.0);
}

#[test]
fn resident_bake_is_exact_and_streamed_low_rank_is_within_tolerance() {
    // Proves both LoRA paths agree with the fully merged reference within
    // LORA_TOLERANCE — all resident (every block baked) and streaming (low-rank on the
    // ring's blocks) — and LoRA bytes are counted apart: model bytes in VRAM never
    // exceed the model, and LoRA VRAM returns to zero at shutdown.
    let (dir, _model, index) = setup();
    let peft = lora_file(dir.path(), "p.safetensors", &DemoLora::default());
    let kohya = lora_file(
        dir.path(),
        "k.safetensors",
        &DemoLora {
            naming: LoraNaming::Kohya,
            seed: 99,
            every: 3,
            rank: 4,
            ..DemoLora::default()
        },
    );
    let model = LinearStack::from_index(&index, 4).unwrap();
    let specs = [
        LoraSpec::parse(&format!("{}:0.8", peft.display())).unwrap(),
        LoraSpec::parse(&format!("{}:1.5", kohya.display())).unwrap(),
    ];
    let plain_reference = model.reference(&index).unwrap();
    let set = LoraSet::load(&model, &index, &specs).unwrap();
    for (budget, all_resident) in [(8u64 << 20, true), (2560 << 10, false)] {
        let lora = vec![phase(&model, &index, 0, &specs)];
        assert_ne!(lora[0].reference, plain_reference);
        let workload = Workload::LinearStack {
            model: model.clone(),
            reference: plain_reference.clone(),
            lora,
        };
        let report = drive(session(&index, budget), &workload, options(3)).unwrap();
        assert_eq!(report.verified_steps, 3);
        let lora_bytes: u64 = report.lora.adapters.iter().map(|a| a.bytes).sum();
        assert_eq!(lora_bytes, set.bytes());
        // Own accounting: every pack in the offloader's pinned set, a few pack slots
        // in VRAM — not the whole adapter.
        assert_eq!(report.lora.pinned_bytes, lora_bytes);
        assert!(report.lora.vram_bytes > 0 && report.lora.vram_bytes < lora_bytes);
        assert_eq!(
            report.after_first_step.vram.lora_bytes,
            report.lora.vram_bytes
        );
        assert_eq!(report.after_first_step.pinned.lora_bytes, lora_bytes);
        assert!(report.after_first_step.vram.model_bytes <= index.total_bytes());
        assert!(report.stats.vram.peak_used_bytes <= budget);
        assert_eq!(report.stats.vram.used_bytes, 0);
        assert_eq!(report.stats.vram.lora_bytes, 0);
        assert_eq!(report.stats.pinned.lora_bytes, 0);
        let resent_per_step = (report.stats.pinned_to_vram.lora_bytes
            - report.after_first_step.pinned_to_vram.lora_bytes)
            / 2;
        let streamed_pack_bytes: u64 = (0..model.blocks())
            .filter(|&block| !report.plan.vram.resident[block])
            .map(|block| (0..2).map(|a| set.pack_bytes(a, block) as u64).sum::<u64>())
            .sum();
        eprintln!(
            "budget {budget}: lora {lora_bytes} B, vram slots {} B, re-sent {resent_per_step} B/step, planned streamed packs {streamed_pack_bytes} B",
            report.lora.vram_bytes
        );
        if all_resident {
            assert_eq!(report.plan.vram.streamed_bytes_per_step, 0, "all resident");
            assert_eq!(report.tolerance_steps, 0, "every block baked: bit for bit");
            assert_eq!(resent_per_step, 0, "baked once, never re-sent");
        } else {
            assert!(report.plan.vram.streamed_bytes_per_step > 0);
            assert_eq!(report.tolerance_steps, 3, "streamed blocks: low-rank");
            // Factors ride with their blocks: each step re-sends the packs of the
            // blocks that stream (the planned ones, and any resident block the LoRA
            // region displaced), and never more than the adapters hold.
            assert!(resent_per_step >= streamed_pack_bytes, "{resent_per_step}");
            assert!(resent_per_step <= lora_bytes, "{resent_per_step}");
        }
    }
}

#[test]
fn attach_and_detach_during_a_session_rebakes_resident_blocks() {
    // Proves adapters change between steps without restarting the session: steps
    // 0–1 without LoRA (bit-exact), 2–3 with one (merged reference), 4–5 with another,
    // 6 without again (bit-exact: resident copies were dropped and reloaded pristine).
    let (dir, _model, index) = setup();
    let first = lora_file(dir.path(), "a.safetensors", &DemoLora::default());
    let second = lora_file(
        dir.path(),
        "b.safetensors",
        &DemoLora {
            seed: 5,
            every: 2,
            ..DemoLora::default()
        },
    );
    let model = LinearStack::from_index(&index, 4).unwrap();
    let reference = model.reference(&index).unwrap();
    let none = LoraPhase {
        from_step: 0,
        set: LoraSet::default(),
        reference: reference.clone(),
    };
    let lora = [
        none,
        phase(
            &model,
            &index,
            2,
            &[LoraSpec::parse(first.to_str().unwrap()).unwrap()],
        ),
        phase(
            &model,
            &index,
            4,
            &[LoraSpec::parse(second.to_str().unwrap()).unwrap()],
        ),
        LoraPhase {
            from_step: 6,
            set: LoraSet::default(),
            reference: reference.clone(),
        },
    ];
    for budget in [8u64 << 20, 2560 << 10] {
        let workload = Workload::LinearStack {
            model: model.clone(),
            reference: reference.clone(),
            lora: lora
                .iter()
                .map(|p| LoraPhase {
                    from_step: p.from_step,
                    set: p.set.clone(),
                    reference: p.reference.clone(),
                })
                .collect(),
        };
        let report = drive(session(&index, budget), &workload, options(7)).unwrap();
        assert_eq!(report.verified_steps, 7);
        // All resident: every LoRA step is baked, bit for bit; streaming: low-rank.
        let low_rank_steps = if budget == 8 << 20 { 0 } else { 4 };
        assert_eq!(report.tolerance_steps, low_rank_steps);
        assert_eq!(report.lora.attached_total, 2);
        assert_eq!(report.lora.detached_total, 2);
        assert!(report.lora.adapters.is_empty());
        assert_eq!(report.stats.vram.used_bytes, 0);
    }
}

fn write_raw(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), bytes)| {
            (
                name.to_string(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

#[test]
fn bad_adapters_are_refused_with_clear_errors() {
    // Proves shape mismatch, rank 0, NaN, unmatched keys (another model) and an unknown
    // naming each give an error naming the file, the key and the problem.
    let (dir, _model, index) = setup();
    let dim = 256;
    let case = |name: &str, tensors: Vec<(&str, Vec<usize>, Vec<f32>)>| -> LoraError {
        let path = dir.path().join(name);
        write_raw(&path, &tensors);
        load_adapter(&path, 1.0, name.into(), &index).unwrap_err()
    };
    let a = "blocks.0.linear0.lora_A.weight";
    let b = "blocks.0.linear0.lora_B.weight";
    let shape = case(
        "shape.safetensors",
        vec![
            (a, vec![4, 128], vec![0.0; 512]),
            (b, vec![dim, 4], vec![0.0; dim * 4]),
        ],
    );
    assert!(
        shape
            .to_string()
            .contains("does not patch `blocks.0.linear0.weight`"),
        "{shape}"
    );
    let rank = case(
        "rank.safetensors",
        vec![(a, vec![0, dim], vec![]), (b, vec![dim, 0], vec![])],
    );
    assert!(rank.to_string().contains("rank 0"), "{rank}");
    let mut values = vec![0.0; 4 * dim];
    values[17] = f32::NAN;
    let nan = case(
        "nan.safetensors",
        vec![
            (a, vec![4, dim], values),
            (b, vec![dim, 4], vec![0.0; dim * 4]),
        ],
    );
    assert!(
        nan.to_string()
            .contains("non-finite value (NaN) at element 17"),
        "{nan}"
    );
    let other = case(
        "other.safetensors",
        vec![
            (
                "lora_unet_down_blocks_0_attn1_to_q.lora_down.weight",
                vec![4, 8],
                vec![0.0; 32],
            ),
            (
                "lora_unet_down_blocks_0_attn1_to_q.lora_up.weight",
                vec![8, 4],
                vec![0.0; 32],
            ),
        ],
    );
    let text = other.to_string();
    assert!(
        text.contains("1 of 1 LoRA modules match no tensor"),
        "{text}"
    );
    assert!(text.contains("naming guessed: kohya"), "{text}");
    assert!(
        text.contains("lora_unet_down_blocks_0_attn1_to_q"),
        "{text}"
    );
    let unknown = case("plain.safetensors", vec![("weight", vec![2], vec![0.0; 2])]);
    assert!(
        unknown.to_string().contains("no LoRA keys found"),
        "{unknown}"
    );
}

#[test]
fn a_bad_adapter_mid_session_leaves_the_session_running_without_it() {
    // Proves a refused adapter changes nothing: the session keeps running bit-exact
    // without it and every budget returns to zero.
    let (dir, _model, index) = setup();
    let path = dir.path().join("bad.safetensors");
    let mut values = vec![0.0; 4 * 256];
    values[3] = f32::INFINITY;
    write_raw(
        &path,
        &[
            ("blocks.1.linear1.lora_A.weight", vec![4, 256], values),
            (
                "blocks.1.linear1.lora_B.weight",
                vec![256, 4],
                vec![0.0; 1024],
            ),
        ],
    );
    let model = LinearStack::from_index(&index, 4).unwrap();
    let session = session(&index, 2560 << 10);
    let refused = LoraSet::load(
        &model,
        &index,
        &[LoraSpec::parse(path.to_str().unwrap()).unwrap()],
    );
    assert!(refused.is_err());
    assert!(session.lora_usage().unwrap().adapters.is_empty());
    let workload = Workload::LinearStack {
        reference: model.reference(&index).unwrap(),
        model,
        lora: Vec::new(),
    };
    let report = drive(session, &workload, options(2)).unwrap();
    assert_eq!(report.verified_steps, 2);
    assert_eq!(report.stats.vram.used_bytes, 0);
    assert_eq!(report.stats.pinned.used_bytes, 0);
}

#[test]
fn stagehand_run_with_lora_verifies_against_the_merged_reference() {
    // Proves `stagehand run --lora FILE:STRENGTH` (twice) verifies every step and
    // reports LoRA bytes apart from model bytes; a missing file is a clear exit 2.
    let (dir, model, _index) = setup();
    let peft = lora_file(dir.path(), "p.safetensors", &DemoLora::default());
    let kohya = lora_file(
        dir.path(),
        "k.safetensors",
        &DemoLora {
            naming: LoraNaming::Kohya,
            ..DemoLora::default()
        },
    );
    let run = |extra: &[String]| {
        let mut args: Vec<String> = [
            "run",
            "--model",
            model.to_str().unwrap(),
            "--steps",
            "3",
            "--batch",
            "4",
            "--json",
            "--device",
            "cpu",
            "--vram-budget",
            "2560KiB",
            "--pin-ceiling",
            "3MiB",
            "--ram-floor",
            "2GiB",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend_from_slice(extra);
        Command::new(env!("CARGO_BIN_EXE_stagehand"))
            .args(&args)
            .env_remove("STAGEHAND_DEVICE")
            .output()
            .unwrap()
    };
    let output = run(&[
        "--lora".into(),
        format!("{}:0.7", peft.display()),
        "--lora".into(),
        kohya.display().to_string(),
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let summary: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(summary["verified_steps"], 3);
    assert_eq!(summary["lora_tolerance_steps"], 3);
    assert_eq!(summary["lora_adapters"].as_array().unwrap().len(), 2);
    let lora_bytes = summary["lora_bytes"].as_u64().unwrap();
    assert_eq!(lora_bytes, 2 * 16 * 2 * 8 * 256 * 4);
    assert_eq!(summary["lora_pinned_bytes"].as_u64(), Some(lora_bytes));
    let vram_lora_bytes = summary["peak_vram_lora_bytes"].as_u64().unwrap();
    assert!(vram_lora_bytes > 0 && vram_lora_bytes < lora_bytes);
    assert!(summary["lora_bytes_to_vram_per_step"].as_f64().unwrap() > 0.0);
    assert!(
        summary["vram_model_bytes_after_first_step"]
            .as_u64()
            .unwrap()
            <= summary["model_bytes"].as_u64().unwrap()
    );
    assert_eq!(summary["vram_bytes_after_shutdown"], 0);
    let missing = run(&[
        "--lora".into(),
        dir.path().join("nope.safetensors").display().to_string(),
    ]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("nope.safetensors"));
}
