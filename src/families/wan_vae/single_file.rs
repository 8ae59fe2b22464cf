//! A WAN VAE from one file without its folder (ComfyUI's `vae/wan_2.1_vae.safetensors`
//! and `vae/wan2.2_vae.safetensors` in Wan-AI's original names, read in diffusers'
//! names by [`crate::model::PartNames::WanVae`]; or the diffusers tensors alone): the
//! `config.json` the folder would give, inferred from the tensors' shapes.
//!
//! The shapes say the latent channels (`post_quant_conv`), the levels and their widths
//! (each up block's res blocks), the res blocks a level, which levels double the
//! frames (a `time_conv` in their upsampler), whether the levels are residual (Wan
//! 2.2's `upsampler`, where 2.1 has `upsamplers.0`), the encoder's width (`conv_in`)
//! and the patch (RGB in 3 or 12 channels). They give the widths as products
//! `base_dim · dim_mult[k]` only: the first multiplier is taken as 1, as in every
//! published WAN VAE (the decoder computes the same either way). What they cannot say
//! is how a pipeline's latent is normalised: the published VAE's `latents_mean` and
//! `latents_std` are taken by latent channels ([`super::published`]), and another
//! z_dim is refused by name.

use serde_json::{json, Value};

use super::published::latents_statistics;
use super::WanVaeConfig;
use crate::families::registry::Request;
use crate::families::FamilyError;
use crate::model::ModelIndex;

/// Tensors only a WAN VAE has, in diffusers' names (its RMS norms' `gamma`; the Flux
/// VAE's group norm is `conv_norm_out.weight`).
const MARKERS: &[&str] = &["decoder.norm_out.gamma", "encoder.norm_out.gamma"];

/// Whether `index` (no folder) holds a WAN VAE in diffusers' names.
pub fn is_wan_vae(index: &ModelIndex) -> bool {
    MARKERS.iter().any(|name| index.tensor(name).is_some())
}

impl WanVaeConfig {
    /// The config of the VAE `request` opens: its folder's, or read from its shapes.
    pub fn of(request: &Request<'_>) -> Result<Self, FamilyError> {
        match request.folder {
            Some(folder) => Self::from_json(&folder.config_path(), &folder.config),
            None => Self::from_json(request.path, &inferred_config(request.index)?),
        }
    }
}

/// The `config.json` of the VAE `index` holds (in diffusers' names), from its shapes.
pub fn inferred_config(index: &ModelIndex) -> Result<Value, FamilyError> {
    // The shapes say a config that is refused: no `config.json` key to name.
    let bad = |message: String| {
        FamilyError::config(
            &index.path,
            None,
            format!("{}: {message}", index.path.display()),
        )
    };
    let missing = |name: &str, message: &str| {
        let message = format!("{}: {message}", index.path.display());
        FamilyError::missing_tensor(&index.path, name, message)
    };
    let shape = |name: &str| index.tensor(name).map(|tensor| tensor.shape.as_slice());
    let out_width = |name: &str| shape(name).and_then(|shape| shape.first().copied());
    let z_dim = out_width("post_quant_conv.weight").ok_or_else(|| {
        missing(
            "post_quant_conv.weight",
            "no tensor `post_quant_conv.weight` (Wan-AI's `conv2.weight`): not a whole WAN VAE",
        )
    })?;
    let Some((latents_mean, latents_std)) = latents_statistics(z_dim) else {
        return Err(bad(format!(
            "z_dim {z_dim} (post_quant_conv's channels): a file carries no latents_mean/latents_std, and the published WAN VAEs have 16 latent channels (Wan 2.1's) or 48 (Wan 2.2's); give another VAE as a diffusers vae/ folder with its config.json"
        )));
    };
    let resnet = |level: usize, block: usize| {
        out_width(&format!(
            "decoder.up_blocks.{level}.resnets.{block}.conv2.weight"
        ))
    };
    let widths: Vec<usize> = (0..).map_while(|level| resnet(level, 0)).collect();
    let Some(&decoder_base) = widths.last().filter(|&&base| base > 0) else {
        return Err(missing(
            "decoder.up_blocks.0.resnets.0.conv2.weight",
            "no `decoder.up_blocks.0.resnets.0.conv2.weight`: not a whole WAN VAE decoder",
        ));
    };
    let dim_mult: Vec<usize> = widths
        .iter()
        .rev()
        .map(|width| width / decoder_base)
        .collect();
    if widths.iter().any(|width| width % decoder_base != 0) {
        return Err(bad(format!(
            "the up blocks' widths {widths:?} are not multiples of the last one's: not a WAN VAE's shapes"
        )));
    }
    let blocks = (0..)
        .take_while(|&block| resnet(0, block).is_some())
        .count();
    let is_residual = index
        .tensors
        .iter()
        .any(|tensor| tensor.name.contains(".upsampler.") || tensor.name.contains(".downsampler."));
    let sampler = if is_residual {
        "upsampler"
    } else {
        "upsamplers.0"
    };
    let temporal_upsample: Vec<bool> = (0..widths.len() - 1)
        .map(|level| {
            let time_conv = format!("decoder.up_blocks.{level}.{sampler}.time_conv.weight");
            index.tensor(&time_conv).is_some()
        })
        .collect();
    let out_channels = out_width("decoder.conv_out.weight")
        .ok_or_else(|| missing("decoder.conv_out.weight", "no tensor `decoder.conv_out.weight` (Wan-AI's `decoder.head.2.weight`): not a whole WAN VAE decoder"))?;
    let patch_size = match out_channels {
        3 => Value::Null,
        12 => json!(2),
        other => {
            return Err(bad(format!(
                "the decoder gives {other} channels: RGB is 3 (Wan 2.1's VAE) or 12 in 2 × 2 patches (Wan 2.2's)"
            )))
        }
    };
    let encoder_in = shape("encoder.conv_in.weight");
    Ok(json!({
        "_class_name": super::CLASS_NAME,
        "base_dim": encoder_in.and_then(|shape| shape.first().copied()).unwrap_or(decoder_base),
        "decoder_base_dim": decoder_base,
        "z_dim": z_dim,
        "dim_mult": dim_mult,
        "num_res_blocks": blocks.saturating_sub(1),
        "attn_scales": [],
        "temperal_downsample": temporal_upsample.iter().rev().collect::<Vec<_>>(),
        "dropout": 0.0,
        "latents_mean": latents_mean,
        "latents_std": latents_std,
        "is_residual": is_residual,
        "in_channels": encoder_in.and_then(|shape| shape.get(1).copied()).unwrap_or(out_channels),
        "out_channels": out_channels,
        "patch_size": patch_size,
    }))
}
