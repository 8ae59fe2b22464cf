//! Layered settings: each layer overrides the one below, provenance names the layer,
//! and bad input names key, value and source.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use bytesize::ByteSize;
use clap::Parser;
use common::stagehand;
use stagehand::settings::{
    find_default_file, load_with, LoadOptions, Loaded, Settings, SettingsArgs, SettingsError,
    Source, KEYS,
};

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    settings: SettingsArgs,
}

fn flags(args: &[&str]) -> SettingsArgs {
    let mut argv = vec!["test"];
    argv.extend_from_slice(args);
    Flags::try_parse_from(argv).expect("flags parse").settings
}

fn shipped_default_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("config/default.toml")
}

fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect()
}

fn load(
    args: &SettingsArgs,
    default_file: Option<PathBuf>,
    env: BTreeMap<String, String>,
) -> Result<Loaded, SettingsError> {
    load_with(args, &LoadOptions { default_file, env })
}

fn source_of(loaded: &Loaded, key: &str) -> Source {
    loaded
        .provenance
        .get(key)
        .expect("every key has an origin")
        .source
        .clone()
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("deploy.toml");
    std::fs::write(&path, text).expect("config written");
    path
}

#[test]
fn no_layers_give_the_built_in_defaults() {
    // Proves an empty configuration is exactly `Settings::default()`, all from defaults.
    let loaded = load(&SettingsArgs::default(), None, BTreeMap::new()).expect("defaults load");
    assert_eq!(loaded.settings, Settings::default());
    assert!(loaded
        .provenance
        .iter()
        .all(|(_, origin)| origin.source == Source::Default));
    assert_eq!(loaded.provenance.iter().count(), KEYS.len());
}

#[test]
fn shipped_default_file_matches_built_in_defaults_and_documents_every_key() {
    // Proves config/default.toml is found, agrees with the code, and mentions every key.
    let path = find_default_file().expect("config/default.toml is found");
    let loaded = load(
        &SettingsArgs::default(),
        Some(path.clone()),
        BTreeMap::new(),
    )
    .expect("default file loads");
    assert_eq!(loaded.settings, Settings::default());
    assert_eq!(
        source_of(&loaded, "prefetch_depth"),
        Source::DefaultFile(path.clone())
    );
    let text = std::fs::read_to_string(&path).expect("readable");
    for key in KEYS {
        assert!(
            text.contains(&format!("{key} = ")),
            "default.toml documents `{key}`"
        );
    }
}

#[test]
fn each_layer_overrides_the_one_below() {
    // Proves default file < --config < env < flag, with provenance naming each layer.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(
        dir.path(),
        "prefetch_depth = 3\nreader_threads = 5\nlog = \"warn\"\nvram_budget = \"6GiB\"\n",
    );
    let environment = env(&[
        ("STAGEHAND_READER_THREADS", "6"),
        ("STAGEHAND_LOG", "debug"),
        ("UNRELATED", "x"),
    ]);
    let args = flags(&["--config", config.to_str().expect("utf8"), "--log", "error"]);
    let loaded = load(&args, Some(shipped_default_file()), environment).expect("layers load");

    assert_eq!(loaded.settings.ram_floor, ByteSize::gib(2));
    assert_eq!(
        source_of(&loaded, "ram_floor"),
        Source::DefaultFile(shipped_default_file())
    );
    assert_eq!(loaded.settings.prefetch_depth, 3);
    assert_eq!(
        source_of(&loaded, "prefetch_depth"),
        Source::ConfigFile(config.clone())
    );
    assert_eq!(loaded.settings.vram_budget, Some(ByteSize::gib(6)));
    assert_eq!(loaded.settings.reader_threads, 6);
    assert_eq!(
        source_of(&loaded, "reader_threads"),
        Source::Env("STAGEHAND_READER_THREADS".to_string())
    );
    assert_eq!(loaded.settings.log, "error");
    assert_eq!(source_of(&loaded, "log"), Source::Flag("--log".to_string()));
    assert_eq!(source_of(&loaded, "metrics_addr"), Source::Default);
}

#[test]
fn flags_parse_sizes_bools_and_addresses() {
    // Proves kebab-case flags reach their keys: sizes with units, a bare --fast-disk,
    // and a bare metrics port bound to loopback.
    let args = flags(&[
        "--vram-headroom",
        "512 MiB",
        "--fast-disk",
        "--metrics-addr",
        ":9464",
        "--device",
        "sim",
    ]);
    let loaded = load(&args, None, BTreeMap::new()).expect("flags load");
    assert_eq!(loaded.settings.vram_headroom, ByteSize::mib(512));
    assert!(loaded.settings.fast_disk);
    assert_eq!(
        loaded.settings.metrics_addr,
        Some("127.0.0.1:9464".parse().expect("addr"))
    );
    assert_eq!(loaded.settings.device, stagehand::settings::DeviceKind::Sim);
    assert_eq!(
        source_of(&loaded, "fast_disk"),
        Source::Flag("--fast-disk".to_string())
    );
}

#[test]
fn fast_disk_is_a_pair_of_switches_over_the_file() {
    // Proves --fast-disk takes no value (the next word stays a positional), --no-fast-disk
    // overrides a file's `fast_disk = true` and is named as the source, the last switch
    // given wins, and with neither the file's value stands.
    #[derive(Parser)]
    struct WithText {
        #[command(flatten)]
        settings: SettingsArgs,
        texts: Vec<String>,
    }
    let parsed = WithText::try_parse_from(["test", "--fast-disk", "A man is eating food."])
        .expect("a switch leaves the next word alone");
    assert_eq!(parsed.texts, ["A man is eating food."]);
    assert_eq!(parsed.settings.fast_disk_switch(), Some(true));
    assert!(Flags::try_parse_from(["test", "--fast-disk=false"]).is_err());

    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "fast_disk = true\n");
    let with_file = |switches: &[&str]| {
        let mut args = flags(switches);
        args.config = Some(config.clone());
        load(&args, None, BTreeMap::new()).expect("settings load")
    };
    let file_only = with_file(&[]);
    assert!(file_only.settings.fast_disk);
    assert_eq!(
        source_of(&file_only, "fast_disk"),
        Source::ConfigFile(config.clone())
    );
    let undone = with_file(&["--no-fast-disk"]);
    assert!(!undone.settings.fast_disk);
    assert_eq!(
        source_of(&undone, "fast_disk"),
        Source::Flag("--no-fast-disk".to_string())
    );
    assert!(
        with_file(&["--no-fast-disk", "--fast-disk"])
            .settings
            .fast_disk
    );
    assert!(
        !with_file(&["--fast-disk", "--no-fast-disk"])
            .settings
            .fast_disk
    );
}

#[test]
fn sizes_without_a_unit_are_refused_and_decimal_ones_noted() {
    // Proves `vram_budget = 2` in a file, STAGEHAND_PIN_CEILING=2 and --vram-budget 2 are
    // refused asking for a unit (not taken as 2 bytes), and a decimal size is taken
    // with a note showing it in binary units.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "vram_budget = 2\n");
    let args = SettingsArgs {
        config: Some(config),
        ..SettingsArgs::default()
    };
    let refusals = [
        load(&args, None, BTreeMap::new()),
        load(
            &SettingsArgs::default(),
            None,
            env(&[("STAGEHAND_PIN_CEILING", "2")]),
        ),
        load(&flags(&["--vram-budget", "2"]), None, BTreeMap::new()),
    ];
    for refused in refusals {
        let message = refused.expect_err("a bare number is refused").to_string();
        assert!(
            message.contains("a size needs a unit, e.g. 2GiB"),
            "{message}"
        );
    }
    let decimal = load(&flags(&["--vram-budget", "2GB"]), None, BTreeMap::new())
        .expect("a decimal size loads");
    assert_eq!(
        decimal.settings.vram_budget,
        Some(ByteSize::b(2_000_000_000))
    );
    let notes: Vec<(&str, &str)> = decimal.provenance.notes().collect();
    assert_eq!(notes, [("vram_budget", "2GB = 1.86 GiB")]);
}

#[test]
fn empty_value_unsets_an_optional_setting() {
    // Proves a higher layer can return an optional size to "derive it".
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), "vram_budget = \"4GiB\"\n");
    let args = flags(&[
        "--config",
        config.to_str().expect("utf8"),
        "--vram-budget",
        "",
    ]);
    let loaded = load(&args, None, BTreeMap::new()).expect("loads");
    assert_eq!(loaded.settings.vram_budget, None);
}

#[test]
fn unknown_key_in_file_names_key_value_and_file() {
    // Proves a typo in a config file is an error naming the key, value and path.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), "vram_budjet = \"4GiB\"\n");
    let args = flags(&["--config", config.to_str().expect("utf8")]);
    let error = load(&args, None, BTreeMap::new())
        .expect_err("unknown key rejected")
        .to_string();
    for needle in [
        "vram_budjet",
        "4GiB",
        &config.display().to_string(),
        "known settings",
    ] {
        assert!(error.contains(needle), "{needle:?} in {error}");
    }
}

#[test]
fn nested_table_in_file_is_reported() {
    // Proves a TOML table (keys are flat) is an unknown key, not silently ignored.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), "[vram]\nbudget = \"4GiB\"\n");
    let args = flags(&["--config", config.to_str().expect("utf8")]);
    let error = load(&args, None, BTreeMap::new())
        .expect_err("table rejected")
        .to_string();
    assert!(
        error.contains("`vram.budget`") && error.contains("did you mean `vram_budget`"),
        "{error}"
    );
}

#[test]
fn bad_value_in_env_names_the_variable() {
    // Proves an env value that does not parse names key, value and variable.
    let environment = env(&[("STAGEHAND_VRAM_BUDGET", "lots")]);
    let error = load(&SettingsArgs::default(), None, environment)
        .expect_err("bad size rejected")
        .to_string();
    for needle in ["vram_budget", "\"lots\"", "STAGEHAND_VRAM_BUDGET", "2GiB"] {
        assert!(error.contains(needle), "{needle:?} in {error}");
    }
}

#[test]
fn bad_value_in_flag_names_the_flag() {
    // Proves a flag value that does not parse names the flag.
    let args = flags(&["--prefetch-depth", "many"]);
    let error = load(&args, None, BTreeMap::new())
        .expect_err("bad count rejected")
        .to_string();
    assert!(
        error.contains("prefetch_depth")
            && error.contains("many")
            && error.contains("flag --prefetch-depth"),
        "{error}"
    );
}

#[test]
fn env_double_underscore_trap_is_detected() {
    // Proves a variable the config crate would read as a nested key is reported with
    // the single-underscore spelling, instead of being silently ignored.
    let environment = env(&[("STAGEHAND_VRAM__BUDGET", "4GiB")]);
    let error = load(&SettingsArgs::default(), None, environment)
        .expect_err("nested env rejected")
        .to_string();
    assert!(
        error.contains("STAGEHAND_VRAM__BUDGET") && error.contains("use STAGEHAND_VRAM_BUDGET"),
        "{error}"
    );
}

#[test]
fn unknown_env_variable_is_reported() {
    // Proves a misspelt STAGEHAND_ variable is an error, not ignored.
    let environment = env(&[("STAGEHAND_PREFECH_DEPTH", "4")]);
    let error = load(&SettingsArgs::default(), None, environment)
        .expect_err("unknown env rejected")
        .to_string();
    assert!(
        error.contains("prefech_depth") && error.contains("STAGEHAND_PREFECH_DEPTH"),
        "{error}"
    );
}

#[test]
fn gpu_test_switch_is_not_a_setting() {
    // Proves the GPU test suite's opt-in variable does not break settings loading.
    let environment = env(&[("STAGEHAND_GPU_TESTS", "1"), ("STAGEHAND_LOG", "warn")]);
    let loaded = load(&SettingsArgs::default(), None, environment).expect("loads");
    assert_eq!(loaded.settings.log, "warn");
}

#[test]
fn ram_floor_is_clamped_and_says_so() {
    // Proves a floor below 2 GiB is raised, with a note in the provenance.
    let args = flags(&["--ram-floor", "512MiB"]);
    let loaded = load(&args, None, BTreeMap::new()).expect("loads");
    assert_eq!(loaded.settings.ram_floor, ByteSize::gib(2));
    let origin = loaded.provenance.get("ram_floor").expect("origin");
    assert_eq!(origin.source, Source::Flag("--ram-floor".to_string()));
    assert!(
        origin
            .note
            .as_deref()
            .is_some_and(|note| note.contains("raised")),
        "{origin:?}"
    );
}

#[test]
fn validation_names_the_key_and_its_source() {
    // Proves each range rule rejects its key with the layer that set it.
    let cases: [(&[&str], &str); 9] = [
        (&["--prefetch-depth", "1000"], "prefetch_depth"),
        (&["--prefetch-depth", "65"], "prefetch_depth"),
        (&["--staging-buffers", "1"], "staging_buffers"),
        (&["--reader-threads", "0"], "reader_threads"),
        (&["--read-request-size", "1MB"], "read_request_size"),
        (&["--staging-buffer-size", "0"], "staging_buffer_size"),
        (&["--vram-budget", "0"], "vram_budget"),
        (&["--log", "stagehand=loud"], "log"),
        (&["--compute-threads", "0"], "compute_threads"),
    ];
    for (args, key) in cases {
        let error = load(&flags(args), None, BTreeMap::new())
            .expect_err("invalid value rejected")
            .to_string();
        assert!(
            error.contains(&format!("`{key}`")) && error.contains("flag --"),
            "{args:?}: {error}"
        );
    }
}

#[test]
fn metrics_addr_with_host_is_kept() {
    // Proves an explicit host is honoured and a hostname is refused with a hint.
    let loaded = load(
        &flags(&["--metrics-addr", "0.0.0.0:9100"]),
        None,
        BTreeMap::new(),
    )
    .expect("loads");
    assert_eq!(
        loaded.settings.metrics_addr,
        Some("0.0.0.0:9100".parse().expect("addr"))
    );
    let error = load(
        &flags(&["--metrics-addr", "metrics.local:9100"]),
        None,
        BTreeMap::new(),
    )
    .expect_err("hostname")
    .to_string();
    assert!(error.contains("HOST:PORT"), "{error}");
}

#[test]
fn missing_config_file_is_an_error() {
    // Proves `--config` pointing nowhere fails naming the path.
    let error = load(
        &flags(&["--config", "/nonexistent/deploy.toml"]),
        None,
        BTreeMap::new(),
    )
    .expect_err("missing")
    .to_string();
    assert!(
        error.contains("/nonexistent/deploy.toml") && error.contains("no such file"),
        "{error}"
    );
}

#[test]
fn malformed_config_file_is_one_line() {
    // Proves a TOML syntax error is reported on one line naming the file.
    let dir = tempfile::tempdir().expect("temp dir");
    let config = write_config(dir.path(), "prefetch_depth = = 3\n");
    let error = load(
        &flags(&["--config", config.to_str().expect("utf8")]),
        None,
        BTreeMap::new(),
    )
    .expect_err("syntax")
    .to_string();
    assert!(
        error.contains(&config.display().to_string()) && error.lines().count() == 1,
        "{error}"
    );
}

#[test]
fn compute_threads_is_refused_outside_one_to_the_cores_and_names_the_limit() {
    // Proves `compute_threads` 0 and one more than the machine's cores exit 2 naming
    // the key and the limit, and that a value in range is taken (what an unset value
    // chooses: `settings::tests`).
    let cores = stagehand::settings::machine_cores();
    let too_many = (cores + 1).to_string();
    for threads in ["0", too_many.as_str()] {
        let output = stagehand()
            .args(["config", "--compute-threads", threads])
            .output()
            .expect("runs");
        common::assert_bad_input(
            &output,
            &[
                "compute_threads",
                &format!("between 1 and {cores}"),
                "--compute-threads",
            ],
        );
    }
    let loaded = load(&flags(&["--compute-threads", "1"]), None, BTreeMap::new()).expect("loads");
    assert_eq!(loaded.settings.compute_threads, Some(1));
}
