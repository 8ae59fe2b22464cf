//! `stagehand config` as users call it: every flag its `--help` documents tried through
//! the built binary, each row checking the exit status and the line that shows the
//! setting; bad values exit 2 with one line naming the key, and nothing panics.

mod common;

use common::cli::{row, settings_rows, unopened_device_rows, Expect, Row, Table};

fn rows() -> Vec<Row> {
    let mut rows = vec![
        row(&[], Expect::Ok("set by")),
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
