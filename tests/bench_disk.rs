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
    // dd either ran over the same bytes (then every mode has a ratio) or says why not.
    let dd = mode(&report, "dd_direct");
    if dd["bytes"] == 5 << 20 {
        assert!(report["o_direct_ratio_to_dd"].as_f64().expect("ratio") > 0.0);
    } else {
        assert!(!dd["notes"].as_array().expect("notes").is_empty(), "{dd}");
    }
    assert_eq!(std::fs::read(&path).expect("reread"), contents);
}
