//! `stagehand bench disk`: refuses bad input with exit 2 and creates nothing; on a real
//! file it measures every mode over the same bytes and reports ratios to dd.

use std::path::Path;
use std::process::{Command, Output};

fn stagehand(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .args(args)
        .output()
        .expect("run stagehand")
}

fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir")
}

#[test]
fn missing_file_is_bad_input_and_nothing_is_created() {
    // Proves: a missing FILE exits 2 naming the path, and the bench does not create it.
    let dir = disk_dir();
    let missing = dir.path().join("not-here.bin");
    let output = stagehand(&["bench", "disk", missing.to_str().expect("utf-8 path")]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("not-here.bin"), "{stderr}");
    assert!(!missing.exists(), "the bench created the missing file");
}

#[test]
fn size_past_the_end_of_the_file_is_bad_input() {
    // Proves: --size larger than the file exits 2 with a message naming --size.
    let dir = disk_dir();
    let path = dir.path().join("small.bin");
    std::fs::write(&path, vec![7u8; 8192]).expect("write");
    let output = stagehand(&[
        "bench",
        "disk",
        path.to_str().expect("utf-8 path"),
        "--size",
        "1MiB",
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--size"));
}

fn mode<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["modes"]
        .as_array()
        .expect("modes array")
        .iter()
        .find(|mode| mode["mode"] == name)
        .unwrap_or_else(|| panic!("mode {name} missing from {report}"))
}

fn write_pattern(path: &Path, bytes: usize) -> Vec<u8> {
    let contents: Vec<u8> = (0..bytes).map(|index| (index * 31 % 251) as u8).collect();
    std::fs::write(path, &contents).expect("write bench file");
    contents
}

#[test]
fn json_report_covers_every_mode_over_the_same_bytes() {
    // Proves: one run measures dd, O_DIRECT ring, cold pread and mmap over --size bytes,
    // reports memory growth per mode, and leaves the file as it was.
    let dir = disk_dir();
    let path = dir.path().join("bench.bin");
    let contents = write_pattern(&path, 6 << 20);
    let output = stagehand(&[
        "bench",
        "disk",
        path.to_str().expect("utf-8 path"),
        "--size",
        "5MiB",
        "--staging-buffer-size",
        "1MiB",
        "--request-size",
        "256KiB",
        "--rounds",
        "1",
        "--json",
    ]);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("bench prints JSON");
    assert_eq!(report["bytes"], 5 << 20);
    for name in ["o_direct_ring", "pread_cold", "mmap_touch"] {
        let measured = mode(&report, name);
        assert_eq!(measured["bytes"], 5 << 20, "{name}");
        assert!(
            measured["gb_per_second"].as_f64().expect("speed") > 0.0,
            "{name}"
        );
        assert!(measured["rss_growth_bytes"].is_i64(), "{name}");
        assert!(measured["page_cache_growth_bytes"].is_i64(), "{name}");
    }
    // dd ran over the same bytes (a dd that fails is exit 1, see below).
    let dd = mode(&report, "dd_direct");
    assert_eq!(dd["bytes"], 5 << 20, "{dd}");
    assert!(report["o_direct_ratio_to_dd"].as_f64().expect("ratio") > 0.0);
    assert_eq!(std::fs::read(&path).expect("reread"), contents);
}

#[test]
fn a_file_smaller_than_one_request_is_bad_input() {
    // Proves a 3-byte file is refused (it used to report "O_DIRECT ring / dd = 14.19").
    let dir = disk_dir();
    let path = dir.path().join("tiny.bin");
    std::fs::write(&path, b"abc").expect("write");
    let output = stagehand(&["bench", "disk", path.to_str().expect("utf-8 path")]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("less than one read request (--request-size 4 MiB)"),
        "{stderr}"
    );
}

#[test]
fn a_size_that_is_not_a_multiple_of_the_alignment_is_bad_input() {
    // Proves --size 0.5G (500,000,000 bytes, decimal) is refused with a size that works,
    // instead of splicing dd's "Invalid argument" into the table.
    let dir = disk_dir();
    let path = dir.path().join("aligned.bin");
    std::fs::write(&path, vec![1u8; 8 << 20]).expect("write");
    let output = stagehand(&[
        "bench",
        "disk",
        path.to_str().expect("utf-8 path"),
        "--size",
        "5000000",
    ]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("not a multiple of 4 KiB"), "{stderr}");
    assert!(stderr.contains("--size 4MiB"), "{stderr}");
}

#[test]
fn a_failing_dd_is_one_line_and_exit_1() {
    // Proves the reference's failure ends the bench (no ratios without it), in one
    // line: a `dd` that prints two lines of errors and fails is first on PATH.
    let dir = disk_dir();
    let path = dir.path().join("bench.bin");
    write_pattern(&path, 1 << 20);
    let fake = dir.path().join("bin");
    std::fs::create_dir(&fake).expect("mkdir");
    let dd = fake.join("dd");
    std::fs::write(&dd, "#!/bin/sh\necho 'dd: error reading: Invalid argument' >&2\necho '0+0 records in' >&2\nexit 1\n")
        .expect("write fake dd");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dd, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path_variable = format!(
        "{}:{}",
        fake.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new(env!("CARGO_BIN_EXE_stagehand"))
        .args([
            "bench",
            "disk",
            path.to_str().expect("utf-8 path"),
            "--request-size",
            "256KiB",
        ])
        .env("PATH", path_variable)
        .output()
        .expect("run stagehand");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("dd: error reading: Invalid argument / 0+0 records in"),
        "{stderr}"
    );
    assert!(output.stdout.is_empty(), "no table without the reference");
}
