use super::*;

fn parsed(text: &str) -> Result<PeftConfig, LoraError> {
    parse(Path::new("adapter_config.json"), text)
}

#[test]
fn a_config_peft_saved_reads_and_what_changes_the_math_is_refused_by_name() {
    // Proves peft's own keys read (defaults and inert keys pass), and each setting that
    // changes the math is refused naming the key.
    let saved = r#"{"alpha_pattern": {}, "base_model_name_or_path": "meta-llama/Llama-3.2-1B",
        "bias": "none", "fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true,
        "layers_to_transform": null, "loftq_config": {}, "lora_alpha": 16, "lora_dropout": 0.05,
        "megatron_core": "megatron.core", "modules_to_save": null, "peft_type": "LORA",
        "qalora_group_size": 16, "r": 8, "rank_pattern": {}, "target_modules": ["q_proj", "v_proj"],
        "task_type": "CAUSAL_LM", "use_dora": false, "use_rslora": true, "peft_version": "0.21.2"}"#;
    let config = parsed(saved).unwrap();
    assert_eq!(
        (config.rank, config.alpha, config.rslora),
        (Some(8), Some(16.0), true)
    );
    assert_eq!(
        config.targets,
        Some(Targets::Suffixes(vec!["q_proj".into(), "v_proj".into()]))
    );
    assert_eq!(config.base.as_deref(), Some("meta-llama/Llama-3.2-1B"));
    for (edit, needle) in [
        (r#""use_dora": true"#, "use_dora"),
        (r#""modules_to_save": ["classifier"]"#, "modules_to_save"),
        (r#""bias": "lora_only""#, "bias"),
        (r#""fan_in_fan_out": true"#, "fan_in_fan_out"),
        (r#""rank_pattern": {"q_proj": 4}"#, "rank_pattern"),
        (r#""alpha_pattern": {"q_proj": 4}"#, "alpha_pattern"),
        (r#""layer_replication": [[0, 2]]"#, "layer_replication"),
        (r#""peft_type": "IA3""#, "peft_type"),
        (r#""r": 0"#, "r 0"),
        (r#""target_modules": "(unclosed""#, "regular expression"),
        (r#""some_future_switch": 3"#, "some_future_switch"),
    ] {
        // The edited key replaces the saved one (JSON's last duplicate would win).
        let mut config: serde_json::Value = serde_json::from_str(saved).unwrap();
        let edited: serde_json::Value = serde_json::from_str(&format!("{{{edit}}}")).unwrap();
        for (key, value) in edited.as_object().unwrap() {
            config[key] = value.clone();
        }
        let message = parsed(&config.to_string()).unwrap_err().to_string();
        assert!(message.contains(needle), "{edit}: {message}");
        assert_eq!(message.lines().count(), 1, "{message}");
    }
    assert_eq!(
        parsed(r#"{"target_modules": "all-linear"}"#)
            .unwrap()
            .targets,
        Some(Targets::AllLinear)
    );
}

#[test]
fn the_base_name_rule_refuses_only_names_of_another_architecture() {
    // Proves the documented rule: an architecture word that excludes the model's type
    // refuses; no word, a matching word, or the folder's own name accepts.
    let cases = [
        (
            "meta-llama/Llama-3.2-1B",
            Some("tiny"),
            "bert",
            Some("llama"),
        ),
        (
            "sentence-transformers/all-MiniLM-L6-v2",
            None,
            "llama",
            Some("minilm"),
        ),
        ("FacebookAI/roberta-base", None, "bert", Some("roberta")),
        ("distilbert-base-uncased", None, "bert", Some("distilbert")),
        (
            "mistralai/Mixtral-8x7B-v0.1",
            None,
            "mistral",
            Some("mixtral"),
        ),
        ("meta-llama/Llama-3.2-1B", None, "llama", None),
        ("Qwen/Qwen3-30B-A3B", None, "qwen3_moe", None),
        ("sentence-transformers/all-MiniLM-L6-v2", None, "bert", None),
        ("BAAI/bge-m3", None, "xlm-roberta", None),
        ("my-finetune", Some("model"), "llama", None),
        ("/home/me/models/llama3/", Some("llama3"), "bert", None),
    ];
    for (base, folder, model_type, expected) in cases {
        assert_eq!(
            base_conflict(base, folder, model_type),
            expected,
            "{base} on {model_type}"
        );
    }
}
