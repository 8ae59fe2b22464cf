//! Generated LoRA adapters for generated Flux transformers, in kohya's naming (the
//! fused original weights: `lora_unet_double_blocks_0_img_attn_qkv`) or diffusers/PEFT
//! naming (`transformer.transformer_blocks.0.attn.to_q`, the unfused pieces).

use std::path::Path;

use super::demo::FluxShape;
use super::embed::gaussian;

/// How a generated adapter names its modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FluxLoraNaming {
    Kohya,
    Peft,
}

/// The modules an adapter of `naming` patches on a model of `shape`, with their
/// `[out, in]`: attention and MLP weights of the first and last blocks of each kind.
pub fn lora_modules(shape: &FluxShape, naming: FluxLoraNaming) -> Vec<(String, usize, usize)> {
    let (hidden, mlp) = (shape.hidden(), 4 * shape.hidden());
    let (last_double, last_single) = (shape.double_blocks - 1, shape.single_blocks - 1);
    match naming {
        FluxLoraNaming::Kohya => vec![
            (
                "lora_unet_double_blocks_0_img_attn_qkv".into(),
                3 * hidden,
                hidden,
            ),
            (
                format!("lora_unet_double_blocks_{last_double}_txt_mlp_0"),
                mlp,
                hidden,
            ),
            (
                "lora_unet_single_blocks_0_linear1".into(),
                3 * hidden + mlp,
                hidden,
            ),
            (
                format!("lora_unet_single_blocks_{last_single}_linear2"),
                hidden,
                hidden + mlp,
            ),
        ],
        FluxLoraNaming::Peft => vec![
            (
                "transformer.transformer_blocks.0.attn.to_q".into(),
                hidden,
                hidden,
            ),
            (
                "transformer.transformer_blocks.0.attn.to_k".into(),
                hidden,
                hidden,
            ),
            (
                format!("transformer.transformer_blocks.{last_double}.ff_context.net.0.proj"),
                mlp,
                hidden,
            ),
            (
                "transformer.single_transformer_blocks.0.attn.to_v".into(),
                hidden,
                hidden,
            ),
            (
                "transformer.single_transformer_blocks.0.proj_mlp".into(),
                mlp,
                hidden,
            ),
            (
                format!("transformer.single_transformer_blocks.{last_single}.proj_out"),
                hidden,
                hidden + mlp,
            ),
        ],
    }
}

/// Writes a rank-`rank` adapter (F32 factors, alpha = rank / 2) with seeded factors.
pub fn write_flux_lora(
    path: &Path,
    shape: &FluxShape,
    naming: FluxLoraNaming,
    rank: usize,
    seed: u64,
) -> std::io::Result<()> {
    let (down, up) = match naming {
        FluxLoraNaming::Kohya => ("lora_down", "lora_up"),
        FluxLoraNaming::Peft => ("lora_A", "lora_B"),
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let bytes = |values: Vec<f32>| {
        values
            .iter()
            .flat_map(|value| value.to_le_bytes())
            .collect()
    };
    for (number, (module, out, input)) in lora_modules(shape, naming).into_iter().enumerate() {
        let seed = seed.wrapping_add(number as u64 * 2);
        let a_scale = 1.0 / (input as f32).sqrt();
        let a = gaussian(rank * input, seed)
            .iter()
            .map(|v| v * a_scale)
            .collect();
        let b = gaussian(out * rank, seed + 1)
            .iter()
            .map(|v| v * 0.05)
            .collect();
        tensors.push((
            format!("{module}.{down}.weight"),
            vec![rank, input],
            bytes(a),
        ));
        tensors.push((format!("{module}.{up}.weight"), vec![out, rank], bytes(b)));
        tensors.push((
            format!("{module}.alpha"),
            vec![],
            bytes(vec![rank as f32 / 2.0]),
        ));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                .map(|view| (name.clone(), view))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(std::io::Error::other)?;
    let file = safetensors::serialize(views, None).map_err(std::io::Error::other)?;
    crate::os::write_atomically(path, |mut out| std::io::Write::write_all(&mut out, &file))
}
