//! The rope settings of both layouts, and the frequencies of each type.

use super::*;
use std::path::Path;

fn rope(config: serde_json::Value) -> Result<Rope, FamilyError> {
    Rope::from_config(&Keys::new(Path::new("config.json"), &config), 1e4, 8, 64)
}

#[test]
fn both_layouts_give_the_same_rope() {
    // Proves transformers 5's rope_parameters and 4's top-level keys read alike.
    let scaling = serde_json::json!({"rope_type": "linear", "factor": 2.0});
    let v4 = rope(serde_json::json!({"rope_theta": 500.0, "rope_scaling": scaling})).unwrap();
    let v5 = rope(serde_json::json!({"rope_parameters":
        {"rope_type": "linear", "factor": 2, "rope_theta": 500.0}}))
    .unwrap();
    assert_eq!(v4, v5);
    assert_eq!(v4.inv_freq(1)[0], 0.5);
}

#[test]
fn dynamic_scaling_grows_the_base_past_max_positions_only() {
    // Proves dynamic NTK equals the default up to max_position_embeddings and
    // lowers every frequency but the first beyond it.
    let dynamic =
        rope(serde_json::json!({"rope_scaling": {"type": "dynamic", "factor": 2.0}})).unwrap();
    let plain = rope(serde_json::json!({})).unwrap();
    assert_eq!(dynamic.inv_freq(64), plain.inv_freq(64));
    let long = dynamic.inv_freq(100);
    assert_eq!(long[0], 1.0);
    assert!(long[1..]
        .iter()
        .zip(&plain.inv_freq(1)[1..])
        .all(|(l, p)| l < p));
    assert_eq!(dynamic.position_limit(), 128);
}

#[test]
fn yarn_scales_attention_by_its_mscale() {
    // Proves yarn's default attention factor is 0.1·ln(factor) + 1.
    let yarn = rope(serde_json::json!({"rope_parameters": {"rope_type": "yarn",
        "factor": 4.0, "original_max_position_embeddings": 16}}))
    .unwrap();
    assert!((yarn.attention_factor() - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-12);
}
