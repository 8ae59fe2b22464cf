//! `stagehand validate` as users call it: every flag its `--help` documents tried
//! through the built binary (the quick matrix on a 64-wide demo model, one repeat of
//! three steps; three rows run the full matrix of that small model), each row
//! checking the exit status and one line of the report; bad values exit 2 with one
//! line naming the problem before anything runs, and nothing panics.

mod common;

use common::cli::{fixtures, row, Expect, Row, Table};

const OK: &str = "verdicts: ";

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let cache = fixtures.path("cache");
    let bert = fixtures.bert();
    let missing = fixtures.path("none");
    // The full matrix: every row without --quick.
    let full = |args: &[&str], expect| {
        let mut all = vec!["--hardware", "rtx4090", "--repeats", "1", "--steps", "3"];
        all.extend_from_slice(&["--demo-dim", "64", "--cache-dir", &cache]);
        all.extend_from_slice(args);
        row(&all, expect).bare()
    };
    vec![
        row(&[], Expect::Ok(OK)),
        row(&["--hardware", "h200"], Expect::Ok(OK)),
        row(
            &["--hardware", "config/hardware/rtx5090.toml"],
            Expect::Ok(OK),
        ),
        row(&["--hardware", "nope"], Expect::Bad("nope")),
        row(&["--hardware", &missing], Expect::Bad("none")),
        row(&["--device", "cpu"], Expect::Ok(OK)),
        row(&["--device", "cuda"], Expect::OkOrBad("cuda")),
        row(&["--device", "sim"], Expect::Bad("'sim'")),
        row(&["--steps", "4"], Expect::Ok(OK)),
        row(&["--steps", "2"], Expect::Bad("--steps 2")),
        row(&["--steps", "-2"], Expect::Bad("--steps")),
        row(&["--repeats", "2"], Expect::Ok(OK)),
        row(&["--repeats", "0"], Expect::Bad("--repeats 0")),
        row(&["--repeats", "21"], Expect::Bad("--repeats 21")),
        row(&["--demo-dim", "32"], Expect::Ok("linear-stack")),
        row(&["--demo-dim", "0"], Expect::Bad("dim (0)")),
        row(&["--json"], Expect::Ok("\"rows\"")),
        row(
            &["--encoder", &bert],
            Expect::Bad("not part of the --quick matrix"),
        ),
        full(&["--no-decoder", "--no-encoder"], Expect::Ok(OK)),
        full(&["--no-decoder", "--encoder", &bert], Expect::Ok("bert")),
        full(&["--no-encoder"], Expect::Ok("llama")),
        full(
            &["--no-decoder", "--encoder", &missing],
            Expect::Bad("none"),
        ),
        row(
            &["--cache-dir", &fixtures.file("a-file", "x")],
            Expect::Bad("a-file"),
        ),
        row(&["--traces", &fixtures.path("traces")], Expect::Ok(OK)),
        row(
            &["--traces", &fixtures.file("not-a-folder", "x")],
            Expect::Bad("--traces"),
        ),
        row(&["--help"], Expect::Ok("Usage: stagehand validate")),
        row(&["--vram-budget", "1GiB"], Expect::Bad("--vram-budget")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ]
}

#[test]
fn every_documented_validate_flag_runs_through_the_binary() {
    Table::new("validate", file!())
        .sequential()
        .default(&["--quick"])
        .default(&["--hardware", "rtx4090"])
        .default(&["--repeats", "1"])
        .default(&["--steps", "3"])
        .default(&["--demo-dim", "64"])
        .default(&["--cache-dir", &fixtures().path("cache")])
        .rows(rows())
        .run();
}
