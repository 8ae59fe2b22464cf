//! Settings as the binary shows and takes them: `stagehand config` (sources, sizes,
//! JSON), defaults built into the binary, and bad values refused in one line.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use common::stagehand;
use stagehand::settings::Settings;

#[test]
fn the_defaults_are_built_in_not_read_from_the_source_tree() {
    // Proves a binary run outside the checkout takes every default from what it was
    // built with (all sources `default`, the values `Settings::default()`), not from
    // the config/default.toml of the tree it was built in, and that the compiled-in
    // text is that file.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let output = stagehand()
        .args(["config", "--json"])
        .current_dir(elsewhere.path())
        .output()
        .expect("the binary starts");
    assert!(output.status.success(), "{output:?}");
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("config --json prints JSON");
    for (key, origin) in report["sources"].as_object().expect("sources") {
        assert_eq!(origin["layer"], "default", "{key}: {origin}");
    }
    let built_in = serde_json::to_value(Settings::default()).expect("settings serialize");
    assert_eq!(report["settings"], built_in);
    let shipped =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml"))
            .expect("the shipped file");
    assert_eq!(stagehand::settings::BUILT_IN_DEFAULTS_TOML, shipped);
}

#[test]
fn config_command_prints_sources_and_fails_cleanly() {
    // Proves `stagehand config` shows each layer and exits 2 on a bad env value.
    let output = stagehand()
        .args(["config", "--json", "--prefetch-depth", "4"])
        .env("STAGEHAND_READER_THREADS", "8")
        .output()
        .expect("runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    assert_eq!(report["settings"]["prefetch_depth"], 4);
    assert_eq!(report["sources"]["prefetch_depth"]["layer"], "flag");
    assert_eq!(
        report["sources"]["reader_threads"]["name"],
        "STAGEHAND_READER_THREADS"
    );
    assert_eq!(report["sources"]["ram_floor"]["layer"], "default_file");

    let table = stagehand()
        .args(["config", "--ram-floor", "1GiB"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("flag --ram-floor (raised from"), "{text}");

    let bad = stagehand()
        .arg("config")
        .env("STAGEHAND_FAST_DISK", "maybe")
        .output()
        .expect("runs");
    common::assert_bad_input(&bad, &["fast_disk", "maybe", "STAGEHAND_FAST_DISK"]);
}

#[test]
fn log_filters_that_crashed_the_filter_parser_are_refused_not_a_panic() {
    // Proves the input the settings fuzz target found (fuzz/artifacts, crash-0296…: a
    // `STAGEHAND_LOG` with a leading form feed and non-ASCII bytes, which panicked
    // inside tracing-subscriber's filter parser) is bad input naming `log`, in the
    // library and at the command line.
    let fuzzed = BTreeMap::from([(
        "STAGEHAND_LOG".to_string(),
        "\u{c}AderD2\u{0}\u{fffd}\u{fffd}\u{fffd}=,,ORE1stng_buffers".to_string(),
    )]);
    let error = stagehand::settings::load_layers("", &fuzzed).expect_err("refused");
    assert!(error.to_string().contains("log"), "{error}");

    let output = stagehand()
        .args(["config", "--log", "\u{c}ab\u{e9}=info"])
        .output()
        .expect("runs");
    common::assert_bad_input(&output, &["log"]);
    for accepted in ["info", "warn,stagehand=debug", "stagehand[run]=trace"] {
        let output = stagehand()
            .args(["config", "--log", accepted])
            .output()
            .expect("runs");
        assert_eq!(output.status.code(), Some(0), "{accepted}");
    }
}

#[test]
fn config_shows_sizes_one_way_and_json_carries_integer_bytes() {
    // Proves `config` uses the same size format as `run` (8G is 7.45 GiB, not "7.5 GiB")
    // and `config --json` gives scripts integer bytes, not text.
    let table = stagehand()
        .args(["config", "--vram-budget", "8G"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.lines()
            .any(|line| line.starts_with("vram_budget") && line.contains("7.45 GiB")),
        "{text}"
    );
    let output = stagehand()
        .args(["config", "--json", "--vram-budget", "8G"])
        .output()
        .expect("runs");
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let settings = &report["settings"];
    assert_eq!(settings["vram_budget"], 8_000_000_000u64);
    assert_eq!(settings["pin_ceiling"], serde_json::Value::Null);
    for key in [
        "reserve_vram",
        "vram_headroom",
        "ram_floor",
        "staging_buffer_size",
        "read_request_size",
    ] {
        assert!(settings[key].is_u64(), "{key}: {}", settings[key]);
    }
}
