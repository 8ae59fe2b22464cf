//! `stagehand calibrate` as users call it: every flag its `--help` documents tried
//! through the built binary (quick measurements: the copies alone, or, for the shared
//! settings' rows, 1 MiB of disk reads; one row writes a whole profile), each row checking the exit status
//! and one line of output; bad values exit 2 with one line naming the problem before
//! anything is measured, and nothing panics.

mod common;

use common::cli::{fixtures, row, settings_rows, Expect, Row, Table};

const OK: &str = "\"copies\"";

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let scratch = fixtures.folder("scratch");
    let file = fixtures.file("scratch/read-me.bin", &"x".repeat(1 << 20));
    let profile = fixtures.path("local.toml");
    let missing = fixtures.path("none");
    let whole = ["--measure", "copy,disk,compute", "--disk-bytes", "4MiB"];
    let disk = |args: &[&str], expect| {
        let mut all = vec!["--measure", "disk", "--disk-bytes", "1MiB"];
        all.extend_from_slice(args);
        row(&all, expect)
    };
    let mut rows = vec![
        row(&["--measure", "copy"], Expect::Ok(OK)),
        row(&["--measure", "gpu"], Expect::Bad("'gpu'")),
        row(
            &[&whole[..], &["--out", &profile, "--dir", &scratch]].concat(),
            Expect::Exit(0, "calibrate: wrote"),
        ),
        row(
            &["--measure", "copy", "--out", &profile],
            Expect::Bad("--out writes a whole profile"),
        ),
        row(
            &[&whole[..], &["--out", &scratch]].concat(),
            Expect::Bad("a folder"),
        ),
        row(
            &[&whole[..], &["--out", &format!("{missing}/p.toml")]].concat(),
            Expect::Bad("does not exist"),
        ),
        disk(&["--dir", &scratch], Expect::Ok("\"buffered_cold\"")),
        disk(&["--dir", &missing], Expect::Bad("not a folder")),
        disk(&["--dir", &file], Expect::Bad("not a folder")),
        disk(&["--file", &file], Expect::Ok("\"buffered_cold\"")),
        disk(&["--file", &scratch], Expect::Bad("not a regular file")),
        disk(
            &["--file", &file, "--dir", &scratch],
            Expect::Bad("cannot be used with"),
        ),
        row(&["--disk-bytes", "0"], Expect::Bad("--disk-bytes 0")),
        row(&["--disk-bytes", "lots"], Expect::Bad("lots")),
        row(&["--help"], Expect::Ok("Usage: stagehand calibrate")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
        row(&["--device", "cpu"], Expect::Ok(OK)),
        row(&["--device", "auto"], Expect::Ok(OK)),
        row(&["--device", "sim"], Expect::Bad("simulate")),
        row(&["--device", "cuda"], Expect::OkOrBad("CUDA")),
        row(&["--device", "tpu"], Expect::Bad("tpu")),
        // The roofline alone (this unoptimised build caches nothing).
        row(&["--roofline"], Expect::Ok("memory_bytes_per_second")).bare(),
        row(&["--roofline", "--quick"], Expect::Bad("--quick")).bare(),
    ];
    // The settings' rows measure the disk (1 MiB, ~0.2 s), the part the storage
    // settings configure, instead of the copies (~10 s each on the unoptimised build,
    // sequential: ~3 of this table's ~4 minutes).
    for mut settings_row in settings_rows("\"buffered_cold\"") {
        if settings_row.defaults {
            let on_the_disk = ["--measure", "disk", "--disk-bytes", "1MiB"];
            settings_row
                .args
                .splice(0..0, on_the_disk.map(String::from));
        }
        rows.push(settings_row);
    }
    rows
}

#[test]
fn every_documented_calibrate_flag_runs_through_the_binary() {
    Table::new("calibrate", file!())
        .sequential()
        .default(&["--quick"])
        .default(&["--json"])
        .default(&["--measure", "copy"])
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}
