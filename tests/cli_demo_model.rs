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
        row(
            &["--arch", "wan", "--out", &out("wan")],
            Expect::Ok("WAN Tiny: 2 blocks of 32"),
        ),
        row(
            &[
                "--arch",
                "wan",
                "--wan-preset",
                "small",
                "--dtype",
                "bf16",
                "--out",
                &out("wan"),
            ],
            Expect::Ok("WAN Small: 4 blocks of 128, 4 heads of 32"),
        ),
        row(
            &["--arch", "wan", "--dtype", "fp8", "--out", &out("wan-fp8")],
            Expect::Ok("wan2.2_tiny_fp8_scaled.safetensors (WAN Tiny"),
        ),
        row(
            &[
                "--arch",
                "umt5",
                "--umt5-preset",
                "tiny",
                "--out",
                &out("umt5"),
            ],
            Expect::Ok("umT5 Tiny: 2 blocks of 32, 4 heads of 8, FFN 64, 384 tokens"),
        ),
        row(
            &["--arch", "umt5", "--dtype", "fp8", "--out", &out("umt5")],
            Expect::Bad("f32, f16 or bf16"),
        ),
        row(&["--help"], Expect::Ok("Usage: stagehand demo-model")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ]);
    rows
}

#[test]
fn every_documented_demo_model_flag_runs_through_the_binary() {
    Table::new("demo-model", file!())
        .sequential()
        .default(&["--out", &fixtures().path("out/linear")])
        .default(&["--blocks", "2"])
        .default(&["--layers-per-block", "1"])
        .default(&["--dim", "64"])
        .rows(rows())
        .run();
}
