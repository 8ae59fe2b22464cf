use super::*;

/// A scratch folder with the given files.
fn folder(files: &[(&str, Value)]) -> std::path::PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let number = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!(
        "stagehand-sentence-{}-{number}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    for (name, value) in files {
        let path = dir.join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, value.to_string()).unwrap();
    }
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn modules() -> Value {
    serde_json::json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ])
}

#[test]
fn the_hub_layout_and_the_version_5_layout_read_the_same_head() {
    // Proves MiniLM's files (old keys) and sentence-transformers 5's (pooling_mode, model_max_length) both read.
    let old = folder(&[
        ("modules.json", modules()),
        (
            "1_Pooling/config.json",
            serde_json::json!({"word_embedding_dimension": 8, "pooling_mode_cls_token": false,
                "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false,
                "pooling_mode_mean_sqrt_len_tokens": false}),
        ),
        (
            "sentence_bert_config.json",
            serde_json::json!({"max_seq_length": 256, "do_lower_case": true}),
        ),
        (
            "tokenizer_config.json",
            serde_json::json!({"model_max_length": 512}),
        ),
    ]);
    let read_old = read(&old, 8).unwrap();
    assert_eq!(read_old.head.modes, [Pooling::Mean]);
    assert!(read_old.head.normalize && read_old.lower_case);
    assert_eq!(read_old.max_length.as_ref().unwrap().tokens, 256);
    let new = folder(&[
        ("modules.json", modules()),
        (
            "1_Pooling/config.json",
            serde_json::json!({"embedding_dimension": 8, "pooling_mode": ["cls", "max"], "include_prompt": true}),
        ),
        (
            "sentence_bert_config.json",
            serde_json::json!({"transformer_task": "feature-extraction",
                "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
                "module_output_name": "token_embeddings"}),
        ),
        (
            "tokenizer_config.json",
            serde_json::json!({"model_max_length": 16}),
        ),
    ]);
    let read_new = read(&new, 8).unwrap();
    let flags = folder(&[
        ("modules.json", modules()),
        (
            "1_Pooling/config.json",
            serde_json::json!({"pooling_mode_lasttoken": true, "pooling_mode_mean_sqrt_len_tokens": true,
                "pooling_mode_cls_token": true, "pooling_mode_weightedmean_tokens": true}),
        ),
    ]);
    // Old flags concatenate in sentence-transformers' order, whatever the file's.
    assert_eq!(
        read(&flags, 8).unwrap().head.modes,
        [
            Pooling::Cls,
            Pooling::MeanSqrtLen,
            Pooling::WeightedMean,
            Pooling::LastToken
        ]
    );
    let _ = std::fs::remove_dir_all(flags);
    assert_eq!(read_new.head.modes, [Pooling::Cls, Pooling::Max]);
    assert!(!read_new.lower_case);
    let length = read_new.max_length.unwrap();
    assert_eq!(length.tokens, 16);
    assert!(length.source.contains("tokenizer_config.json"));
    let _ = std::fs::remove_dir_all(old);
    let _ = std::fs::remove_dir_all(new);
}

#[test]
fn what_changes_the_embedding_and_is_not_implemented_is_refused_by_name() {
    // Proves an unknown pooling flag or mode, a Dense module, a wrong width and an unknown Transformer key each fail naming it.
    let pooling = |config: Value| {
        folder(&[
            ("modules.json", modules()),
            ("1_Pooling/config.json", config),
        ])
    };
    let cases = [
        (
            pooling(
                serde_json::json!({"pooling_mode_mean_tokens": true, "pooling_mode_attention": true}),
            ),
            "pooling_mode_attention",
        ),
        (
            pooling(serde_json::json!({"pooling_mode": "median"})),
            "\"median\"",
        ),
        (
            pooling(serde_json::json!({"embedding_dimension": 16})),
            "hidden_size is 8",
        ),
        (
            folder(&[(
                "modules.json",
                serde_json::json!([{"path": "", "type": "sentence_transformers.models.Transformer"},
                    {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}]),
            )]),
            "sentence_transformers.models.Dense",
        ),
        (
            folder(&[
                ("modules.json", modules()),
                (
                    "sentence_bert_config.json",
                    serde_json::json!({"max_seq_length": 128, "transformer_task": "fill-mask"}),
                ),
            ]),
            "transformer_task",
        ),
        (
            folder(&[
                ("modules.json", modules()),
                (
                    "sentence_bert_config.json",
                    serde_json::json!({"max_seq_length": 0}),
                ),
            ]),
            "max_seq_length",
        ),
    ];
    for (dir, needle) in cases {
        let message = read(&dir, 8).unwrap_err().to_string();
        assert!(message.contains(needle), "{needle}: {message}");
        assert_eq!(message.lines().count(), 1, "{message}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
