//! `stagehand generate` as users call it: the built binary run with every flag its
//! `--help` documents, at least once each (the table fails when `--help` gains a flag
//! it does not try), each row checking the exit status and one line of the output.
//! Bad values exit 2 with one line naming the flag; none panics.

mod common;

use std::path::Path;
use std::process::Output;

use common::decoder::tiny_decoder;
use common::stagehand;
use stagehand::compute::DType;
use stagehand::model::generated::DecoderArch;

/// What a row expects.
enum Expect {
    /// Exit 0, and a line of stdout containing this.
    Ok(&'static str),
    /// Exit 2, one line of stderr containing this, no panic.
    Bad(&'static str),
    /// Exit 0 or 2 (`--device cuda`: 0 on a GPU machine, 2 here), no panic.
    OkOrBad(&'static str),
}

/// A row: which folder (`moe`: the Qwen3-MoE one), the flags, what it expects.
struct Row {
    moe: bool,
    args: Vec<String>,
    expect: Expect,
}

fn row(moe: bool, args: &[&str], expect: Expect) -> Row {
    Row {
        moe,
        args: args.iter().map(|arg| arg.to_string()).collect(),
        expect,
    }
}

/// Every row, with `FILE` paths of `dir` put in.
fn rows(dir: &Path) -> Vec<Row> {
    let path = |name: &str| dir.join(name).display().to_string();
    let (lora, config, trace) = (path("q.safetensors"), path("c.toml"), path("t.json"));
    let mut rows = vec![
        row(false, &["--prompt", "hi"], Expect::Ok("generate: ")),
        row(
            false,
            &["--token-ids", "256,10,20"],
            Expect::Ok("3 prompt tokens"),
        ),
        row(
            false,
            &["--token-ids", "1,x"],
            Expect::Bad("`x` is not a token id"),
        ),
        row(
            false,
            &["--token-ids", "99999"],
            Expect::Bad("outside the vocabulary"),
        ),
        row(
            false,
            &["--max-tokens", "3"],
            Expect::Ok("2 tokens decoded"),
        ),
        row(false, &["--max-tokens", "0"], Expect::Bad("--max-tokens 0")),
        row(
            false,
            &["--max-tokens", "9000"],
            Expect::Bad("lower --max-tokens"),
        ),
        row(
            false,
            &["--temperature", "0.7", "--seed", "3"],
            Expect::Ok("generate: "),
        ),
        row(false, &["--temperature=-1"], Expect::Bad("--temperature")),
        row(
            false,
            &["--temperature", "0.5", "--top-p", "0.9"],
            Expect::Ok("generate: "),
        ),
        row(false, &["--top-p", "1.5"], Expect::Bad("--top-p")),
        row(true, &["--moe-hint", "none"], Expect::Ok("expert")),
        row(true, &["--moe-hint", "next-layer"], Expect::Ok("expert")),
        row(true, &["--moe-hint", "soon"], Expect::Bad("'soon'")),
        row(true, &["--expert-policy", "lru"], Expect::Ok("expert")),
        row(true, &["--expert-policy", "lfu"], Expect::Ok("expert")),
        row(
            true,
            &["--expert-policy", "lfu-aging"],
            Expect::Ok("expert"),
        ),
        row(true, &["--expert-slots", "9"], Expect::Ok("expert")),
        row(
            true,
            &["--expert-slots", "1"],
            Expect::Bad("too small for this MoE model"),
        ),
        // The automatic budget leaves no room for the adapter's factors (it exits 1
        // and names a smaller budget than it had): a budget is given here.
        row(false, &["--lora", &lora], Expect::Ok("LoRA")),
        row(
            false,
            &["--lora", &path("none.safetensors")],
            Expect::Bad("none.safetensors"),
        ),
        row(false, &["--json"], Expect::Ok("\"tokens\"")),
        row(false, &["--quiet"], Expect::Ok("generate: ")),
        row(false, &["--help"], Expect::Ok("Usage: stagehand generate")),
        row(false, &["--config", &config], Expect::Ok("generate: ")),
        row(
            false,
            &["--config", &path("none.toml")],
            Expect::Bad("none.toml"),
        ),
        row(false, &["--vram-budget", "64MiB"], Expect::Ok("generate: ")),
        row(
            false,
            &["--vram-budget", "lots"],
            Expect::Bad("vram_budget"),
        ),
        row(false, &["--reserve-vram", "0MiB"], Expect::Ok("generate: ")),
        row(
            false,
            &["--vram-headroom", "1GiB"],
            Expect::Ok("generate: "),
        ),
        row(false, &["--pin-ceiling", "64MiB"], Expect::Ok("generate: ")),
        row(
            false,
            &["--pin-ceiling", "1KiB"],
            Expect::Bad("pin_ceiling"),
        ),
        row(false, &["--ram-floor", "2GiB"], Expect::Ok("generate: ")),
        row(false, &["--fast-disk"], Expect::Ok("generate: ")),
        row(false, &["--fast-disk", "false"], Expect::Ok("generate: ")),
        row(false, &["--prefetch-depth", "1"], Expect::Ok("generate: ")),
        row(
            false,
            &["--prefetch-depth", "65"],
            Expect::Bad("prefetch_depth"),
        ),
        row(
            false,
            &["--metrics-addr", "127.0.0.1:0"],
            Expect::Ok("generate: "),
        ),
        row(
            false,
            &["--metrics-addr", "nowhere:x"],
            Expect::Bad("metrics"),
        ),
        row(false, &["--trace", &trace], Expect::Ok("generate: ")),
        row(false, &["--log", "warn"], Expect::Ok("generate: ")),
        row(false, &["--log", "[[["], Expect::Bad("not a log filter")),
        row(
            false,
            &["--block-pattern", r"layers\.(\d+)\."],
            Expect::Ok("generate: "),
        ),
        row(
            false,
            &["--block-pattern", "("],
            Expect::Bad("not a valid regex"),
        ),
        row(false, &["--staging-buffers", "2"], Expect::Ok("generate: ")),
        row(
            false,
            &["--staging-buffers", "1"],
            Expect::Bad("staging_buffers"),
        ),
        row(
            false,
            &["--staging-buffer-size", "4MiB"],
            Expect::Ok("generate: "),
        ),
        row(
            false,
            &["--staging-buffer-size", "1000"],
            Expect::Bad("multiple of 4 KiB"),
        ),
        row(
            false,
            &["--read-request-size", "1MiB"],
            Expect::Ok("generate: "),
        ),
        row(
            false,
            &["--read-request-size", "3KiB"],
            Expect::Bad("read_request_size"),
        ),
        row(false, &["--reader-threads", "2"], Expect::Ok("generate: ")),
        row(
            false,
            &["--reader-threads", "0"],
            Expect::Bad("reader_threads"),
        ),
        row(false, &["--compute-threads", "1"], Expect::Ok("generate: ")),
        row(
            false,
            &["--compute-threads", "0"],
            Expect::Bad("compute_threads"),
        ),
        row(false, &["--verify", "full"], Expect::Ok("generate: ")),
        row(false, &["--verify", "weights"], Expect::Ok("generate: ")),
        row(
            false,
            &["--verify", "sometimes"],
            Expect::Bad("full, first, weights, off"),
        ),
        row(false, &["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    // These choose the device themselves (the other rows run on the CPU).
    for (device, expect) in [
        ("cpu", Expect::Ok("generate: ")),
        ("auto", Expect::Ok("generate: ")),
        ("sim", Expect::Bad("simulate")),
        ("cuda", Expect::OkOrBad("cuda")),
    ] {
        rows.push(row(false, &["--device", device], expect));
    }
    rows
}

/// A PEFT adapter on q_proj of every layer of the tiny Llama, and a config file.
fn write_inputs(dir: &Path) {
    let mut tensors = Vec::new();
    for layer in 0..4 {
        let module = format!("base_model.model.model.layers.{layer}.self_attn.q_proj");
        let ramp =
            |count: usize| -> Vec<f32> { (0..count).map(|i| (i % 7) as f32 * 0.01).collect() };
        tensors.push((format!("{module}.lora_A.weight"), vec![4, 128], ramp(512)));
        tensors.push((format!("{module}.lora_B.weight"), vec![128, 4], ramp(512)));
    }
    let named: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(name, shape, values)| (name.as_str(), shape.clone(), values.clone()))
        .collect();
    common::lora::write_f32_tensors(&dir.join("q.safetensors"), &named);
    std::fs::write(dir.join("c.toml"), "prefetch_depth = 1\n").unwrap();
}

fn check(row: &Row, output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let shown = format!(
        "{:?}: exit {:?}\nstdout: {stdout}\nstderr: {stderr}",
        row.args,
        output.status.code()
    );
    assert!(!stderr.contains("panicked"), "no panic: {shown}");
    let bad = |needle: &str| {
        assert_eq!(output.status.code(), Some(2), "exit 2: {shown}");
        let lines: Vec<&str> = stderr
            .lines()
            .filter(|line| !line.trim().is_empty())
            .collect();
        let first = lines.first().copied().unwrap_or("");
        assert!(
            first.contains(needle),
            "the first line names {needle:?}: {shown}"
        );
        // clap's usage errors add usage and "For more information"; ours are one line.
        if !stderr.contains("For more information") {
            assert_eq!(lines.len(), 1, "one line: {shown}");
        }
    };
    match row.expect {
        Expect::Ok(needle) => {
            assert_eq!(output.status.code(), Some(0), "exit 0: {shown}");
            assert!(
                stdout.lines().any(|line| line.contains(needle)),
                "a line with {needle:?}: {shown}"
            );
        }
        Expect::Bad(needle) => bad(needle),
        Expect::OkOrBad(needle) if output.status.code() == Some(2) => bad(needle),
        Expect::OkOrBad(_) => assert_eq!(output.status.code(), Some(0), "{shown}"),
    }
}

/// The long flags `stagehand generate --help` documents.
fn documented_flags() -> Vec<String> {
    let output = stagehand().args(["generate", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&output.stdout).into_owned();
    let mut flags: Vec<String> = help
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("--"))
        .map(|flag| {
            let end = flag.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
            format!("--{}", &flag[..end.unwrap_or(flag.len())])
        })
        .filter(|flag| flag.len() > 2)
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

#[test]
fn every_documented_generate_flag_runs_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let llama = tiny_decoder(&dir.path().join("llama"), DecoderArch::Llama, DType::F32, 5);
    let moe = tiny_decoder(
        &dir.path().join("moe"),
        DecoderArch::Qwen3Moe,
        DType::F32,
        5,
    );
    write_inputs(dir.path());
    let rows = rows(dir.path());
    // Every row names the folder with --model.
    let tried: Vec<&str> = rows
        .iter()
        .flat_map(|row| row.args.iter().map(String::as_str))
        .chain(["--model"])
        .collect();
    let untried: Vec<String> = documented_flags()
        .into_iter()
        .filter(|flag| {
            !tried
                .iter()
                .any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
        })
        .collect();
    assert!(
        untried.is_empty(),
        "documented flags no row tries: {untried:?}"
    );
    for row in &rows {
        let mut command = stagehand();
        command
            .arg("generate")
            .arg("--model")
            .arg(if row.moe { &moe } else { &llama });
        if !row.args.iter().any(|arg| arg == "--device") {
            command.args(["--device", "cpu"]);
        }
        for (flag, value) in [("--max-tokens", "2"), ("--log", "warn")] {
            if !row.args.iter().any(|arg| arg == flag) {
                command.args([flag, value]);
            }
        }
        let output = command.args(&row.args).output().unwrap();
        check(row, &output);
    }
}
