//! `stagehand bench` and its modes as users call them: every flag `bench --help`,
//! `bench disk --help` and `bench lora --help` document tried through the built
//! binary, each row checking the exit status and one line of output; bad values exit
//! 2 with one line naming the problem before anything is measured, and nothing panics.
//! The demo bench and `bench lora` measure the 256 MiB demo model (one row each, the
//! smallest steps and rounds); `bench --model` rows use the tiny folders, and
//! `--device cuda` (the GPU mode) refuses cleanly where there is no GPU.

mod common;

use common::cli::{fixtures, row, settings_rows, Expect, Row, Table};

const OK: &str = "stagehand/bound";

/// `bench` itself: the demo (one row) and `--model` on the tiny folders.
fn bench_rows() -> Vec<Row> {
    let fixtures = fixtures();
    let (linear, bert, llama, moe) = (
        fixtures.linear_stack(),
        fixtures.bert(),
        fixtures.llama(),
        fixtures.moe(),
    );
    let missing = fixtures.path("none.safetensors");
    let demo = [
        "--compute-batch",
        "4",
        "--transfer-batch",
        "1",
        "--json",
        "--steps",
        "2",
        "--rounds",
        "1",
        "--device",
        "cpu",
        "--log",
        "warn",
    ];
    let mut rows = vec![
        row(&demo, Expect::Ok("\"configurations\"")).bare(),
        row(&["--model", &bert, "--batches", "1,2"], Expect::Ok(OK)),
        row(
            &["--model", &bert, "--batches", "1,0"],
            Expect::Bad("--batches must be at least 1"),
        ),
        row(
            &["--model", &bert, "--batches", "x"],
            Expect::Bad("--batches"),
        ),
        row(&["--model", &llama, "--kv-tokens", "8"], Expect::Ok("KV")),
        row(
            &["--model", &llama, "--kv-tokens", "5"],
            Expect::Bad("--kv-tokens 5"),
        ),
        row(
            &["--model", &bert, "--kv-tokens", "8"],
            Expect::Bad("--kv-tokens is for decoders"),
        ),
        row(&["--model", &moe], Expect::Ok("hint")),
        // A diffusion transformer: one row of a denoising step, whatever --batches says.
        row(
            &["--model", &fixtures.flux(), "--batches", "1,4"],
            Expect::Ok(" step   bound ms"),
        ),
        row(
            &["--model", &llama, "--json"],
            Expect::Ok("\"configurations\""),
        ),
        row(&["--model", &missing], Expect::Bad("none.safetensors")),
        row(
            &["--model", &fixtures.folder("empty")],
            Expect::Bad("empty"),
        ),
        row(&["--steps", "3"], Expect::Ok(OK)),
        row(&["--steps", "1"], Expect::Bad("--steps must be at least 2")),
        row(&["--rounds", "1"], Expect::Ok(OK)),
        row(&["--rounds", "-1"], Expect::Bad("--rounds")),
        row(&["--compute-batch", "x"], Expect::Bad("--compute-batch")),
        row(&["--transfer-batch", "-1"], Expect::Bad("--transfer-batch")),
        row(&["--help"], Expect::Ok("Usage: stagehand bench")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
        row(&["--device", "cpu"], Expect::Ok(OK)),
        row(&["--device", "auto"], Expect::Ok(OK)),
        row(&["--device", "sim"], Expect::Bad("simulate")),
        // The GPU mode: copies over the link and a streamed run on cuda:0.
        row(&["--device", "cuda"], Expect::OkOrBad("cuda")),
        row(&["--device", "tpu"], Expect::Bad("tpu")),
    ];
    rows.extend(settings_rows(OK));
    // Every other row benches the tiny linear stack (unless it names its own model).
    for row in &mut rows {
        if row.defaults && !row.args.iter().any(|arg| arg == "--model") {
            row.args
                .splice(0..0, ["--model".to_string(), linear.clone()]);
        }
    }
    rows
}

#[test]
fn every_documented_bench_flag_runs_through_the_binary() {
    Table::new("bench", file!())
        .default(&["--steps", "2"])
        .default(&["--rounds", "1"])
        .default(&["--batches", "1"])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(bench_rows())
        .run();
}

#[test]
fn every_documented_bench_disk_flag_runs_through_the_binary() {
    let fixtures = fixtures();
    let file = fixtures.file("read.bin", &"r".repeat(4 << 20));
    let small = fixtures.file("small.bin", "too small to measure");
    let missing = fixtures.path("none.bin");
    let folder = fixtures.folder("folder");
    let on = |args: &[&str], expect| {
        let mut all = vec![file.as_str()];
        all.extend_from_slice(args);
        row(&all, expect)
    };
    let rows = vec![
        on(&[], Expect::Ok("O_DIRECT ring / dd")),
        on(&["--json"], Expect::Ok("\"file\"")),
        on(&["--size", "2MiB"], Expect::Ok("O_DIRECT ring / dd")),
        on(&["--size", "3000"], Expect::Bad("not a multiple of 4 KiB")),
        on(&["--size", "1GiB"], Expect::Bad("--size 1 GiB")),
        on(
            &["--request-size", "256KiB"],
            Expect::Ok("O_DIRECT ring / dd"),
        ),
        on(
            &["--request-size", "16MiB"],
            Expect::Bad("less than one read request"),
        ),
        on(
            &["--staging-buffers", "2"],
            Expect::Ok("O_DIRECT ring / dd"),
        ),
        on(
            &["--staging-buffers", "0"],
            Expect::Bad("--staging-buffers"),
        ),
        on(
            &["--staging-buffers", "1000"],
            Expect::Bad("--staging-buffers"),
        ),
        on(
            &["--staging-buffer-size", "2MiB"],
            Expect::Ok("O_DIRECT ring / dd"),
        ),
        on(
            &["--staging-buffer-size", "5000"],
            Expect::Bad("not a multiple of 4 KiB"),
        ),
        on(
            &["--staging-buffers", "64", "--staging-buffer-size", "64GiB"],
            Expect::Bad("available RAM"),
        ),
        on(&["--reader-threads", "2"], Expect::Ok("O_DIRECT ring / dd")),
        on(&["--reader-threads", "0"], Expect::Bad("reader_threads")),
        on(&["--rounds", "2"], Expect::Ok("O_DIRECT ring / dd")),
        on(&["--rounds", "0"], Expect::Bad("--rounds")),
        row(&[&missing], Expect::Bad("none.bin")),
        row(&[&folder], Expect::Bad("not a non-empty regular file")),
        row(&[&small], Expect::Bad("less than one read request")),
        row(&[], Expect::Bad("<FILE>")),
        row(&["--help"], Expect::Ok("Usage: stagehand bench disk")),
        on(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    Table::new("bench disk", file!())
        .default(&["--request-size", "1MiB"])
        .default(&["--staging-buffer-size", "1MiB"])
        .default(&["--rounds", "1"])
        .rows(rows)
        .run();
}

#[test]
fn every_documented_bench_lora_flag_runs_through_the_binary() {
    let mut rows = vec![
        row(&["--json", "--device", "cpu"], Expect::Ok("\"")),
        row(&["--rank", "0"], Expect::Bad("--rank")),
        row(&["--rank", "100000"], Expect::Bad("rank 100000")),
        row(&["--batch", "0"], Expect::Bad("--batch")),
        row(&["--steps", "1"], Expect::Bad("--steps must be at least 2")),
        row(&["--rounds", "0"], Expect::Bad("--rounds")),
        row(&["--help"], Expect::Ok("Usage: stagehand bench lora")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    // The settings' refusals (each run of this mode measures the 256 MiB demo twice).
    rows.extend(
        settings_rows("")
            .into_iter()
            .filter(|row| matches!(row.expect, Expect::Bad(_))),
    );
    rows.push(row(&["--device", "sim"], Expect::Bad("simulate")));
    rows.push(row(
        &["--device", "cuda"],
        Expect::Bad("--device cuda is not implemented"),
    ));
    rows.push(row(&["--device", "tpu"], Expect::Bad("tpu")));
    Table::new("bench lora", file!())
        .default(&["--rank", "4"])
        .default(&["--batch", "2"])
        .default(&["--steps", "2"])
        .default(&["--rounds", "1"])
        .default(&["--json"])
        .default(&["--log", "warn"])
        .rows(rows)
        .run();
}
