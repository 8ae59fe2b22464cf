//! The `config.json` keys that decide what each decoder layer is: expert counts and
//! routing (`num_experts_per_tok`, `mlp_only_layers`, `decoder_sparse_step`,
//! `norm_topk_prob`) and sliding windows (`sliding_window`, `use_sliding_window`,
//! `max_window_layers`, `layer_types`); the rest of the keys are in
//! `tests/decoder_config.rs`.

mod common;

use common::decoder_config::{prefill_logits, refused, runs, Folders};
use serde_json::json;
use stagehand::families::llama::DecoderArch;

#[test]
fn expert_counts_are_checked() {
    let folders = Folders::new();
    let top_k = folders.with("top_k", DecoderArch::Qwen3Moe, |c| {
        c["num_experts_per_tok"] = json!(17)
    });
    refused(&top_k, &[], &["num_experts_per_tok", "17", "16 experts"]);
    let names = folders.with("names", DecoderArch::Qwen3Moe, |c| {
        c["num_local_experts"] = json!(8)
    });
    refused(
        &names,
        &[],
        &["`num_experts` is 16", "`num_local_experts` is 8"],
    );
    // transformers 5 writes Qwen3-MoE's count as num_local_experts.
    let v5 = folders.with("v5", DecoderArch::Qwen3Moe, |c| {
        let count = c.as_object_mut().unwrap().remove("num_experts").unwrap();
        c["num_local_experts"] = count;
    });
    runs(&v5, &[]);
    let width = folders.with("width", DecoderArch::Qwen3Moe, |c| {
        c["moe_intermediate_size"] = json!(32)
    });
    refused(
        &width,
        &[],
        &["model.layers.0.mlp.experts.0.gate_proj.weight", "[32, 128]"],
    );
    let shared = folders.with("shared", DecoderArch::Qwen2Moe, |c| {
        c["shared_expert_intermediate_size"] = json!(64)
    });
    refused(
        &shared,
        &[],
        &[
            "model.layers.0.mlp.shared_expert.gate_proj.weight",
            "[64, 128]",
        ],
    );
}

#[test]
fn mlp_only_layers_and_decoder_sparse_step_make_layers_dense() {
    // Proves both keys move a layer from experts to the dense MLP: the demo has
    // experts everywhere, so the dense MLP is looked for (and named) in that layer.
    let folders = Folders::new();
    let only = folders.with("only", DecoderArch::Qwen3Moe, |c| {
        c["mlp_only_layers"] = json!([2])
    });
    refused(
        &only,
        &[],
        &["model.layers.2.mlp.gate_proj.weight", "missing"],
    );
    let step = folders.with("step", DecoderArch::Qwen2Moe, |c| {
        c["decoder_sparse_step"] = json!(2)
    });
    refused(
        &step,
        &[],
        &["model.layers.0.mlp.gate_proj.weight", "missing"],
    );
    let outside = folders.with("outside", DecoderArch::Qwen3Moe, |c| {
        c["mlp_only_layers"] = json!([4])
    });
    refused(&outside, &[], &["`mlp_only_layers`", "[4]", "0 to 3"]);
}

#[test]
fn norm_topk_prob_changes_the_routing_weights() {
    let folders = Folders::new();
    let normed = folders.with("normed", DecoderArch::Qwen3Moe, |_| {});
    let plain = folders.with("plain", DecoderArch::Qwen3Moe, |c| {
        c["norm_topk_prob"] = json!(false)
    });
    assert_ne!(prefill_logits(&normed), prefill_logits(&plain));
}

#[test]
fn a_sliding_window_shorter_than_the_sequence_is_refused() {
    let folders = Folders::new();
    let mistral = folders.llama("mistral", |c| {
        c["model_type"] = json!("mistral");
        c["sliding_window"] = json!(4);
    });
    refused(
        &mistral,
        &["--prompt", "a long prompt"],
        &[
            "`sliding_window` 4",
            "sliding-window attention is not implemented",
        ],
    );
    // A prompt inside the window, but --max-tokens past it: refused before it starts.
    refused(
        &mistral,
        &["--token-ids", "1,2", "--max-tokens", "4"],
        &["`sliding_window` 4", "--max-tokens", "at most 3"],
    );
    let (output, _) = runs(&mistral, &["--token-ids", "1,2", "--max-tokens", "3"]);
    assert_eq!(output["summary"]["verified_steps"], 3);
}

#[test]
fn qwen_sliding_windows_follow_use_sliding_window_max_window_layers_and_layer_types() {
    let folders = Folders::new();
    let off = folders.with("off", DecoderArch::Qwen3, |c| {
        c["sliding_window"] = json!(2)
    });
    runs(&off, &["--prompt", "a long prompt"]);
    let above = folders.with("above", DecoderArch::Qwen3, |c| {
        c["use_sliding_window"] = json!(true);
        c["sliding_window"] = json!(2);
        c["max_window_layers"] = json!(4);
    });
    runs(&above, &["--prompt", "a long prompt"]);
    let sliding = folders.with("sliding", DecoderArch::Qwen3, |c| {
        c["use_sliding_window"] = json!(true);
        c["sliding_window"] = json!(2);
        c["max_window_layers"] = json!(2);
    });
    refused(
        &sliding,
        &["--prompt", "a long prompt"],
        &["`sliding_window` 2 (layers 2..=3)"],
    );
    let listed = folders.with("listed", DecoderArch::Qwen3, |c| {
        c["use_sliding_window"] = json!(true);
        c["sliding_window"] = json!(2);
        c["layer_types"] = json!([
            "full_attention",
            "sliding_attention",
            "full_attention",
            "full_attention"
        ]);
    });
    refused(
        &listed,
        &["--prompt", "a long prompt"],
        &["`sliding_window` 2 (layers 1..=1)"],
    );
    let unknown = folders.with("unknown", DecoderArch::Qwen3, |c| {
        c["layer_types"] = json!([
            "full_attention",
            "chunked_attention",
            "full_attention",
            "full_attention"
        ]);
    });
    refused(&unknown, &[], &["`layer_types`", "\"chunked_attention\""]);
}
