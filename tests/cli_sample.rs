//! `stagehand sample` as users call it: every flag its `--help` documents tried
//! through the built binary on a tiny generated Flux (diffusers layout, 48 × 32
//! pixels, one step by default), each row checking the exit status and one line of
//! output; the Flux family's bad inputs (a size not a multiple of 16, `--steps 0`, a
//! conditioning file missing a tensor or of the wrong shape, guidance on schnell,
//! `--seed` beside `--init`, a block count that disagrees with `config.json`) exit 2
//! with one line naming the problem, and nothing panics.

mod common;

use std::path::Path;

use common::cli::{device_rows, fixtures, row, settings_rows, Expect, Row, Table};
use stagehand::compute::DType;
use stagehand::families::flux::{
    write_conditioning, write_flux_lora, write_latent, FluxDemo, FluxLoraNaming, FluxPreset, Layout,
};

/// A tiny generated Flux of `preset` under the fixture folder: what `--model` takes.
fn flux(name: &str, preset: FluxPreset, dtype: DType) -> String {
    let demo = FluxDemo {
        preset,
        layout: Layout::Diffusers,
        dtype,
        seed: 1,
    };
    let dir = fixtures().path(&format!("flux/{name}"));
    demo.write(Path::new(&dir)).unwrap().display().to_string()
}

fn write_tensors(path: &str, tensors: &[(&str, Vec<usize>)]) -> String {
    let data: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, shape)| vec![0u8; shape.iter().product::<usize>() * 4])
        .collect();
    let views = tensors.iter().zip(&data).map(|((name, shape), bytes)| {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes);
        (name.to_string(), view.unwrap())
    });
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
    path.to_string()
}

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let shape = FluxPreset::Tiny.shape();
    let schnell = flux("schnell", FluxPreset::TinySchnell, DType::Bf16);
    let f32_model = flux("f32", FluxPreset::Tiny, DType::F32);
    let mismatched = flux("mismatched", FluxPreset::Tiny, DType::Bf16);
    let config = Path::new(&mismatched).join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"num_layers\": 2", "\"num_layers\": 3"),
    )
    .unwrap();
    let init = fixtures.path("flux/init.safetensors");
    write_latent(Path::new(&init), &vec![0.5; 16 * 6 * 4], 16, 6, 4).unwrap();
    let lora = fixtures.path("flux/lora.safetensors");
    write_flux_lora(Path::new(&lora), &shape, FluxLoraNaming::Peft, 2, 5).unwrap();
    // kohya's original names on the diffusers folder: mapped to its pieces.
    let kohya = fixtures.path("flux/kohya.safetensors");
    write_flux_lora(Path::new(&kohya), &shape, FluxLoraNaming::Kohya, 2, 5).unwrap();
    let stray = "lora_unet_double_blocks_9_img_attn_qkv";
    let stray_lora = write_tensors(
        &fixtures.path("flux/stray-lora.safetensors"),
        &[
            (
                &format!("{stray}.lora_down.weight"),
                vec![2, shape.hidden()],
            ),
            (
                &format!("{stray}.lora_up.weight"),
                vec![3 * shape.hidden(), 2],
            ),
        ],
    );
    // A PEFT module of a single block the model lacks: refused by name, not read as
    // the final layer's `proj_out` its name ends in.
    let stray_block = "transformer.single_transformer_blocks.9.proj_out";
    let stray_block_lora = write_tensors(
        &fixtures.path("flux/stray-block-lora.safetensors"),
        &[
            (
                &format!("{stray_block}.lora_A.weight"),
                vec![2, 5 * shape.hidden()],
            ),
            (
                &format!("{stray_block}.lora_B.weight"),
                vec![shape.hidden(), 2],
            ),
        ],
    );
    let misshapen = write_tensors(
        &fixtures.path("flux/misshapen.safetensors"),
        &[("encoder_hidden_states", vec![1, 4, 7])],
    );
    let no_pooled = write_tensors(
        &fixtures.path("flux/no-pooled.safetensors"),
        &[("encoder_hidden_states", vec![1, 4, shape.context_dim])],
    );
    let missing = fixtures.path("none.safetensors");
    let ok = "sample: wrote";
    let mut rows = vec![
        row(&[], Expect::Ok("latent [1, 16, 6, 4]")),
        row(&["--steps", "2"], Expect::Ok("after 2 denoising steps")),
        row(&["--steps", "0"], Expect::Bad("--steps 0")),
        row(&["--steps", "x"], Expect::Bad("--steps")),
        row(&["--width", "64"], Expect::Ok("latent [1, 16, 6, 8]")),
        row(&["--width", "40"], Expect::Bad("multiples of 16")),
        row(&["--height", "16"], Expect::Ok("latent [1, 16, 2, 4]")),
        row(&["--height", "0"], Expect::Bad("multiples of 16")),
        row(&["--guidance", "4.0"], Expect::Ok(ok)),
        row(
            &["--guidance", "3.5", "--model", &schnell],
            Expect::Bad("no guidance embedder"),
        ),
        row(&["--model", &schnell], Expect::Ok(ok)),
        row(&["--seed", "3"], Expect::Ok(ok)),
        row(&["--seed", "-3"], Expect::Bad("--seed")),
        row(&["--init", &init], Expect::Ok("after 1 denoising steps")),
        row(&["--init", &missing], Expect::Bad("none.safetensors")),
        row(
            &["--init", &init, "--seed", "1"],
            Expect::Bad("--seed and --init"),
        ),
        row(
            &[
                "--init",
                &init,
                "--strength",
                "0.5",
                "--steps",
                "4",
                "--seed",
                "1",
            ],
            Expect::Ok("after 2 denoising steps"),
        ),
        row(&["--strength", "0.5"], Expect::Bad("--init")),
        row(
            &["--init", &init, "--strength", "1.5"],
            Expect::Bad("--strength 1.5"),
        ),
        row(&["--cond", &misshapen], Expect::Bad("[1, 4, 7]")),
        row(&["--cond", &no_pooled], Expect::Bad("pooled_projections")),
        row(&["--cond", &missing], Expect::Bad("none.safetensors")),
        row(
            &["--out", &format!("{missing}/latent.safetensors")],
            Expect::Bad("--out"),
        ),
        // F32 weights: a resident block bakes W + s·B·A rounded to its storage dtype.
        row(
            &["--lora", &format!("{lora}:0.5"), "--model", &f32_model],
            Expect::Ok(ok),
        ),
        row(&["--lora", &kohya, "--model", &f32_model], Expect::Ok(ok)),
        row(&["--lora", &stray_lora], Expect::Bad(stray)),
        row(
            &["--lora", &stray_block_lora],
            Expect::Bad("single_transformer_blocks 9, and this model's run from 0 to"),
        ),
        row(&["--lora", &missing], Expect::Bad("none.safetensors")),
        row(&["--json"], Expect::Ok("\"sigmas\"")),
        row(&["--quiet"], Expect::Ok(ok)),
        row(&["--quiet"], Expect::Without("stagehand sample:")),
        // The summary, on stderr, is headed by the command.
        row(&[], Expect::Summary("stagehand sample: ")),
        row(&["--model", &mismatched], Expect::Bad("num_layers")),
        row(
            &["--model", &fixtures.bert()],
            Expect::Bad("not a Flux transformer"),
        ),
        row(&["--model", &missing], Expect::Bad("none.safetensors")),
        row(&["--steps", "1"], Expect::Bad("--model")).bare(),
        row(&["--help"], Expect::Ok("Usage: stagehand sample")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    rows.extend(settings_rows(ok));
    rows.extend(device_rows(ok));
    rows
}

#[test]
fn every_documented_sample_flag_runs_through_the_binary() {
    let fixtures = fixtures();
    let model = flux("tiny", FluxPreset::Tiny, DType::Bf16);
    let cond = fixtures.path("flux/cond.safetensors");
    write_conditioning(Path::new(&cond), &FluxPreset::Tiny.shape(), 6, 2).unwrap();
    Table::new("sample", file!())
        .default(&["--model", &model])
        .default(&["--cond", &cond])
        .default(&["--width", "32"])
        .default(&["--height", "48"])
        .default(&["--steps", "1"])
        .default(&["--out", &fixtures.path("flux/out.safetensors")])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}
