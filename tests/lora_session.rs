//! LoRA end to end on the CPU backend: adapters baked into resident blocks and applied
//! low-rank on streamed ones, checked against the fully merged reference; attached and
//! detached mid-session; a refused adapter leaving the session untouched; and
//! `stagehand run --lora`.

mod common;

use std::process::Command;

use common::lora::{lora_file, options, peft_and_kohya, session, setup, write_f32_tensors};
use stagehand::families::linear_stack::LinearStack;
use stagehand::families::lora_set::LoraSet;
use stagehand::lora::{DemoLora, LoraSpec};
use stagehand::model::ModelIndex;
use stagehand::run::driver::{drive_cpu, LoraPhase, Model, Workload};

fn phase(model: &LinearStack, index: &ModelIndex, from_step: u64, specs: &[LoraSpec]) -> LoraPhase {
    LoraPhase {
        from_step,
        set: model.lora_set(index, specs).unwrap(),
    }
}

fn workload(model: &LinearStack, phases: Vec<LoraPhase>) -> Workload {
    Workload::new(Model::LinearStack(Box::new(model.clone()))).with_lora(phases)
}

#[test]
fn resident_bake_is_exact_and_streamed_low_rank_is_within_tolerance() {
    // Proves both LoRA paths agree with the fully merged reference within
    // LORA_TOLERANCE — all resident (every block baked) and streaming (low-rank on the
    // ring's blocks) — and LoRA bytes are counted apart: model bytes in VRAM never
    // exceed the model, and LoRA VRAM returns to zero at shutdown.
    let (dir, _model, index) = setup();
    let (peft, kohya) = peft_and_kohya(
        dir.path(),
        DemoLora {
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
    let compute = stagehand::device::CpuCompute::new();
    let plain_reference = workload(&model, Vec::new())
        .reference(&compute, &index, 0)
        .unwrap();
    let set = model.lora_set(&index, &specs).unwrap();
    for (budget, all_resident) in [(8u64 << 20, true), (2560 << 10, false)] {
        let workload = workload(&model, vec![phase(&model, &index, 0, &specs)]);
        let merged_reference = workload.reference(&compute, &index, 0).unwrap();
        assert_ne!(merged_reference, plain_reference);
        let report = drive_cpu(session(&index, budget), &workload, &index, options(3)).unwrap();
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
            .map(|block| (0..2).map(|a| set.pack_bytes(a, block)).sum::<u64>())
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
            // Factors ride with their blocks: every one of the 3 steps sends the packs
            // of the blocks that stream (the planned ones, and any resident block the
            // LoRA region displaced), and a later step never more than the adapters
            // hold. (The window after step 1 misses what step 1 prefetched for step 2,
            // so the per-step floor is checked on the whole run.)
            let sent = report.stats.pinned_to_vram.lora_bytes;
            assert!(sent >= 3 * streamed_pack_bytes, "{sent}");
            assert!(sent > lora_bytes, "re-sent after the first step: {sent}");
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
    let none = LoraPhase {
        from_step: 0,
        set: LoraSet::default(),
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
        },
    ];
    for budget in [8u64 << 20, 2560 << 10] {
        let phases = lora
            .iter()
            .map(|p| LoraPhase {
                from_step: p.from_step,
                set: p.set.clone(),
            })
            .collect();
        let workload = workload(&model, phases);
        let report = drive_cpu(session(&index, budget), &workload, &index, options(7)).unwrap();
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

#[test]
fn a_bad_adapter_mid_session_leaves_the_session_running_without_it() {
    // Proves a refused adapter changes nothing: the session keeps running bit-exact
    // without it and every budget returns to zero.
    let (dir, _model, index) = setup();
    let path = dir.path().join("bad.safetensors");
    let mut values = vec![0.0; 4 * 256];
    values[3] = f32::INFINITY;
    write_f32_tensors(
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
    let refused = model.lora_set(&index, &[LoraSpec::parse(path.to_str().unwrap()).unwrap()]);
    assert!(refused.is_err());
    assert!(session.lora_usage().unwrap().adapters.is_empty());
    let workload = workload(&model, Vec::new());
    let report = drive_cpu(session, &workload, &index, options(2)).unwrap();
    assert_eq!(report.verified_steps, 2);
    assert_eq!(report.stats.vram.used_bytes, 0);
    assert_eq!(report.stats.pinned.used_bytes, 0);
}

#[test]
fn stagehand_run_with_lora_verifies_against_the_merged_reference() {
    // Proves `stagehand run --lora FILE:STRENGTH` (twice) verifies every step and
    // reports LoRA bytes apart from model bytes; a missing file is a clear exit 2.
    let (dir, model, _index) = setup();
    let (peft, kohya) = peft_and_kohya(dir.path(), DemoLora::default());
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
