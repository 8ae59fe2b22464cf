//! `demo-model --arch flux --lora-out` end to end: the adapter it writes, sampled
//! through the built binary on the model it wrote, streamed and resident.

mod common;

/// `12.50 KiB` as a summary prints a size, in bytes.
fn bytes(text: &str) -> u64 {
    let size: bytesize::ByteSize = text
        .trim()
        .parse()
        .unwrap_or_else(|error| panic!("{text}: {error}"));
    size.as_u64()
}

/// Runs the binary with `args`; returns stdout and stderr together, after checking it
/// exited 0.
fn succeeds(args: &[&str]) -> String {
    let output = common::process::output_within_deadline(common::stagehand().args(args));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "stagehand {args:?}: {text}");
    text
}

#[test]
fn a_flux_demo_adapter_samples_streamed_as_resident_on_every_layout() {
    // Proves `demo-model --arch flux --lora-out` writes a kohya adapter that
    // `sample --lora` applies to the generated model in each layout (it changes the
    // latent), and that sampling it streamed under about half the model gives the
    // same bits as fully resident (BF16 weights: every patch low-rank in both).
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str| dir.path().join(name).display().to_string();
    for preset in ["tiny", "tiny-schnell"] {
        for layout in ["original", "comfyui", "diffusers"] {
            let case = format!("{preset} {layout}");
            let (lora, cond) = (
                path(&format!("{case}.safetensors")),
                path("cond.safetensors"),
            );
            let written = succeeds(&[
                "demo-model",
                "--arch",
                "flux",
                "--flux-preset",
                preset,
                "--layout",
                layout,
                "--dtype",
                "bf16",
                "--out",
                &path(&case),
                "--lora-out",
                &lora,
                "--cond-out",
                &cond,
                "--cond-tokens",
                "8",
            ]);
            let model = written
                .lines()
                .find_map(|line| {
                    line.strip_prefix("wrote ")?
                        .split_once(" (Flux")
                        .map(|(m, _)| m)
                })
                .unwrap_or_else(|| panic!("{case}: no model path in {written}"))
                .to_string();
            let sample = |budget: &str, lora: Option<&str>, out: &str| {
                let lora_spec = lora.map(|lora| format!("{lora}:0.8"));
                let mut args = vec![
                    "sample",
                    "--model",
                    &model,
                    "--cond",
                    &cond,
                    "--width",
                    "48",
                    "--height",
                    "32",
                    "--steps",
                    "2",
                    "--vram-budget",
                    budget,
                    "--out",
                    out,
                ];
                if let Some(spec) = &lora_spec {
                    args.extend(["--lora", spec]);
                }
                let text = succeeds(&args);
                (text, std::fs::read(out).unwrap())
            };
            let (streamed_text, streamed) = sample("500KiB", Some(&lora), &path("s.safetensors"));
            let (resident_text, resident) = sample("64MiB", Some(&lora), &path("r.safetensors"));
            let (_, plain) = sample("64MiB", None, &path("p.safetensors"));
            let resident_part = |text: &str| {
                let line = text
                    .lines()
                    .find(|line| line.contains(" resident + streaming ring"));
                let line = line.unwrap_or_else(|| panic!("{case}: no budget line in {text}"));
                let model = line
                    .split("model ")
                    .nth(1)
                    .unwrap()
                    .split("  ")
                    .next()
                    .unwrap();
                let resident = line
                    .split('(')
                    .nth(1)
                    .unwrap()
                    .split(" resident")
                    .next()
                    .unwrap();
                (model.to_string(), resident.to_string())
            };
            let (model_bytes, streamed_resident) = resident_part(&streamed_text);
            assert!(
                2 * bytes(&streamed_resident) < bytes(&model_bytes),
                "{case}: {streamed_resident} of {model_bytes} resident: not streamed"
            );
            let (_, all_resident) = resident_part(&resident_text);
            assert!(
                bytes(&all_resident) >= bytes(&model_bytes),
                "{case}: {all_resident} of {model_bytes} resident"
            );
            assert!(
                streamed_text.contains("0 steps low-rank within"),
                "{case}: {streamed_text}"
            );
            assert_eq!(streamed, resident, "{case}: streamed differs from resident");
            assert_ne!(resident, plain, "{case}: the adapter changed nothing");
        }
    }
}
