//! `stagehand video` as users call it: every flag its `--help` documents tried through
//! the built binary on the tiny Wan pipeline of `tests/fixtures/wan_pipeline` (one
//! frame of 48 × 64, one step, a 16-token prompt, no guidance by default, so a row is
//! quick), each row checking the exit status and one line of output; bad inputs (a
//! frame count that is not 4k + 1, a size not a multiple of 16, an empty prompt, a
//! starting latent of the wrong size, an output that is not an MP4, a folder that is
//! not a Wan pipeline, an image a pipeline cannot take) exit 2 with one line naming
//! the problem. `--image`/`--last-image` run on the image-to-video pipeline of
//! `tests/fixtures/wan_i2v_pipeline`, and TI2V-5B's text and image to video on
//! `tests/fixtures/wan_ti2v`.

mod common;

use std::path::{Path, PathBuf};

use common::cli::{fixtures, row, settings_rows, Expect, Row, Table};
use stagehand::families::flux::write_latent;

fn pipeline() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_pipeline")
}

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    fixtures.folder("video");
    // One latent frame of 8 × 6 positions, 16 channels.
    let noise = fixtures.path("video/noise.safetensors");
    write_latent(Path::new(&noise), &vec![0.5; 16 * 8 * 6], 16, 8, 6).unwrap();
    let misshapen = fixtures.path("video/misshapen.safetensors");
    write_latent(Path::new(&misshapen), &vec![0.5; 16 * 4 * 4], 16, 4, 4).unwrap();
    let missing = fixtures.path("none.safetensors");
    let frames_dir = fixtures.path("video/frames");
    let ok = ".mp4";
    let i2v = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_i2v_pipeline");
    let (first, last) = (i2v.join("first.png"), i2v.join("last.png"));
    let [i2v, first, last] = [i2v, first, last].map(|path| path.display().to_string());
    let ti2v = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_ti2v");
    let ti2v_first = ti2v.join("first.png").display().to_string();
    let ti2v = ti2v.display().to_string();
    let mut rows = vec![
        row(&[], Expect::Ok("out.mp4")),
        row(&["--model", &ti2v, "--width", "96"], Expect::Ok(ok)),
        row(
            &[
                "--model",
                &ti2v,
                "--width",
                "96",
                "--frames",
                "5",
                "--image",
                &ti2v_first,
            ],
            Expect::Ok(ok),
        ),
        row(
            &[
                "--model",
                &ti2v,
                "--width",
                "96",
                "--frames",
                "5",
                "--image",
                &ti2v_first,
                "--last-image",
                &ti2v_first,
            ],
            Expect::Bad("leave out --last-image"),
        ),
        row(&["--model", &ti2v], Expect::Bad("multiples of 32")),
        row(&["--model", &i2v, "--image", &first], Expect::Ok(ok)),
        row(
            &[
                "--model",
                &i2v,
                "--image",
                &first,
                "--last-image",
                &last,
                "--frames",
                "5",
            ],
            Expect::Ok(ok),
        ),
        row(&["--model", &i2v], Expect::Bad("give the first frame")),
        row(&["--image", &first], Expect::Bad("WanImageToVideoPipeline")),
        row(
            &["--model", &i2v, "--image", &first, "--width", "32"],
            Expect::Bad("resize it"),
        ),
        row(
            &["--model", &i2v, "--image", &missing],
            Expect::Bad("none.safetensors"),
        ),
        row(&["--last-image", &last], Expect::Bad("--image")),
        row(&["--prompt", "a lighthouse at sunset"], Expect::Ok(ok)),
        row(&["--prompt", " "], Expect::Bad("prompt is empty")),
        row(
            &["--negative-prompt", "blurry", "--guidance", "4"],
            Expect::Ok(ok),
        ),
        row(
            &["--guidance", "4", "--guidance-2", "2.5", "--steps", "4"],
            Expect::Summary("hand-over"),
        ),
        row(
            &[
                "--guidance",
                "4",
                "--guidance-2",
                "2.5",
                "--steps",
                "4",
                "--no-hand-over-prefetch",
            ],
            Expect::Summary("no prefetch"),
        ),
        row(&["--guidance", "x"], Expect::Bad("--guidance")),
        row(&["--frames", "5"], Expect::Ok(ok)),
        row(&["--frames", "4"], Expect::Bad("give 1 or 5")),
        row(&["--steps", "2"], Expect::Ok(ok)),
        row(&["--steps", "0"], Expect::Bad("steps")),
        row(&["--width", "32"], Expect::Ok(ok)),
        row(&["--width", "40"], Expect::Bad("multiples of 16")),
        row(&["--height", "32"], Expect::Ok(ok)),
        row(&["--height", "0"], Expect::Bad("multiples of 16")),
        row(&["--seed", "3"], Expect::Ok(ok)),
        row(&["--seed", "-3"], Expect::Bad("--seed")),
        row(&["--max-sequence-length", "8"], Expect::Ok(ok)),
        row(
            &["--max-sequence-length", "0"],
            Expect::Bad("sequence length"),
        ),
        row(&["--latents", &noise], Expect::Ok(ok)),
        row(&["--latents", &misshapen], Expect::Bad("[16, 1, 8, 6]")),
        row(&["--latents", &missing], Expect::Bad("none.safetensors")),
        row(&["--frames-dir", &frames_dir], Expect::Ok(ok)),
        row(&["--fps", "24"], Expect::Ok(ok)),
        row(&["--fps", "0"], Expect::Bad("--fps 0")),
        // 6 × 8 latent positions in tiles of 4 every 3: 2 × 3 tiles.
        row(&["--vae-tile", "4"], Expect::Ok(ok)),
        row(&["--vae-tile", "0"], Expect::Bad("--vae-tile")),
        row(
            &["--out", &fixtures.path("video/out.gif")],
            Expect::Bad("name a .mp4 file"),
        ),
        row(
            &["--out", &format!("{missing}/video.mp4")],
            Expect::Bad("--out"),
        ),
        row(&["--json"], Expect::Ok("\"stages\"")),
        row(&["--quiet"], Expect::Ok(ok)),
        row(
            &["--model", &fixtures.bert()],
            Expect::Bad("model_index.json"),
        ),
        row(
            &[
                "--model",
                &Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/pipeline/flux-tiny")
                    .display()
                    .to_string(),
            ],
            Expect::Bad("WanPipeline"),
        ),
        row(&["--model", &missing], Expect::Bad("model_index.json")),
        row(&["--prompt", "x"], Expect::Bad("--model")).bare(),
        row(&["--help"], Expect::Ok("Usage: stagehand video")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
        row(&["--device", "cpu"], Expect::Ok(ok)),
        row(&["--device", "auto"], Expect::Ok(ok)),
        row(&["--device", "sim"], Expect::Bad("simulate")),
        row(&["--device", "cuda"], Expect::Bad("cuda")),
        row(&["--device", "tpu"], Expect::Bad("tpu")),
    ];
    rows.extend(file_rows(fixtures));
    rows.extend(settings_rows(ok));
    rows
}

/// The parts as ComfyUI's files (`tests/fixtures/wan_comfy`), each flag alone on the
/// pipeline folder too.
fn file_rows(fixtures: &common::cli_rows::Fixtures) -> Vec<Row> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let text = |path: PathBuf| path.display().to_string();
    let high = text(root.join("wan_comfy/wan2.2_t2v_high_noise_tiny.safetensors"));
    let low = text(root.join("wan_comfy/wan2.2_t2v_low_noise_tiny.safetensors"));
    // umT5 as a file with no config.json beside it, as ComfyUI keeps it.
    let umt5 = fixtures.path("video/umt5_xxl_tiny.safetensors");
    std::fs::copy(pipeline().join("text_encoder/model.safetensors"), &umt5).unwrap();
    let tokenizer = text(pipeline().join("tokenizer"));
    let vae = text(pipeline().join("vae"));
    let scheduler = text(pipeline().join("scheduler/scheduler_config.json"));
    let euler = text(root.join("euler/wan-t2v/scheduler_config.json"));
    let vae_file = text(root.join("wan_vae_file/wan21/wan_2.1_vae_tiny.safetensors"));
    let every_part = [
        "--model",
        &high,
        "--model-2",
        &low,
        "--umt5",
        &umt5,
        "--umt5-tokenizer",
        &tokenizer,
        "--vae",
        &vae,
        "--scheduler",
        &scheduler,
    ];
    vec![
        row(&every_part, Expect::Ok(".mp4")),
        row(&["--model", &high], Expect::Bad("--umt5")),
        row(&["--model-2", &low], Expect::Ok(".mp4")),
        row(
            &["--umt5", &umt5, "--umt5-tokenizer", &tokenizer],
            Expect::Ok(".mp4"),
        ),
        row(
            &["--umt5-tokenizer", &fixtures.path("none")],
            Expect::Bad("does not exist"),
        ),
        row(&["--vae", &vae], Expect::Ok(".mp4")),
        row(&["--vae", &vae_file], Expect::Ok(".mp4")),
        row(&["--vae", &low], Expect::Bad("is not a WAN VAE")),
        row(&["--scheduler", &euler], Expect::Ok(".mp4")),
        row(&["--scheduler", &vae], Expect::Bad("scheduler_config")),
    ]
}

#[test]
fn every_documented_video_flag_runs_through_the_binary() {
    let fixtures = fixtures();
    fixtures.folder("video");
    Table::new("video", file!())
        .default(&["--model", &pipeline().display().to_string()])
        .default(&["--prompt", "a red fox in the snow"])
        .default(&["--frames", "1"])
        .default(&["--width", "48"])
        .default(&["--height", "64"])
        .default(&["--steps", "1"])
        .default(&["--guidance", "1"])
        .default(&["--max-sequence-length", "16"])
        .default(&["--out", &fixtures.path("video/out.mp4")])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}
