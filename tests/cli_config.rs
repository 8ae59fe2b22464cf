//! `stagehand config` as users call it: every flag its `--help` documents tried through
//! the built binary, each row checking the exit status and the line that shows the
//! setting; bad values exit 2 with one line naming the key, and nothing panics. With
//! `--model` it also shows what a run on that model would use.

mod common;

use common::cli::{fixtures, row, settings_rows, unopened_device_rows, Expect, Row, Table};

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let (linear_stack, bert) = (fixtures.linear_stack(), fixtures.bert());
    let mut rows = vec![
        row(&[], Expect::Ok("set by")),
        // --model: what a run on it would use, computed as `run` computes it.
        row(
            &["--model", &linear_stack],
            Expect::Ok("automatic: 40 % of the streamed model"),
        ),
        row(
            &["--model", &bert],
            Expect::Ok("bert encoder (the bytes it streams)"),
        ),
        row(
            &["--model", &bert, "--vram-budget", "1GiB"],
            Expect::Ok("set by flag --vram-budget"),
        ),
        row(
            &["--model", &bert, "--prefetch-depth", "1"],
            Expect::Ok("set by flag --prefetch-depth"),
        ),
        row(&["--model", &bert, "--json"], Expect::Ok("\"run\": [")),
        row(
            &["--model", &fixtures.path("none.safetensors")],
            Expect::Bad("none.safetensors"),
        ),
        row(&["--json"], Expect::Ok("\"sources\"")),
        row(&["--vram-budget", "3GiB"], Expect::Ok("flag --vram-budget")),
        row(&["--help"], Expect::Ok("Usage: stagehand config")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
        row(&["positional"], Expect::Bad("positional")),
    ];
    // `config` shows what a run would use: every device kind is shown, none is opened.
    rows.extend(unopened_device_rows("flag --device"));
    rows.extend(settings_rows("set by"));
    rows
}

#[test]
fn every_documented_config_flag_runs_through_the_binary() {
    Table::new("config", file!()).rows(rows()).run();
}
