use super::load::f16_to_f32;
use super::*;

fn target(out: usize, input: usize, rank: usize) -> LoraTarget {
    let value = |i: usize, salt: usize| ((i * 7 + salt * 13) % 17) as f32 / 17.0 - 0.5;
    LoraTarget {
        tensor: 0,
        base: "w".into(),
        block: 0,
        block_offset: 0,
        first_row: 0,
        out_features: out,
        in_features: input,
        rank,
        alpha: rank as f32 * 2.0,
        a: (0..rank * input).map(|i| value(i, 1)).collect(),
        b: (0..out * rank).map(|i| value(i, 2)).collect(),
        rslora: false,
    }
}

#[test]
fn spec_parses_file_and_strength() {
    // Proves FILE[:STRENGTH] parsing: default 1, explicit value, colons in paths, bad numbers.
    assert_eq!(LoraSpec::parse("a.safetensors").unwrap().strength, 1.0);
    let spec = LoraSpec::parse("dir/a.safetensors:0.5").unwrap();
    assert_eq!(
        (spec.path.to_str().unwrap(), spec.strength),
        ("dir/a.safetensors", 0.5)
    );
    assert_eq!(LoraSpec::parse("c:/x").unwrap().path.to_str(), Some("c:/x"));
    assert!(LoraSpec::parse("a:1.x").is_err());
    assert!(LoraSpec::parse("a:inf").is_err());
    assert!(LoraSpec::parse(":0.5").is_err());
}

#[test]
fn f16_conversion_is_exact() {
    // Proves the half → single conversion on normals, subnormals, zero and infinity.
    assert_eq!(f16_to_f32(0x3c00), 1.0);
    assert_eq!(f16_to_f32(0xc000), -2.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x03ff), 1023.0 * 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x7c00), f32::INFINITY);
    assert!(f16_to_f32(0x7e00).is_nan());
    assert_eq!(f16_to_f32(0x8000).to_bits(), (-0.0f32).to_bits());
}

#[test]
fn merge_and_low_rank_agree_to_rounding() {
    // Proves x·(W + sBA)ᵀ and x·Wᵀ + s(x·Aᵀ)·Bᵀ agree within f32 rounding of a 64-term sum.
    let (out, input, rank, batch) = (24, 64, 4, 3);
    let lora = target(out, input, rank);
    let scale = lora.scale(0.75);
    let weight: Vec<f32> = (0..out * input)
        .map(|i| ((i % 11) as f32 - 5.0) / 40.0)
        .collect();
    let x: Vec<f32> = (0..batch * input)
        .map(|i| ((i % 5) as f32 - 2.0) / 3.0)
        .collect();
    let gemm = |w: &[f32]| {
        let mut y = vec![0f32; batch * out];
        for row in 0..batch {
            for o in 0..out {
                y[row * out + o] = (0..input)
                    .map(|i| x[row * input + i] * w[o * input + i])
                    .sum();
            }
        }
        y
    };
    let mut merged = weight.clone();
    merge_into(&mut merged, &lora.factors(), scale);
    let reference = gemm(&merged);
    let mut streamed = gemm(&weight);
    let mut scratch = Vec::new();
    apply_low_rank(
        &x,
        batch,
        &lora.factors(),
        scale,
        &mut scratch,
        &mut streamed,
    );
    let worst = reference
        .iter()
        .zip(&streamed)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(worst < 1e-5, "worst difference {worst}");
    assert_ne!(
        reference,
        gemm(&weight),
        "the adapter must change the output"
    );
}
