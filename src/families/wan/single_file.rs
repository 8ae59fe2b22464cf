//! A WAN transformer from one file without its folder (Wan-AI's original names, or
//! ComfyUI's `diffusion_models/wan2.2_*.safetensors`, read in diffusers' names by
//! [`crate::model::PartNames::WanTransformer`]): the config `config.json` would give,
//! inferred from the tensors' shapes.
//!
//! The shapes say the width, the channels in and out, the patch, umT5's width, the
//! timestep frequencies, the feed-forward's width, the blocks and whether `norm2` is
//! there. They cannot say how the width splits into heads (the q/k norms span all
//! heads): every published WAN (2.1 1.3B and 14B, 2.2 A14B and TI2V-5B) has heads of
//! 128, which is taken unless the file's metadata says otherwise
//! ([`HEAD_DIM_METADATA`], what stagehand's own tiny files carry). Nor the norms' ε
//! (1e-6 in all of them) nor the rope's capacity (1024 positions an axis in all).
//! ComfyUI's scaled FP8 files read the same way: their shapes are the fp16 file's, the
//! `scaled_fp8` marker and the `scale_input`s are left out by the part, and each FP8
//! weight's `scale_weight` travels with it (see `fp8`).

use serde_json::{json, Value};

use crate::families::FamilyError;
use crate::model::ModelIndex;

/// The safetensors metadata key that gives a single file's head width when it is
/// not the published models' 128.
pub const HEAD_DIM_METADATA: &str = "stagehand.wan.attention_head_dim";

/// Every published WAN's head width.
const PUBLISHED_HEAD_DIM: usize = 128;

/// Whether `index` (no folder) holds a WAN transformer in diffusers' names.
pub fn is_wan(index: &ModelIndex) -> bool {
    [
        "condition_embedder.time_proj.weight",
        "blocks.0.attn1.to_q.weight",
        "proj_out.weight",
    ]
    .iter()
    .all(|name| index.tensor(name).is_some())
}

/// The channels in and out of the WAN transformer `index` holds (in diffusers'
/// names): its patch embedding's input channels, and its output projection's rows
/// over the patch's positions; else what is wrong with them.
pub fn transformer_channels(index: &ModelIndex) -> Result<[usize; 2], String> {
    let shape = |name: &str| index.tensor(name).map(|tensor| tensor.shape.as_slice());
    let (Some(&[_, in_channels, frames, rows, cols]), Some(&[patch_out, _])) =
        (shape("patch_embedding.weight"), shape("proj_out.weight"))
    else {
        return Err("has no patch_embedding [dim, channels, frames, rows, columns] and proj_out matrix: not a whole WAN transformer".into());
    };
    let patch = frames * rows * cols;
    if patch == 0 || patch_out % patch != 0 {
        return Err(format!(
            "proj_out's {patch_out} outputs are not whole patches of {patch}: not a WAN transformer's shapes"
        ));
    }
    Ok([in_channels, patch_out / patch])
}

/// The `config.json` of the transformer `index` holds, from its shapes.
pub fn inferred_config(index: &ModelIndex) -> Result<Value, FamilyError> {
    // The shapes say a config that is refused: no `config.json` key to name.
    let bad = |message: String| {
        FamilyError::config(
            &index.path,
            None,
            format!("{}: {message}", index.path.display()),
        )
    };
    let shape = |name: &str| -> Result<&[usize], FamilyError> {
        index
            .tensor(name)
            .map(|tensor| tensor.shape.as_slice())
            .ok_or_else(|| {
                let message = format!(
                    "{}: no tensor `{name}` (in diffusers' names): not a whole WAN transformer",
                    index.path.display()
                );
                FamilyError::missing_tensor(&index.path, name, message)
            })
    };
    let [dim, _, frames, rows, cols] = shape("patch_embedding.weight")?[..] else {
        return Err(bad("`patch_embedding.weight` is not a Conv3d kernel [dim, channels, frames, rows, columns]".into()));
    };
    let [in_channels, out_channels] = transformer_channels(index).map_err(bad)?;
    let matrix = |name: &str| -> Result<[usize; 2], FamilyError> {
        match shape(name)? {
            &[out, inputs] => Ok([out, inputs]),
            other => Err(bad(format!("`{name}` is {other:?}, not a matrix"))),
        }
    };
    let [_, text_dim] = matrix("condition_embedder.text_embedder.linear_1.weight")?;
    let [_, freq_dim] = matrix("condition_embedder.time_embedder.linear_1.weight")?;
    let [ffn_dim, _] = matrix("blocks.0.ffn.net.0.proj.weight")?;
    let layers = (0..)
        .take_while(|block| {
            index
                .tensor(&format!("blocks.{block}.attn1.to_q.weight"))
                .is_some()
        })
        .count();
    let head_dim = match index.metadata.get(HEAD_DIM_METADATA) {
        None => PUBLISHED_HEAD_DIM,
        Some(text) => text.parse().map_err(|_| {
            bad(format!(
                "metadata `{HEAD_DIM_METADATA}` is `{text}`; a whole number"
            ))
        })?,
    };
    if head_dim == 0 || dim % head_dim != 0 {
        return Err(bad(format!(
            "width {dim} in heads of {head_dim}: not a WAN transformer's shapes (every published WAN has heads of 128; a file of another width says its head in metadata `{HEAD_DIM_METADATA}`)"
        )));
    }
    let image = index
        .tensor("condition_embedder.image_embedder.ff.net.0.proj.weight")
        .map(|tensor| tensor.shape.get(1).copied().unwrap_or(0));
    Ok(json!({
        "_class_name": super::CLASS_NAME,
        "patch_size": [frames, rows, cols],
        "num_attention_heads": dim / head_dim,
        "attention_head_dim": head_dim,
        "in_channels": in_channels,
        "out_channels": out_channels,
        "text_dim": text_dim,
        "freq_dim": freq_dim,
        "ffn_dim": ffn_dim,
        "num_layers": layers,
        "cross_attn_norm": index.tensor("blocks.0.norm2.weight").is_some(),
        "qk_norm": super::QK_NORM,
        "eps": 1e-6,
        "image_dim": image,
        "added_kv_proj_dim": index.tensor("blocks.0.attn2.add_k_proj.weight").map(|_| dim),
        "rope_max_seq_len": 1024,
        "pos_embed_seq_len": null,
    }))
}

/// What opening the WAN transformer file `index` (in diffusers' names) would refuse,
/// from its headers alone: its config from the shapes, and every tensor the family
/// places — so that a pipeline refuses a file before its earlier stages run.
pub fn check_file(index: &ModelIndex) -> Result<(), FamilyError> {
    let config = super::WanConfig::from_json(&index.path, &inferred_config(index)?)?;
    super::weights::WanWeights::place(index, &config).map(|_| ())
}
