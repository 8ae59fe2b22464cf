//! `stagehand embed` as users call it: every flag its `--help` documents tried through
//! the built binary on the tiny generated BERT folder, each row checking the exit
//! status and one line of output; bad values exit 2 with one line naming the problem,
//! and nothing panics.

mod common;

use common::cli::{device_rows, fixtures, row, settings_rows, Expect, Row, Table};
use common::process::output_within_deadline;

const OK: &str = "values, norm";

fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let lora = fixtures.bert_lora();
    let texts = fixtures.file(
        "texts.txt",
        "A man is eating food.\nA man is riding a horse.\n",
    );
    let empty = fixtures.file("empty.txt", "");
    let missing = fixtures.path("none.txt");
    let folder = fixtures.folder("empty");
    // The PEFT adapter folder around the adapter file (adapter_config.json beside it).
    let lora_folder = std::path::Path::new(&lora)
        .parent()
        .expect("the adapter's folder")
        .display()
        .to_string();
    let mut rows = vec![
        row(&["one text"], Expect::Ok(OK)),
        row(&["one text", "another text"], Expect::Ok("cosine")),
        row(&[], Expect::Bad("no text to embed")),
        row(&["--file", &texts], Expect::Ok("[2]")),
        row(&["--file", &empty], Expect::Bad("no text to embed")),
        row(&["--file", &missing], Expect::Bad("none.txt")),
        row(&["--file", &folder], Expect::Bad("empty")),
        row(&["--token-ids", "101,7,102"], Expect::Ok(OK)),
        row(
            &["--token-ids", "101,7,102", "--token-ids", "101,8,102"],
            Expect::Ok("[2]"),
        ),
        row(
            &["--token-ids", "101,7592,102"],
            Expect::Bad("outside the model's vocabulary"),
        ),
        row(&["--token-ids", "101,x"], Expect::Bad("x")),
        row(&["--token-ids", ""], Expect::Bad("--token-ids")),
        row(&["--batch", "1", "a", "b"], Expect::Ok("[2]")),
        row(&["--batch", "0", "a"], Expect::Bad("--batch")),
        row(&["--batch", "-2", "a"], Expect::Bad("--batch")),
        row(&["--lora", &lora, "a"], Expect::Summary("LoRA")),
        row(
            &["--lora", &format!("{lora}:0.5"), "a"],
            Expect::Summary("LoRA"),
        ),
        row(&["--lora", &lora_folder, "a"], Expect::Summary("LoRA")),
        row(
            &["--lora", &folder, "a"],
            Expect::Bad("adapter_config.json"),
        ),
        row(&["--lora", &missing, "a"], Expect::Bad("none.txt")),
        row(
            &["--lora", &fixtures.linear_lora(), "a"],
            Expect::Bad("LoRA"),
        ),
        row(&["--embeddings", "auto", "a"], Expect::Ok(OK)),
        row(&["--embeddings", "host", "a"], Expect::Ok(OK)),
        row(&["--embeddings", "device", "a"], Expect::Ok(OK)),
        row(&["--embeddings", "gpu", "a"], Expect::Bad("'gpu'")),
        row(&["--json", "a"], Expect::Ok("\"texts\"")),
        row(&["--quiet", "a"], Expect::Ok(OK)),
        row(&["--quiet", "a"], Expect::Without("stagehand embed:")),
        // The summary, on stderr, is headed by the command; one batch is one step,
        // which gives no steady figure.
        row(
            &["a"],
            Expect::Summary("stagehand embed: bert encoder, 1 step"),
        ),
        row(&["a"], Expect::Summary("no steady figure")),
        // --fast-disk is a switch: the text after it is a text, not its value.
        row(
            &["--fast-disk", "A man is eating food."],
            Expect::Ok("A man is eating food."),
        ),
        row(&["--help"], Expect::Ok("Usage: stagehand embed")),
        row(&["--model", &missing, "a"], Expect::Bad("none.txt")),
        row(&["--model", &folder, "a"], Expect::Bad("empty")),
        row(
            &["--model", &fixtures.llama(), "a"],
            Expect::Bad("not an encoder"),
        ),
        row(&["a"], Expect::Bad("--model")).bare(),
        row(&["--unknown-flag", "a"], Expect::Bad("--unknown-flag")),
    ];
    // The settings and device rows with a text to embed.
    for mut setting in settings_rows(OK).into_iter().chain(device_rows(OK)) {
        setting.args.insert(0, "a text".to_string());
        rows.push(setting);
    }
    rows
}

#[test]
fn every_documented_embed_flag_runs_through_the_binary() {
    Table::new("embed", file!())
        .default(&["--model", &fixtures().bert()])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(rows())
        .run();
}

#[test]
fn stdout_holds_the_results_and_only_them() {
    // Proves embed's stdout is its results alone (with --quiet: the embeddings and the
    // similarity table, byte for byte the lines of a plain run's stdout), the summary
    // goes to stderr headed `stagehand embed:`, and --quiet leaves the summary out.
    let embed = |extra: &[&str]| {
        let mut command = common::stagehand();
        command
            .args(["embed", "--model", &fixtures().bert()])
            .args(["--device", "cpu", "--log", "warn"])
            .args(extra)
            .args(["A man is eating food.", "A man is riding a horse."]);
        let output = output_within_deadline(&mut command);
        assert!(output.status.success(), "{output:?}");
        (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (stdout, stderr) = embed(&[]);
    let (quiet_stdout, quiet_stderr) = embed(&["--quiet"]);
    assert_eq!(stdout, quiet_stdout, "--quiet changes no result");
    assert!(quiet_stderr.trim().is_empty(), "{quiet_stderr}");
    assert!(
        stderr.starts_with("stagehand embed: bert encoder"),
        "{stderr}"
    );
    // Two texts: a header and a values line each, the similarity title, its column
    // numbers and one row per text.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2 * 2 + 2 + 2, "{stdout}");
    assert!(
        lines[0].starts_with("[1] A man is eating food."),
        "{stdout}"
    );
    assert!(lines[1].contains("values, norm"), "{stdout}");
    assert!(
        lines[2].starts_with("[2] A man is riding a horse."),
        "{stdout}"
    );
    assert_eq!(lines[4], "cosine similarity:", "{stdout}");
    for summary_word in ["stagehand", "vram", "step time", "peak", "efficiency"] {
        assert!(!stdout.contains(summary_word), "{summary_word}: {stdout}");
    }
}
