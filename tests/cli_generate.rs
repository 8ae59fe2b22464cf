//! `stagehand generate` as users call it: the built binary run with every flag its
//! `--help` documents, at least once each (the table fails when `--help` gains a flag
//! it does not try), each row checking the exit status and one line of the output:
//! the text's on stdout, the rates' and the summary's on stderr.
//! Bad values exit 2 with one line naming the flag; none panics.

mod common;

use std::path::Path;

use common::process::output_within_deadline;

use common::cli::{
    device_rows_expecting, fixtures, row, settings_rows_expecting, Expect, Row, Table,
};

/// The rows of the Llama folder (the Qwen3-MoE folder's are in [`moe_rows`]).
fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let lora = write_lora(Path::new(&fixtures.path("q.safetensors")));
    let missing = fixtures.path("none.safetensors");
    let folder = fixtures.folder("empty");
    let ok = "generate: ";
    let mut rows = vec![
        row(&["--prompt", "hi"], Expect::Summary(ok)),
        row(&["--prompt", ""], Expect::Summary("1 prompt tokens")),
        row(
            &["--token-ids", "256,10,20"],
            Expect::Summary("3 prompt tokens"),
        ),
        row(
            &["--token-ids", "1,x"],
            Expect::Bad("`x` is not a token id"),
        ),
        row(
            &["--token-ids", "99999"],
            Expect::Bad("outside the vocabulary"),
        ),
        row(&["--max-tokens", "3"], Expect::Summary("2 tokens decoded")),
        row(
            &["--max-tokens", "4"],
            Expect::Summary("(steady: median of 3 decode steps)"),
        ),
        row(&["--max-tokens", "2"], Expect::Summary("(one decode step)")),
        row(&["--max-tokens", "1"], Expect::Summary("no token decoded")),
        row(&["--max-tokens", "1"], Expect::Summary("no steady figure")),
        row(&["--max-tokens", "0"], Expect::Bad("--max-tokens 0")),
        row(&["--max-tokens", "9000"], Expect::Bad("lower --max-tokens")),
        row(
            &["--temperature", "0.7", "--seed", "3"],
            Expect::Summary(ok),
        ),
        row(&["--temperature=-1"], Expect::Bad("--temperature")),
        row(
            &["--temperature", "0.5", "--top-p", "0.9"],
            Expect::Summary(ok),
        ),
        row(&["--top-p", "1.5"], Expect::Bad("--top-p")),
        row(&["--top-p", "0"], Expect::Bad("--top-p")),
        row(&["--seed", "-3"], Expect::Bad("--seed")),
        row(&["--lora", &lora], Expect::Summary("LoRA")),
        row(&["--lora", &missing], Expect::Bad("none.safetensors")),
        row(&["--lora", &format!("{lora}:x")], Expect::Bad("x")),
        row(&["--json"], Expect::Ok("\"tokens\"")),
        row(&["--quiet"], Expect::Without(ok)),
        row(&["--help"], Expect::Ok("Usage: stagehand generate")),
        row(&["--pin-ceiling", "1KiB"], Expect::Bad("pin_ceiling")),
        row(&["--model", &missing], Expect::Bad("none.safetensors")),
        row(&["--model", &folder], Expect::Bad("empty")),
        row(&["--model", &fixtures.bert()], Expect::Bad("bert")),
        row(&["--prompt", "hi"], Expect::Bad("--model")).bare(),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    rows.extend(settings_rows_expecting(Expect::Summary(ok)));
    rows.extend(device_rows_expecting(Expect::Summary(ok)));
    rows
}

/// The rows of the Qwen3-MoE folder: the expert cache's flags.
fn moe_rows() -> Vec<Row> {
    let moe = fixtures().moe();
    let on_moe = |args: &[&str], expect| {
        let mut all = vec!["--model", moe.as_str()];
        all.extend_from_slice(args);
        row(&all, expect)
    };
    vec![
        on_moe(&["--moe-hint", "none"], Expect::Summary("expert")),
        on_moe(&["--moe-hint", "next-layer"], Expect::Summary("expert")),
        on_moe(&["--moe-hint", "soon"], Expect::Bad("'soon'")),
        on_moe(&["--expert-policy", "lru"], Expect::Summary("expert")),
        on_moe(&["--expert-policy", "lfu"], Expect::Summary("expert")),
        on_moe(&["--expert-policy", "lfu-aging"], Expect::Summary("expert")),
        on_moe(&["--expert-policy", "mru"], Expect::Bad("'mru'")),
        on_moe(&["--expert-slots", "9"], Expect::Summary("expert")),
        on_moe(
            &["--expert-slots", "1"],
            Expect::Bad("too small for this MoE model"),
        ),
        on_moe(&["--expert-slots", "-1"], Expect::Bad("--expert-slots")),
    ]
}

/// A PEFT adapter on q_proj of every layer of the tiny Llama; its path.
fn write_lora(path: &Path) -> String {
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
    common::lora::write_f32_tensors(path, &named);
    path.display().to_string()
}

#[test]
fn every_documented_generate_flag_runs_through_the_binary() {
    Table::new("generate", file!())
        .default(&["--model", &fixtures().llama()])
        .default(&["--max-tokens", "2"])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(rows())
        .rows(moe_rows())
        .run();
}

#[test]
fn stdout_holds_the_text_and_only_it() {
    // Proves generate's stdout is the prompt then the generated text (with --quiet the
    // generated text alone, equal to the JSON's "text"), while the rates and the run
    // summary, headed `stagehand generate:`, go to stderr, which --quiet leaves empty.
    let generate = |extra: &[&str]| {
        let mut command = common::stagehand();
        command
            .args(["generate", "--model", &fixtures().llama()])
            .args(["--device", "cpu", "--log", "warn", "--max-tokens", "3"])
            .args(["--prompt", "hello"])
            .args(extra);
        let output = output_within_deadline(&mut command);
        assert!(output.status.success(), "{output:?}");
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (json, _) = generate(&["--json"]);
    let json: serde_json::Value = serde_json::from_str(&json).expect("--json prints JSON");
    let text = json["text"].as_str().expect("the JSON has the text");
    let (quiet_stdout, quiet_stderr) = generate(&["--quiet"]);
    assert_eq!(quiet_stdout, format!("{text}\n"));
    assert!(quiet_stderr.trim().is_empty(), "{quiet_stderr}");
    let (stdout, stderr) = generate(&[]);
    assert_eq!(stdout, format!("hello{text}\n"));
    assert!(stderr.starts_with("generate: "), "{stderr}");
    assert!(
        stderr.contains("\nstagehand generate: llama decoder"),
        "{stderr}"
    );
    assert!(!stderr.contains("stagehand run:"), "{stderr}");
}
