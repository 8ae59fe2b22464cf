//! `stagehand demo-model` as users call it: every flag its `--help` documents tried
//! through the built binary (small shapes and the tiny presets, so each row writes a
//! few MiB at most), each row checking the exit status and the line saying what was
//! written; bad values exit 2 with one line naming the problem, and nothing panics.

mod common;

use common::cli::{fixtures, row, Expect, Row, Table};

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let out = |name: &str| fixtures.path(&format!("out/{name}"));
    let a_file = fixtures.file("a-file", "not a folder\n");
    let lora_folder = fixtures.folder("lora-folder");
    let (bert, llama, lora) = (out("bert"), out("llama"), out("l.safetensors"));
    let mut rows = vec![
        row(&[], Expect::Ok("2 blocks x 1 layers x 64x64 f32")),
        row(&["--out", &a_file], Expect::Bad("not a folder")),
        row(&[], Expect::Bad("--out")).bare(),
        row(&["--blocks", "3"], Expect::Ok("3 blocks")),
        row(&["--blocks", "0"], Expect::Bad("must all be at least 1")),
        row(&["--blocks", "-1"], Expect::Bad("--blocks")),
        row(&["--layers-per-block", "2"], Expect::Ok("x 2 layers")),
        row(
            &["--layers-per-block", "0"],
            Expect::Bad("layers per block (0)"),
        ),
        row(&["--dim", "32"], Expect::Ok("32x32")),
        row(&["--dim", "0"], Expect::Bad("dim (0)")),
        row(&["--dim", "x"], Expect::Bad("--dim")),
        row(&["--seed", "9"], Expect::Ok("seed 9")),
        row(&["--seed", "-9"], Expect::Bad("--seed")),
        row(
            &["--arch", "linear-stack"],
            Expect::Ok("linear-stack.safetensors"),
        ),
        row(&["--arch", "bert", "--out", &bert], Expect::Ok("BERT Tiny")),
        row(
            &["--arch", "roberta", "--out", &out("roberta")],
            Expect::Ok("RoBERTa Tiny"),
        ),
        row(
            &["--arch", "bert", "--preset", "tiny", "--out", &bert],
            Expect::Ok("BERT Tiny"),
        ),
        row(
            &["--arch", "bert", "--preset", "huge"],
            Expect::Bad("'huge'"),
        ),
        row(
            &["--arch", "bert", "--dtype", "bf16", "--out", &bert],
            Expect::Ok("bf16 weights"),
        ),
        row(
            &["--arch", "bert", "--dtype", "fp8", "--out", &bert],
            Expect::Bad("fp8 is for decoders"),
        ),
        row(
            &["--arch", "llama", "--out", &llama],
            Expect::Ok("Llama Tiny"),
        ),
        row(
            &["--arch", "mixtral", "--out", &out("mixtral")],
            Expect::Ok("8 experts top-2"),
        ),
        row(
            &["--arch", "qwen3", "--out", &out("qwen3")],
            Expect::Ok("Qwen3 Tiny"),
        ),
        row(
            &["--arch", "qwen3-moe", "--out", &out("qwen3-moe")],
            Expect::Ok("top-4"),
        ),
        row(
            &["--arch", "qwen2-moe", "--out", &out("qwen2-moe")],
            Expect::Ok("a shared expert"),
        ),
        row(&["--arch", "gpt2"], Expect::Bad("'gpt2'")),
        row(
            &[
                "--arch",
                "llama",
                "--decoder-preset",
                "tiny",
                "--out",
                &llama,
            ],
            Expect::Ok("Llama Tiny"),
        ),
        row(
            &["--arch", "qwen3-moe", "--decoder-preset", "1b"],
            Expect::Bad("tiny or small"),
        ),
        row(
            &["--arch", "llama", "--decoder-preset", "70b"],
            Expect::Bad("'70b'"),
        ),
        row(
            &["--arch", "llama", "--dtype", "f16", "--out", &llama],
            Expect::Ok("f16 weights"),
        ),
        row(
            &["--arch", "llama", "--dtype", "fp8", "--out", &llama],
            Expect::Ok("fp8-e4m3 weights"),
        ),
        row(&["--arch", "llama", "--dtype", "f64"], Expect::Bad("'f64'")),
        row(&["--dtype", "f32"], Expect::Ok("f32")),
        row(&["--lora-out", &lora], Expect::Ok("rank 8")),
        row(
            &["--lora-out", &lora, "--lora-rank", "4"],
            Expect::Ok("rank 4"),
        ),
        row(
            &["--lora-out", &lora, "--lora-dtype", "bf16"],
            Expect::Ok("Bf16 LoRA"),
        ),
        row(
            &["--lora-out", &lora, "--lora-dtype", "f64"],
            Expect::Bad("'f64'"),
        ),
        row(
            &["--lora-out", &lora, "--lora-rank", "0"],
            Expect::Bad("--lora-rank 0"),
        ),
        row(&["--lora-out", &lora_folder], Expect::Bad("a folder")),
        row(
            &[
                "--arch",
                "bert",
                "--out",
                &bert,
                "--lora-out",
                &out("bert-lora"),
                "--lora-rank",
                "2",
            ],
            Expect::Ok("PEFT rank 2"),
        ),
        row(
            &[
                "--arch",
                "bert",
                "--out",
                &bert,
                "--lora-out",
                &out("bert-lora"),
                "--lora-rank",
                "999",
            ],
            Expect::Bad("--lora-rank"),
        ),
        row(
            &["--arch", "llama", "--lora-out", &lora],
            Expect::Bad("--lora-out"),
        ),
    ];
    // A kohya adapter for every small preset in every layout (full-depth is the same
    // code at 158 MiB a model).
    for preset in ["tiny", "tiny-schnell", "small"] {
        for layout in ["original", "comfyui", "diffusers"] {
            rows.push(row(
                &[
                    "--arch",
                    "flux",
                    "--flux-preset",
                    preset,
                    "--layout",
                    layout,
                    "--out",
                    &out(&format!("flux-{preset}-{layout}")),
                    "--lora-out",
                    &out(&format!("flux-{preset}-{layout}.safetensors")),
                    "--lora-rank",
                    "4",
                ],
                Expect::Ok("kohya rank 4 F32 LoRA on 10 modules"),
            ));
        }
    }
    rows.extend(vec![
        row(
            &["--arch", "flux", "--out", &out("flux")],
            Expect::Ok("Flux Tiny, diffusers layout"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--flux-preset",
                "tiny-schnell",
                "--out",
                &out("flux"),
            ],
            Expect::Ok("guidance no (schnell)"),
        ),
        row(
            &["--arch", "flux", "--flux-preset", "huge"],
            Expect::Bad("'huge'"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--layout",
                "original",
                "--dtype",
                "bf16",
                "--out",
                &out("flux"),
            ],
            Expect::Ok("original layout"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--layout",
                "comfyui",
                "--dtype",
                "fp8",
                "--out",
                &out("flux"),
            ],
            Expect::Ok("comfyui layout"),
        ),
        row(
            &["--arch", "flux", "--dtype", "fp8", "--out", &out("flux")],
            Expect::Bad("--dtype fp8"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--layout",
                "original",
                "--dtype",
                "int8",
                "--out",
                &out("flux-int8"),
            ],
            Expect::Ok("int8 weights"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--layout",
                "comfyui",
                "--dtype",
                "awq",
                "--out",
                &out("flux-awq"),
            ],
            Expect::Ok("awq-u4 weights"),
        ),
        row(
            &[
                "--arch",
                "llama",
                "--dtype",
                "int8",
                "--out",
                &out("llama-int8"),
            ],
            Expect::Bad("for --arch flux only"),
        ),
        row(
            &["--arch", "flux", "--layout", "nope"],
            Expect::Bad("'nope'"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--out",
                &out("flux"),
                "--cond-out",
                &out("cond.safetensors"),
            ],
            Expect::Ok("64 text tokens"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--out",
                &out("flux"),
                "--cond-out",
                &out("cond.safetensors"),
                "--cond-tokens",
                "8",
            ],
            Expect::Ok("8 text tokens"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--out",
                &out("flux"),
                "--cond-tokens",
                "0",
            ],
            Expect::Bad("--cond-tokens"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--out",
                &out("flux"),
                "--lora-out",
                &out("flux-lora.safetensors"),
                "--lora-rank",
                "999",
            ],
            Expect::Bad("--lora-rank must be between 1 and the hidden size"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--out",
                &out("flux"),
                "--lora-out",
                &lora_folder,
            ],
            Expect::Bad("a folder"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--layout",
                "original",
                "--dtype",
                "int8",
                "--out",
                &out("flux-int8"),
                "--lora-out",
                &out("flux-lora.safetensors"),
            ],
            Expect::Bad("integer-quantized"),
        ),
        row(
            &[
                "--arch",
                "flux",
                "--out",
                &out("flux"),
                "--lora-out",
                &out("flux-lora.safetensors"),
                "--lora-dtype",
                "bf16",
            ],
            Expect::Ok("kohya rank 8 Bf16 LoRA"),
        ),
        row(&["--help"], Expect::Ok("Usage: stagehand demo-model")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ]);
    rows
}

#[test]
fn every_documented_demo_model_flag_runs_through_the_binary() {
    Table::new("demo-model", file!())
        .default(&["--out", &fixtures().path("out/linear")])
        .default(&["--blocks", "2"])
        .default(&["--layers-per-block", "1"])
        .default(&["--dim", "64"])
        .rows(rows())
        .run();
}

/// `12.50 KiB` as a summary prints a size, in bytes.
fn bytes(text: &str) -> f64 {
    let (number, unit) = text.trim().split_once(' ').unwrap_or((text, "B"));
    let scale = match unit {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        other => panic!("unit {other} in {text}"),
    };
    number.parse::<f64>().unwrap() * scale
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
                2.0 * bytes(&streamed_resident) < bytes(&model_bytes),
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
