//! `stagehand run`, and plain `stagehand` (the same flags), as users call them: every
//! flag their `--help` documents tried through the built binary on small models, each
//! row checking the exit status and one line of output; bad values exit 2 with one
//! line naming the problem, and nothing panics.

mod common;

use common::cli::{device_rows, fixtures, row, settings_rows, Expect, Row, Table};

const OK: &str = "stagehand run: ";

fn rows(subcommand: &str) -> Vec<Row> {
    let fixtures = fixtures();
    let lora = fixtures.linear_lora();
    let cache = fixtures.path("cache");
    let missing = fixtures.path("none.safetensors");
    let folder = fixtures.folder("empty");
    let not_safetensors = fixtures.file("notes.txt", "not a model\n");
    let (bert, llama) = (fixtures.bert(), fixtures.llama());
    // The generated MoE demo model, written to the cache folder by the first row.
    let moe = |args: &[&str], expect| {
        let mut all = vec!["--workload", "moe", "--cache-dir", cache.as_str()];
        all.extend_from_slice(&["--device", "cpu", "--log", "warn"]);
        all.extend_from_slice(args);
        row(&all, expect).bare()
    };
    let mut rows = vec![
        row(&["--workload", "auto"], Expect::Ok("linear-stack")),
        row(&["--workload", "linear-stack"], Expect::Ok("linear-stack")),
        row(
            &["--workload", "stream-verify"],
            Expect::Ok("checked bytes only"),
        ),
        row(
            &["--workload", "encoder", "--model", &bert],
            Expect::Ok("bert encoder"),
        ),
        row(
            &["--workload", "decoder", "--model", &llama],
            Expect::Ok("llama decoder"),
        ),
        row(
            &["--workload", "encoder", "--model", &llama],
            Expect::Bad("not an encoder"),
        ),
        row(&["--workload", "encoder"], Expect::Bad("bare checkpoint")),
        row(
            &["--workload", "moe"],
            Expect::Bad("not a generated MoE model"),
        ),
        row(&["--workload", "mlp"], Expect::Bad("'mlp'")),
        moe(&["--steps", "1"], Expect::Ok("moe")),
        moe(
            &["--steps", "1", "--expert-policy", "lru"],
            Expect::Ok("expert"),
        ),
        moe(
            &["--steps", "1", "--expert-policy", "lfu"],
            Expect::Ok("expert"),
        ),
        moe(
            &["--steps", "1", "--expert-policy", "lfu-aging"],
            Expect::Ok("expert"),
        ),
        moe(
            &["--steps", "1", "--expert-policy", "mru"],
            Expect::Bad("'mru'"),
        ),
        moe(
            &["--steps", "1", "--moe-hint", "none"],
            Expect::Ok("expert"),
        ),
        moe(
            &["--steps", "1", "--moe-hint", "next-layer"],
            Expect::Ok("expert"),
        ),
        moe(
            &["--steps", "1", "--moe-hint", "soon"],
            Expect::Bad("'soon'"),
        ),
        moe(
            &["--steps", "1", "--expert-slots", "12"],
            Expect::Ok("expert"),
        ),
        moe(
            &["--steps", "1", "--expert-slots", "1"],
            Expect::Bad("too small"),
        ),
        moe(
            &["--steps", "1", "--expert-slots", "-1"],
            Expect::Bad("--expert-slots"),
        ),
        row(
            &["--model", &bert, "--embeddings", "auto"],
            Expect::Ok("bert encoder"),
        ),
        row(
            &["--model", &bert, "--embeddings", "host"],
            Expect::Ok("bert encoder"),
        ),
        row(
            &["--model", &bert, "--embeddings", "device"],
            Expect::Ok("bert encoder"),
        ),
        row(
            &["--model", &bert, "--embeddings", "gpu"],
            Expect::Bad("'gpu'"),
        ),
        row(&["--model", &missing], Expect::Bad("none.safetensors")),
        row(&["--model", &folder], Expect::Bad("empty")),
        row(&["--model", &not_safetensors], Expect::Bad("notes.txt")),
        row(&["--steps", "3"], Expect::Ok("3 steps")),
        row(&["--steps", "3"], Expect::Ok("(median of 2 steps)")),
        // One step is cold: it gives no steady figure, nor a "median" of itself.
        row(&["--steps", "1"], Expect::Ok("no steady figure")),
        row(&["--steps", "2"], Expect::Ok("(the second step)")),
        // 0 runs until Ctrl-C: SIGTERM stops it at the next step.
        row(&["--steps", "0", "--log", "info"], Expect::Runs("ran in")),
        row(&["--steps", "-1"], Expect::Bad("--steps")),
        row(&["--steps", "x"], Expect::Bad("--steps")),
        row(&["--batch", "2"], Expect::Ok(OK)),
        row(&["--batch", "0"], Expect::Bad("batch")),
        row(&["--policy", "planned"], Expect::Ok(OK)),
        row(&["--policy", "lru"], Expect::Ok(OK)),
        row(&["--policy", "mru"], Expect::Bad("'mru'")),
        // The automatic budget, with the adapter's regions beside the model's blocks.
        row(&["--lora", &lora], Expect::Ok("LoRA")),
        row(&["--lora", &format!("{lora}:0.5")], Expect::Ok("LoRA")),
        row(&["--lora", &format!("{lora}:x")], Expect::Bad("x")),
        row(&["--lora", &missing], Expect::Bad("none.safetensors")),
        row(&["--lora", &folder], Expect::Bad("empty")),
        row(
            &["--block-pattern", r"(linear\d)"],
            Expect::Bad("grouped into block"),
        ),
        row(&["--json"], Expect::Ok("\"workload\": \"linear-stack\"")),
        row(&["--quiet"], Expect::Ok(OK)),
        row(&["--help"], Expect::Ok("--workload")),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    rows.push(if subcommand.is_empty() {
        row(&["--version"], Expect::Ok("stagehand "))
    } else {
        row(&["--version"], Expect::Bad("--version"))
    });
    rows.extend(settings_rows(OK));
    rows.extend(device_rows(OK));
    rows
}

fn table(subcommand: &'static str) -> Table {
    Table::new(subcommand, file!())
        .default(&["--model", &fixtures().linear_stack()])
        .default(&["--steps", "2"])
        .default(&["--batch", "4"])
        .default(&["--device", "cpu"])
        .default(&["--log", "warn"])
        .rows(rows(subcommand))
}

#[test]
fn every_documented_run_flag_runs_through_the_binary() {
    table("run").run();
}

#[test]
fn plain_stagehand_takes_the_same_flags_as_run() {
    table("").run();
}
