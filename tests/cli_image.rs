//! `stagehand image` as users call it: every flag its `--help` documents tried through
//! the built binary on the tiny Flux pipeline of `tests/fixtures/pipeline` (64 × 48
//! pixels, one step, a 16-token T5 prompt by default), each row checking the exit
//! status and one line of output; bad inputs (a size not a multiple of 16, `--steps
//! 0`, an empty prompt, a starting latent of the wrong shape, a folder that is not a
//! pipeline or lacks a part) exit 2 with one line naming the problem.

mod common;

use std::path::{Path, PathBuf};

use common::cli::{fixtures, row, settings_rows, Expect, Row, Table};
use stagehand::families::flux::write_latent;
use stagehand::pipeline::Picture;

fn pipeline() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline/flux-tiny")
}

/// A copy of the pipeline without its VAE.
fn without_vae() -> String {
    let copy = fixtures().folder("image/no-vae");
    let copy = Path::new(&copy);
    for entry in [
        "model_index.json",
        "transformer",
        "text_encoder",
        "text_encoder_2",
    ] {
        let from = pipeline().join(entry);
        if from.is_file() {
            std::fs::copy(&from, copy.join(entry)).unwrap();
        } else {
            std::fs::create_dir_all(copy.join(entry)).unwrap();
            for file in std::fs::read_dir(&from).unwrap() {
                let file = file.unwrap().path();
                std::fs::copy(&file, copy.join(entry).join(file.file_name().unwrap())).unwrap();
            }
        }
    }
    copy.display().to_string()
}

/// A file of the ComfyUI layouts of the same weights.
fn comfy(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pipeline/comfy")
        .join(name)
        .display()
        .to_string()
}

/// The pipeline's tokenizer folder `tokenizer{suffix}`.
fn tokenizer(suffix: &str) -> String {
    pipeline()
        .join(format!("tokenizer{suffix}"))
        .display()
        .to_string()
}

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    fixtures.folder("image");
    let noise = fixtures.path("image/noise.safetensors");
    write_latent(Path::new(&noise), &vec![0.5; 16 * 8 * 6], 16, 8, 6).unwrap();
    let misshapen = fixtures.path("image/misshapen.safetensors");
    write_latent(Path::new(&misshapen), &vec![0.5; 16 * 4 * 4], 16, 4, 4).unwrap();
    let missing = fixtures.path("none.safetensors");
    let png = |name: &str, height: usize, width: usize| {
        let path = fixtures.path(&format!("image/{name}.png"));
        let planar: Vec<f32> = (0..3 * height * width)
            .map(|i| (i % 7) as f32 / 3.5 - 1.0)
            .collect();
        let picture = Picture::from_decoded(&planar, height, width).unwrap();
        picture.write_png(Path::new(&path), &[]).unwrap();
        path
    };
    let init = png("init", 64, 48);
    let small = png("small", 32, 32);
    let ok = ".png";
    let mut rows = vec![
        row(&[], Expect::Ok("out.png")),
        row(&["--prompt", "a lighthouse at sunset"], Expect::Ok(ok)),
        row(&["--prompt", " "], Expect::Bad("prompt is empty")),
        row(&["--steps", "2"], Expect::Ok(ok)),
        row(&["--steps", "0"], Expect::Bad("steps")),
        row(&["--steps", "x"], Expect::Bad("--steps")),
        row(&["--width", "32"], Expect::Ok(ok)),
        row(&["--width", "40"], Expect::Bad("multiples of 16")),
        row(&["--height", "32"], Expect::Ok(ok)),
        row(&["--height", "0"], Expect::Bad("multiples of 16")),
        row(&["--guidance", "4.0"], Expect::Ok(ok)),
        row(&["--seed", "3"], Expect::Ok(ok)),
        row(&["--seed", "-3"], Expect::Bad("--seed")),
        row(&["--batch", "2"], Expect::Ok("out-2.png")),
        row(&["--batch", "0"], Expect::Bad("--batch 0")),
        row(&["--max-sequence-length", "8"], Expect::Ok(ok)),
        row(
            &["--max-sequence-length", "0"],
            Expect::Bad("sequence length"),
        ),
        row(&["--latents", &noise], Expect::Ok(ok)),
        row(&["--vae-tile", "4"], Expect::Ok(ok)),
        row(&["--init-image", &init, "--steps", "4"], Expect::Ok(ok)),
        row(
            &["--init-image", &init, "--strength", "0.3", "--steps", "4"],
            Expect::Ok(ok),
        ),
        row(
            &["--init-image", &init, "--strength", "1.5"],
            Expect::Bad("strength 1.5"),
        ),
        row(&["--strength", "0.5"], Expect::Bad("--init-image")),
        row(&["--init-image", &small], Expect::Bad("resize it")),
        row(&["--init-image", &noise], Expect::Bad("not a PNG")),
        row(
            &["--init-image", &init, "--latents", &noise],
            Expect::Bad("both say"),
        ),
        row(&["--vae-tile", "0"], Expect::Bad("--vae-tile")),
        row(&["--latents", &misshapen], Expect::Bad("[1, 16, 8, 6]")),
        row(&["--latents", &missing], Expect::Bad("none.safetensors")),
        row(
            &["--out", &format!("{missing}/image.png")],
            Expect::Bad("--out"),
        ),
        row(&["--json"], Expect::Ok("\"stages\"")),
        row(&["--quiet"], Expect::Ok(ok)),
        row(&["--model", &without_vae()], Expect::Bad("vae")),
        row(
            &["--model", &fixtures.bert()],
            Expect::Bad("model_index.json"),
        ),
        row(&["--model", &missing], Expect::Bad("model_index.json")),
        // ComfyUI's files: a part of the folder replaced, the separate files, the
        // all-in-one checkpoint; a part or a tokenizer missing, named by its flag.
        row(&["--clip", &comfy("clip_l.safetensors")], Expect::Ok(ok)),
        row(
            &["--t5", &comfy("t5xxl_fp8_e4m3fn_scaled.safetensors")],
            Expect::Ok(ok),
        ),
        row(&["--vae", &comfy("ae.safetensors")], Expect::Ok(ok)),
        row(&["--vae", &missing], Expect::Bad("none.safetensors")),
        row(
            &[
                "--model",
                &comfy("flux1-tiny.safetensors"),
                "--clip",
                &comfy("clip_l.safetensors"),
                "--t5",
                &comfy("t5xxl.safetensors"),
                "--vae",
                &comfy("ae.safetensors"),
                "--clip-tokenizer",
                &tokenizer(""),
                "--t5-tokenizer",
                &tokenizer("_2"),
            ],
            Expect::Ok(ok),
        ),
        row(
            &["--model", &comfy("flux1-tiny.safetensors")],
            Expect::Bad("give --clip"),
        ),
        row(
            &[
                "--model",
                &comfy("flux-tiny-all-in-one.safetensors"),
                "--clip-tokenizer",
                &tokenizer(""),
                "--t5-tokenizer",
                &tokenizer("_2"),
            ],
            Expect::Ok(ok),
        ),
        row(
            &[
                "--model",
                &comfy("flux-tiny-all-in-one.safetensors"),
                "--t5-tokenizer",
                &tokenizer("_2"),
            ],
            Expect::Bad("give --clip-tokenizer"),
        ),
        row(
            &["--clip-tokenizer", &fixtures.folder("image/empty")],
            Expect::Bad("no tokenizer"),
        ),
        row(&["--prompt", "x"], Expect::Bad("--model")).bare(),
        row(&["--help"], Expect::Ok("Usage: stagehand image")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
        row(&["--device", "cpu"], Expect::Ok(ok)),
        row(&["--device", "auto"], Expect::Ok(ok)),
        row(&["--device", "sim"], Expect::Bad("simulate")),
        row(&["--device", "cuda"], Expect::Bad("cuda")),
        row(&["--device", "tpu"], Expect::Bad("tpu")),
    ];
    rows.extend(settings_rows(ok));
    rows
}

#[test]
fn every_documented_image_flag_runs_through_the_binary() {
    let fixtures = fixtures();
    fixtures.folder("image");
    Table::new("image", file!())
        .default(&["--model", &pipeline().display().to_string()])
        .default(&["--prompt", "a red fox in the snow"])
        .default(&["--width", "48"])
        .default(&["--height", "64"])
        .default(&["--steps", "1"])
        .default(&["--max-sequence-length", "16"])
        .default(&["--out", &fixtures.path("image/out.png")])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}
