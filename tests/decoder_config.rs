//! Every `config.json` key that changes a decoder's computation, each with a config
//! that sets it: implemented (the run follows it: the fixtures of
//! `tests/decoder_reference.rs` prove the computation against transformers; here,
//! that the key is read) or refused with exit 2 and one line naming the key and its
//! value; and the bad inputs of issue 23 that concern decoders. The keys that decide
//! what each layer is (experts, sliding windows) are in `tests/decoder_config_layers.rs`.

mod common;

use common::decoder_config::{prefill_logits, refused, runs, Folders};
use serde_json::json;
use stagehand::families::llama::DecoderArch;

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
