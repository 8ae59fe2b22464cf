//! `stagehand generate` as users call it: the built binary run with every flag its
//! `--help` documents, at least once each (the table fails when `--help` gains a flag
//! it does not try), each row checking the exit status and one line of the output.
//! Bad values exit 2 with one line naming the flag; none panics.

mod common;

use std::path::Path;

use common::cli::{device_rows, fixtures, row, settings_rows, Expect, Row, Table};

/// The rows of the Llama folder (the Qwen3-MoE folder's are in [`moe_rows`]).
fn rows() -> Vec<Row> {
    let fixtures = fixtures();
    let lora = write_lora(Path::new(&fixtures.path("q.safetensors")));
    let missing = fixtures.path("none.safetensors");
    let folder = fixtures.folder("empty");
    let ok = "generate: ";
    let mut rows = vec![
        row(&["--prompt", "hi"], Expect::Ok(ok)),
        row(&["--prompt", ""], Expect::Ok("1 prompt tokens")),
        row(&["--token-ids", "256,10,20"], Expect::Ok("3 prompt tokens")),
        row(
            &["--token-ids", "1,x"],
            Expect::Bad("`x` is not a token id"),
        ),
        row(
            &["--token-ids", "99999"],
            Expect::Bad("outside the vocabulary"),
        ),
        row(&["--max-tokens", "3"], Expect::Ok("2 tokens decoded")),
        row(&["--max-tokens", "0"], Expect::Bad("--max-tokens 0")),
        row(&["--max-tokens", "9000"], Expect::Bad("lower --max-tokens")),
        row(&["--temperature", "0.7", "--seed", "3"], Expect::Ok(ok)),
        row(&["--temperature=-1"], Expect::Bad("--temperature")),
        row(&["--temperature", "0.5", "--top-p", "0.9"], Expect::Ok(ok)),
        row(&["--top-p", "1.5"], Expect::Bad("--top-p")),
        row(&["--top-p", "0"], Expect::Bad("--top-p")),
        row(&["--seed", "-3"], Expect::Bad("--seed")),
        row(&["--lora", &lora], Expect::Ok("LoRA")),
        row(&["--lora", &missing], Expect::Bad("none.safetensors")),
        row(&["--lora", &format!("{lora}:x")], Expect::Bad("x")),
        row(&["--json"], Expect::Ok("\"tokens\"")),
        row(&["--quiet"], Expect::Ok(ok)),
        row(&["--help"], Expect::Ok("Usage: stagehand generate")),
        row(&["--pin-ceiling", "1KiB"], Expect::Bad("pin_ceiling")),
        row(&["--model", &missing], Expect::Bad("none.safetensors")),
        row(&["--model", &folder], Expect::Bad("empty")),
        row(&["--model", &fixtures.bert()], Expect::Bad("bert")),
        row(&["--prompt", "hi"], Expect::Bad("--model")).bare(),
        row(&["--unknown-flag"], Expect::Bad("--unknown-flag")),
    ];
    rows.extend(settings_rows(ok));
    rows.extend(device_rows(ok));
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
        on_moe(&["--moe-hint", "none"], Expect::Ok("expert")),
        on_moe(&["--moe-hint", "next-layer"], Expect::Ok("expert")),
        on_moe(&["--moe-hint", "soon"], Expect::Bad("'soon'")),
        on_moe(&["--expert-policy", "lru"], Expect::Ok("expert")),
        on_moe(&["--expert-policy", "lfu"], Expect::Ok("expert")),
        on_moe(&["--expert-policy", "lfu-aging"], Expect::Ok("expert")),
        on_moe(&["--expert-policy", "mru"], Expect::Bad("'mru'")),
        on_moe(&["--expert-slots", "9"], Expect::Ok("expert")),
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
