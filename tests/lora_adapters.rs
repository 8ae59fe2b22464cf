//! LoRA adapter files against the demo model: PEFT and kohya namings load to the same
//! factors and scales, and bad adapters are refused with errors naming the file, the key
//! and the problem.

mod common;

use common::lora::{lora_file, peft_and_kohya, setup, write_f32_tensors};
use stagehand::lora::{load_adapter, DemoLora, LoraError};

#[test]
fn both_namings_load_to_the_same_factors() {
    // Proves a PEFT and a kohya file of the same factors map to the same base tensors
    // with the same scale, and alpha defaults to the rank without an alpha tensor.
    let (dir, _model, index) = setup();
    let (peft, kohya) = peft_and_kohya(dir.path(), DemoLora::default());
    let a = load_adapter(&peft, 0.5, "p".into(), &index, &[]).unwrap();
    let b = load_adapter(&kohya, 0.5, "k".into(), &index, &[]).unwrap();
    assert_eq!(a.targets.len(), 16);
    assert_eq!(a.targets, b.targets);
    assert_eq!(a.targets[0].base, "blocks.0.linear0.weight");
    assert_eq!(a.targets[0].scale(0.5), 0.5 * 16.0 / 8.0);
    let plain = lora_file(
        dir.path(),
        "n.safetensors",
        &DemoLora {
            alpha: None,
            ..DemoLora::default()
        },
    );
    let c = load_adapter(&plain, 1.0, "n".into(), &index, &[]).unwrap();
    assert_eq!(c.targets[0].scale(1.0), 1.0);
}

#[test]
fn peft_alpha_comes_from_adapter_config() {
    // Proves PEFT's lora_alpha in adapter_config.json beside the file sets the scale.
    let (dir, _model, index) = setup();
    let sub = dir.path().join("peft");
    let path = lora_file(
        &sub,
        "adapter_model.safetensors",
        &DemoLora {
            alpha: None,
            ..DemoLora::default()
        },
    );
    std::fs::write(
        sub.join("adapter_config.json"),
        r#"{"r": 8, "lora_alpha": 32}"#,
    )
    .unwrap();
    let adapter = load_adapter(&path, 1.0, "a".into(), &index, &[]).unwrap();
    assert_eq!(adapter.targets[0].scale(1.0), 4.0);
}

#[test]
fn bad_adapters_are_refused_with_clear_errors() {
    // Proves shape mismatch, rank 0, NaN, unmatched keys (another model) and an unknown
    // naming each give an error naming the file, the key and the problem.
    let (dir, _model, index) = setup();
    let dim = 256;
    let case = |name: &str, tensors: Vec<(&str, Vec<usize>, Vec<f32>)>| -> LoraError {
        let path = dir.path().join(name);
        write_f32_tensors(&path, &tensors);
        load_adapter(&path, 1.0, name.into(), &index, &[]).unwrap_err()
    };
    let a = "blocks.0.linear0.lora_A.weight";
    let b = "blocks.0.linear0.lora_B.weight";
    let shape = case(
        "shape.safetensors",
        vec![
            (a, vec![4, 128], vec![0.0; 512]),
            (b, vec![dim, 4], vec![0.0; dim * 4]),
        ],
    );
    assert!(
        shape
            .to_string()
            .contains("does not patch `blocks.0.linear0.weight`"),
        "{shape}"
    );
    let rank = case(
        "rank.safetensors",
        vec![(a, vec![0, dim], vec![]), (b, vec![dim, 0], vec![])],
    );
    assert!(rank.to_string().contains("rank 0"), "{rank}");
    let mut values = vec![0.0; 4 * dim];
    values[17] = f32::NAN;
    let nan = case(
        "nan.safetensors",
        vec![
            (a, vec![4, dim], values),
            (b, vec![dim, 4], vec![0.0; dim * 4]),
        ],
    );
    assert!(
        nan.to_string()
            .contains("non-finite value (NaN) at element 17"),
        "{nan}"
    );
    let other = case(
        "other.safetensors",
        vec![
            (
                "lora_unet_down_blocks_0_attn1_to_q.lora_down.weight",
                vec![4, 8],
                vec![0.0; 32],
            ),
            (
                "lora_unet_down_blocks_0_attn1_to_q.lora_up.weight",
                vec![8, 4],
                vec![0.0; 32],
            ),
        ],
    );
    let text = other.to_string();
    assert!(
        text.contains("1 of 1 LoRA modules match no tensor"),
        "{text}"
    );
    assert!(text.contains("naming guessed: kohya"), "{text}");
    assert!(
        text.contains("lora_unet_down_blocks_0_attn1_to_q"),
        "{text}"
    );
    let unknown = case("plain.safetensors", vec![("weight", vec![2], vec![0.0; 2])]);
    assert!(
        unknown.to_string().contains("no LoRA keys found"),
        "{unknown}"
    );
}
