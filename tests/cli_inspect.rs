//! `stagehand inspect` as users call it: every flag its `--help` documents tried
//! through the built binary on small checkpoints (a file, a folder, an index), each
//! row checking the exit status and one line of output; bad paths exit 2 with one line
//! naming the problem, and nothing panics.

mod common;

use std::path::Path;

use common::cli::{fixtures, row, settings_rows, unopened_device_rows, Expect, Row, Table};

const OK: &str = "in 6 blocks";

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let shards = fixtures.folder("shards");
    let index = common::sharded_llama(Path::new(&shards));
    let index = index.display().to_string();
    let missing = fixtures.path("none.safetensors");
    let empty = fixtures.folder("empty");
    let not_safetensors = fixtures.file("notes.safetensors", "not a model\n");
    let mut rows = vec![
        row(&[&fixtures.linear_stack()], Expect::Ok("blocks.3")),
        row(&[&fixtures.llama()], Expect::Ok("model.layers.3")),
        row(&[&shards], Expect::Ok("model-00002-of-00002.safetensors")),
        row(&[&index], Expect::Ok("model-00002-of-00002.safetensors")),
        row(&[&fixtures.llama(), "--json"], Expect::Ok("\"schema\": 1")),
        row(&[&missing], Expect::Bad("none.safetensors")),
        row(&[&empty], Expect::Bad("empty")),
        row(&[&not_safetensors], Expect::Bad("notes.safetensors")),
        row(&[], Expect::Bad("<PATH>")),
        row(&["--help"], Expect::Ok("Usage: stagehand inspect")),
        row(
            &[&fixtures.llama(), "--unknown-flag"],
            Expect::Bad("--unknown-flag"),
        ),
    ];
    // `inspect` reads headers only: every device kind is accepted and none is touched.
    for mut setting in unopened_device_rows(OK)
        .into_iter()
        .chain(settings_rows(OK))
    {
        setting.args.insert(0, fixtures.llama());
        rows.push(setting);
    }
    rows
}

#[test]
fn every_documented_inspect_flag_runs_through_the_binary() {
    Table::new("inspect", file!())
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}
