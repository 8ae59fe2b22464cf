//! `stagehand simulate` as users call it: every flag its `--help` documents tried
//! through the built binary (shipped models and profiles, and a tiny decoder folder),
//! each row checking the exit status and one line of the report; a model that does
//! not fit exits 3, bad values exit 2 with one line naming the problem, and nothing
//! panics.

mod common;

use common::cli::{fixtures, row, settings_rows, unopened_device_rows, Expect, Row, Table};

const OK: &str = "fits: yes";

fn rows() -> Vec<Row> {
    let pipeline = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pipeline/flux-tiny")
        .display()
        .to_string();
    let comfy = |name: &str| format!("{pipeline}/../comfy/{name}");
    let fixtures = fixtures();
    let missing = fixtures.path("none.toml");
    let folder = fixtures.folder("empty");
    let not_toml = fixtures.file("bad.toml", "this is = = not toml\n");
    let big = ["--model", "llama3-8b"];
    let mut rows = vec![
        row(&[], Expect::Ok(OK)),
        row(
            &["--model", "flux1-dev", "--hardware", "rtx3060-12gb"],
            Expect::Ok("s/image"),
        ),
        row(&["--model", &fixtures.llama()], Expect::Ok("tokens/s")),
        row(&["--model", &fixtures.bert()], Expect::Ok(OK)),
        // A diffusers Flux pipeline folder: every stage in turn, and the image's time.
        row(
            &["--model", &pipeline, "--image-steps", "4"],
            Expect::Ok("prompt to image"),
        ),
        row(
            &["--model", &pipeline, "--image-steps", "0"],
            Expect::Bad("--image-steps 0"),
        ),
        // ComfyUI's files: the all-in-one checkpoint, and the transformer's file with
        // --clip, --t5 and --vae beside it; no tokenizer needed to describe them.
        row(
            &["--model", &comfy("flux-tiny-all-in-one.safetensors")],
            Expect::Ok("prompt to image"),
        ),
        row(
            &[
                "--model",
                &comfy("flux1-tiny.safetensors"),
                "--clip",
                &comfy("clip_l.safetensors"),
                "--t5",
                &comfy("t5xxl_fp8_e4m3fn_scaled.safetensors"),
                "--vae",
                &comfy("ae.safetensors"),
            ],
            Expect::Ok("prompt to image"),
        ),
        row(
            &[
                "--model",
                &comfy("flux1-tiny.safetensors"),
                "--vae",
                &comfy("ae.safetensors"),
            ],
            Expect::Bad("--clip"),
        ),
        row(&["--model", "nope"], Expect::Bad("unknown model `nope`")),
        row(&["--model", &missing], Expect::Bad("none.toml")),
        row(&["--model", &folder], Expect::Bad("empty")),
        row(&["--model", &not_toml], Expect::Bad("bad.toml")),
        row(&["--hardware", "h100-80gb"], Expect::Ok("h100-80gb")),
        row(
            &["--hardware", "nope"],
            Expect::Bad("unknown hardware `nope`"),
        ),
        row(&["--hardware", &not_toml], Expect::Bad("bad.toml")),
        row(&["--hardware", &folder], Expect::Bad("empty")),
        row(&["--model", "llama3-8b"], Expect::Bad("--hardware")).bare(),
        row(&["--hardware", "rtx4090"], Expect::Bad("--model")).bare(),
        row(
            &[&big[..], &["--ram", "1GiB"]].concat(),
            Expect::Exit(3, "fits: NO"),
        ),
        row(&["--ram", "64GiB"], Expect::Ok("64 GiB RAM")),
        row(&["--ram", "lots"], Expect::Bad("lots")),
        row(&["--disk", "hdd"], Expect::Ok("hdd disk")),
        row(&["--disk", "floppy"], Expect::Bad("unknown disk `floppy`")),
        row(&["--steps", "3"], Expect::Ok("3 steps")),
        row(&["--steps", "0"], Expect::Bad("--steps 0")),
        row(&["--steps", "-3"], Expect::Bad("--steps")),
        row(&["--seed", "5", "--jitter", "0.1"], Expect::Ok("seed 5")),
        row(&["--seed", "-5"], Expect::Bad("--seed")),
        row(&["--jitter", "0.2"], Expect::Ok(OK)),
        row(&["--jitter", "2"], Expect::Bad("jitter")),
        row(&["--jitter=-0.5"], Expect::Bad("jitter")),
        row(&["--jitter", "NaN"], Expect::Bad("jitter")),
        row(
            &["--model", &fixtures.llama(), "--tokens-per-step", "4"],
            Expect::Ok("tokens/s"),
        ),
        row(
            &["--tokens-per-step", "0"],
            Expect::Bad("--tokens-per-step"),
        ),
        row(&["--no-baselines"], Expect::Ok(OK)),
        row(&["--json"], Expect::Ok("\"fits\"")),
        row(&["--with", "flux1-dev"], Expect::Ok("in turn on")),
        row(
            &["--with", "flux1-dev", "--vram-budget", "8GiB", "--json"],
            Expect::Ok("\"switch_bytes\""),
        ),
        row(&["--with", "nope"], Expect::Bad("unknown model `nope`")),
        row(&["--prefetch-depth", "auto"], Expect::Ok(OK)),
        row(&["--help"], Expect::Ok("Usage: stagehand simulate")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    // The simulator is the device: every kind is accepted (none is opened).
    rows.extend(unopened_device_rows(OK));
    rows.extend(settings_rows(OK));
    rows
}

#[test]
fn every_documented_simulate_flag_runs_through_the_binary() {
    Table::new("simulate", file!())
        .default(&["--model", &fixtures().llama()])
        .default(&["--hardware", "rtx4090"])
        .default(&["--steps", "4"])
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}
