//! Every `config.json` key that changes a decoder's computation, each with a config
//! that sets it: implemented (the run follows it: the fixtures of
//! `tests/decoder_reference.rs` prove the computation against transformers; here,
//! that the key is read) or refused with exit 2 and one line naming the key and its
//! value; and the bad inputs of issue 23 that concern decoders.

mod common;

use std::path::{Path, PathBuf};

use common::decoder::{decoder_plan, tiny_decoder};
use common::{assert_bad_input, stagehand};
use serde_json::{json, Value};
use stagehand::compute::DType;
use stagehand::model::generated::DecoderArch;
use stagehand::run::{execute, no_observer, prepare_with, Extras, WorkloadKind};
use stagehand::settings::Settings;

struct Folders {
    dir: tempfile::TempDir,
}

impl Folders {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    /// A fresh tiny folder of `arch` named `name`, its config edited by `edit`.
    fn with(&self, name: &str, arch: DecoderArch, edit: impl FnOnce(&mut Value)) -> PathBuf {
        let folder = tiny_decoder(&self.dir.path().join(name), arch, DType::F32, 3);
        let path = folder.join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(path, config.to_string()).unwrap();
        folder
    }

    fn llama(&self, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
        self.with(name, DecoderArch::Llama, edit)
    }
}

fn generate(model: &Path, args: &[&str]) -> std::process::Output {
    let mut command = stagehand();
    // Every step against the resident pass (generate's own default checks the first).
    command.args([
        "generate", "--device", "cpu", "--log", "warn", "--json", "--verify", "full",
    ]);
    if !args.contains(&"--max-tokens") {
        command.args(["--max-tokens", "3"]);
    }
    command
        .arg("--model")
        .arg(model)
        .args(args)
        .output()
        .unwrap()
}

/// The logits of the prompt's prefill, computed through the library (resident).
fn prefill_logits(model: &Path) -> Vec<f32> {
    let settings = Settings::default();
    let prepared = prepare_with(
        model,
        WorkloadKind::Decoder,
        1,
        &settings,
        false,
        &Extras::default(),
    )
    .unwrap();
    let mut plan = decoder_plan(&settings, 64 << 20, 1, no_observer());
    plan.keep_outputs = true;
    let outcome = execute(&prepared, plan).unwrap();
    outcome.report.outputs[&0].clone()
}

fn refused(model: &Path, args: &[&str], expected: &[&str]) {
    assert_bad_input(&generate(model, args), expected);
}

/// A successful run's JSON, and its stderr.
fn runs(model: &Path, args: &[&str]) -> (Value, String) {
    let output = generate(model, args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "runs: {stderr}");
    let value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    (value, stderr)
}

#[test]
fn rope_type_unknown_or_longrope_is_refused_by_name() {
    let folders = Folders::new();
    let unknown = folders.llama("unknown", |c| {
        c["rope_parameters"] = json!({"rope_type": "su", "rope_theta": 10000.0});
    });
    refused(&unknown, &[], &["rope_parameters.rope_type", "\"su\""]);
    let longrope = folders.llama("longrope", |c| {
        c["rope_scaling"] = json!({"type": "longrope", "short_factor": [1.0],
            "long_factor": [2.0]});
    });
    refused(&longrope, &[], &["rope_scaling.type", "\"longrope\""]);
}

#[test]
fn rope_parameters_and_rope_theta_that_disagree_are_refused() {
    let folders = Folders::new();
    let theta = folders.llama("theta", |c| {
        c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 500000.0});
    });
    refused(
        &theta,
        &[],
        &[
            "rope_parameters.rope_theta",
            "500000",
            "`rope_theta` is 10000",
        ],
    );
    let scaling = folders.llama("scaling", |c| {
        c["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0});
        c["rope_parameters"] = json!({"rope_type": "linear", "factor": 4.0});
    });
    refused(
        &scaling,
        &[],
        &["rope_parameters.factor", "rope_scaling.factor"],
    );
    // Both layouts saying the same thing is one setting.
    let agreeing = folders.llama("agreeing", |c| {
        c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 10000});
    });
    runs(&agreeing, &[]);
}

#[test]
fn a_key_a_rope_type_does_not_define_is_refused() {
    let folders = Folders::new();
    let folder = folders.llama("mrope", |c| {
        c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 10000.0,
            "mrope_section": [16, 24, 24]});
    });
    refused(
        &folder,
        &[],
        &["rope_parameters.mrope_section", "[16,24,24]"],
    );
    let missing = folders.llama("missing", |c| {
        c["rope_parameters"] = json!({"rope_type": "linear", "rope_theta": 10000.0});
    });
    refused(
        &missing,
        &[],
        &["rope_parameters", "\"linear\"", "`factor`"],
    );
}

#[test]
fn rope_scaling_types_are_implemented_in_either_layout() {
    // Proves linear, dynamic, yarn and llama3 read from rope_scaling (transformers 4)
    // run; their numbers are the fixtures' (tests/decoder_reference.rs).
    let folders = Folders::new();
    for (name, scaling) in [
        ("linear", json!({"type": "linear", "factor": 2.0})),
        ("dynamic", json!({"type": "dynamic", "factor": 2.0})),
        (
            "yarn",
            json!({"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": 2048}),
        ),
        (
            "llama3",
            json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 2048}),
        ),
    ] {
        let folder = folders.llama(name, |c| c["rope_scaling"] = scaling);
        let (output, _) = runs(&folder, &[]);
        assert_eq!(output["summary"]["verified_steps"], 3, "{name}");
    }
}

#[test]
fn partial_rotary_factor_is_refused() {
    let folders = Folders::new();
    let top = folders.llama("top", |c| c["partial_rotary_factor"] = json!(0.5));
    refused(&top, &[], &["`partial_rotary_factor`", "0.5"]);
    let inner = folders.llama("inner", |c| {
        c["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25});
    });
    refused(
        &inner,
        &[],
        &["rope_parameters.partial_rotary_factor", "0.25"],
    );
    let whole = folders.llama("whole", |c| c["partial_rotary_factor"] = json!(1.0));
    runs(&whole, &[]);
}

#[test]
fn original_max_position_embeddings_in_two_places_must_agree() {
    let folders = Folders::new();
    let folder = folders.llama("original", |c| {
        c["original_max_position_embeddings"] = json!(4096);
        c["rope_scaling"] = json!({"rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 2048});
    });
    refused(
        &folder,
        &[],
        &["original_max_position_embeddings", "2048", "4096"],
    );
}

#[test]
fn dtype_and_torch_dtype_are_checked() {
    let folders = Folders::new();
    let unknown = folders.llama("f64", |c| c["dtype"] = json!("float64"));
    refused(&unknown, &[], &["`dtype`", "\"float64\""]);
    let disagree = folders.llama("disagree", |c| c["dtype"] = json!("bfloat16"));
    refused(&disagree, &[], &["`dtype`", "\"bfloat16\"", "\"float32\""]);
    let v5 = folders.llama("v5", |c| {
        let dtype = c.as_object_mut().unwrap().remove("torch_dtype").unwrap();
        c["dtype"] = dtype;
    });
    runs(&v5, &[]);
}

#[test]
fn quantization_config_is_refused_naming_the_method() {
    let folders = Folders::new();
    let block = folders.llama("block", |c| {
        c["quantization_config"] = json!({"quant_method": "fp8", "fmt": "e4m3",
            "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
    });
    refused(
        &block,
        &[],
        &[
            "quantization_config.weight_block_size",
            "[128,128]",
            "weight_scale_inv",
        ],
    );
    let gptq = folders.llama("gptq", |c| {
        c["quantization_config"] = json!({"quant_method": "gptq", "bits": 4});
    });
    refused(
        &gptq,
        &[],
        &["quantization_config.quant_method", "\"gptq\""],
    );
}

#[test]
fn block_wise_fp8_scales_without_a_config_are_refused() {
    // Proves a `weight_scale_inv` tensor is never read as an unscaled weight.
    let folders = Folders::new();
    let folder = folders.llama("scale_inv", |_| {});
    let path = folder.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let scale = [1.0f32];
    let scale_bytes: Vec<u8> = scale.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = file.tensors();
    tensors.push((
        "model.layers.0.mlp.up_proj.weight_scale_inv".into(),
        safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1, 1], &scale_bytes)
            .unwrap(),
    ));
    safetensors::serialize_to_file(tensors, None, &path).unwrap();
    refused(
        &folder,
        &[],
        &[
            "model.layers.0.mlp.up_proj.weight_scale_inv",
            "block-wise FP8",
        ],
    );
}

#[test]
fn hidden_act_other_than_silu_is_refused() {
    let folders = Folders::new();
    let gelu = folders.llama("gelu", |c| c["hidden_act"] = json!("gelu"));
    refused(&gelu, &[], &["`hidden_act`", "\"gelu\""]);
    let swish = folders.llama("swish", |c| c["hidden_act"] = json!("swish"));
    runs(&swish, &[]);
}

#[test]
fn head_dim_times_heads_inconsistent_with_the_weights_is_refused() {
    let folders = Folders::new();
    let wide = folders.llama("wide", |c| c["head_dim"] = json!(64));
    refused(
        &wide,
        &[],
        &[
            "`head_dim` 64",
            "`num_attention_heads` 4",
            "q_proj",
            "[128, 128]",
        ],
    );
    let odd = folders.llama("odd", |c| c["head_dim"] = json!(33));
    refused(&odd, &[], &["`head_dim`", "33"]);
    // Qwen3's head_dim is wider than hidden / heads; the weights follow it.
    let (output, _) = runs(&folders.with("qwen3", DecoderArch::Qwen3, |_| {}), &[]);
    assert_eq!(output["summary"]["verified_steps"], 3);
}

#[test]
fn attention_and_mlp_biases_are_looked_for_when_set() {
    // Proves `attention_bias` and `mlp_bias` make the decoder use biases (the
    // fixtures compute them): a folder without them is refused naming the tensor.
    let folders = Folders::new();
    let attention = folders.llama("attention", |c| c["attention_bias"] = json!(true));
    refused(
        &attention,
        &[],
        &["model.layers.0.self_attn.q_proj.bias", "missing"],
    );
    let mlp = folders.llama("mlp", |c| c["mlp_bias"] = json!(true));
    refused(&mlp, &[], &["model.layers.0.mlp.gate_proj.bias", "missing"]);
    let typed = folders.llama("typed", |c| c["attention_bias"] = json!("yes"));
    refused(&typed, &[], &["`attention_bias`", "\"yes\""]);
    // Qwen2-MoE's q/k/v biases follow `qkv_bias` (the demo writes them).
    let qwen2 = folders.with("qkv", DecoderArch::Qwen2Moe, |c| {
        c["qkv_bias"] = json!(false)
    });
    let with_bias = folders.with("qkv-on", DecoderArch::Qwen2Moe, |_| {});
    assert_ne!(
        prefill_logits(&qwen2),
        prefill_logits(&with_bias),
        "qkv_bias false leaves the q/k/v biases out"
    );
}

#[test]
fn tie_word_embeddings_picks_the_head() {
    // Proves `tie_word_embeddings` false looks for lm_head (the tied demo has none).
    let folders = Folders::new();
    let untied = folders.llama("untied", |c| c["tie_word_embeddings"] = json!(false));
    refused(&untied, &[], &["lm_head.weight", "missing"]);
}

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

#[test]
fn rms_norm_eps_is_read() {
    let folders = Folders::new();
    let bad = folders.llama("bad", |c| c["rms_norm_eps"] = json!(-1e-6));
    refused(&bad, &[], &["`rms_norm_eps`", "-1e-6"]);
    let large = folders.llama("large", |c| c["rms_norm_eps"] = json!(10.0));
    let plain = folders.llama("plain", |_| {});
    assert_ne!(prefill_logits(&large), prefill_logits(&plain));
}

#[test]
fn keys_the_family_does_not_read_are_named_in_a_warning() {
    // Proves an unknown key is never silently ignored: the run says it changes nothing
    // (transformers' class does not read it either).
    let folders = Folders::new();
    let folder = folders.llama("extra", |c| {
        c["logit_scale"] = json!(2.0);
        c["use_qk_norm"] = json!(true);
    });
    let (output, stderr) = runs(&folder, &[]);
    assert_eq!(output["summary"]["verified_steps"], 3);
    let warning = stderr
        .lines()
        .find(|line| line.contains("WARN"))
        .unwrap_or("");
    assert!(warning.contains("logit_scale, use_qk_norm"), "{stderr}");
    // Keys that change nothing are not warned about (the demo's config has several).
    let (_, quiet) = runs(&folders.llama("plain", |_| {}), &[]);
    assert!(!quiet.contains("WARN"), "{quiet}");
}
