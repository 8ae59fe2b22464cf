//! An image autoencoder's sizes, from diffusers' `vae/config.json`
//! (`_class_name: AutoencoderKL`), checked against what stagehand computes.

use std::path::Path;

use serde_json::Value;

use crate::families::config_json::ConfigJson;
use crate::families::shapes::Shapes;
use crate::families::FamilyError;

/// Every `config.json` key of `AutoencoderKL` stagehand reads or knows changes
/// nothing it computes; another key is refused by name.
const KNOWN_KEYS: &[&str] = &[
    "_class_name",
    "_diffusers_version",
    "_name_or_path",
    "act_fn",
    "block_out_channels",
    "down_block_types",
    "up_block_types",
    "force_upcast",
    "in_channels",
    "out_channels",
    "latent_channels",
    "latents_mean",
    "latents_std",
    "layers_per_block",
    "mid_block_add_attention",
    "norm_num_groups",
    "sample_size",
    "scaling_factor",
    "shift_factor",
    "use_post_quant_conv",
    "use_quant_conv",
];

/// The VAE's GroupNorm epsilon (diffusers' Encoder/Decoder: 1e-6).
pub const NORM_EPS: f32 = 1e-6;

#[derive(Debug, Clone, PartialEq)]
pub struct VaeConfig {
    pub image_channels: usize,
    pub latent_channels: usize,
    /// Channels of each resolution, full resolution first (Flux: 128, 256, 512, 512).
    pub channels: Vec<usize>,
    pub layers_per_block: usize,
    pub groups: usize,
    pub mid_attention: bool,
    /// The latent a pipeline hands over is `z·scaling + shift` of the VAE's own.
    pub scaling: f32,
    pub shift: f32,
    pub post_quant_conv: bool,
    pub quant_conv: bool,
    /// The image size its tiles are made for (diffusers' `tile_sample_min_size`).
    pub sample_size: usize,
}

impl VaeConfig {
    /// Pixels per latent position along each side.
    pub fn scale_factor(&self) -> usize {
        1 << (self.channels.len() - 1)
    }

    pub fn from_json(path: &Path, config: &Value) -> Result<Self, FamilyError> {
        let json = ConfigJson::new(path, config)?;
        if let Some(key) = config.as_object().and_then(|object| {
            object
                .keys()
                .find(|key| !KNOWN_KEYS.contains(&key.as_str()))
        }) {
            return Err(json.bad(
                key,
                format!("key `{key}` is not one AutoencoderKL reads; remove it or fix its name"),
            ));
        }
        json.require_text("act_fn", &["silu"])?;
        for (key, block) in [
            ("up_block_types", "UpDecoderBlock2D"),
            ("down_block_types", "DownEncoderBlock2D"),
        ] {
            let kinds = config.get(key).and_then(Value::as_array);
            if kinds.is_some_and(|kinds| kinds.iter().any(|kind| kind.as_str() != Some(block))) {
                return Err(json.bad(key, format!(
                    "`{key}` names a block other than {block}; stagehand computes AutoencoderKL's plain encoder and decoder blocks"
                )));
            }
        }
        let channels = json.counts("block_out_channels")?;
        let groups = json.count("norm_num_groups", Some(32))?;
        if let Some(width) = channels.iter().find(|&&width| width % groups != 0) {
            return Err(json.bad(
                "block_out_channels",
                format!(
                    "block_out_channels has {width}, not a multiple of norm_num_groups {groups}"
                ),
            ));
        }
        if config
            .get("latents_mean")
            .is_some_and(|value| !value.is_null())
        {
            return Err(json.bad(
                "latents_mean",
                "`latents_mean` is set: a per-channel latent normalisation (Wan's VAE) is not computed here".into(),
            ));
        }
        Ok(Self {
            image_channels: json.count("out_channels", Some(3))?,
            latent_channels: json.count("latent_channels", Some(4))?,
            layers_per_block: json.count("layers_per_block", Some(1))?,
            groups,
            mid_attention: json.flag("mid_block_add_attention", true),
            scaling: json.float("scaling_factor", 0.18215)? as f32,
            shift: json.float("shift_factor", 0.0)? as f32,
            post_quant_conv: json.flag("use_post_quant_conv", true),
            quant_conv: json.flag("use_quant_conv", true),
            sample_size: json.count("sample_size", Some(32 * (1 << (channels.len() - 1))))?,
            channels,
        })
    }
}

/// GroupNorm's groups in every published AutoencoderKL (SD, SDXL, SD3, Flux): what a
/// checkpoint without its config is read with.
const GROUPS: usize = 32;

impl VaeConfig {
    /// The config of a checkpoint without one (ComfyUI's `ae.safetensors`, read in
    /// diffusers' names), from its shapes: the decoder's when it has one, else the
    /// encoder's. The latent's scaling is Flux's for 16 channels (0.3611, shift
    /// 0.1159: a 16-channel VAE in a Flux pipeline is Flux's) and Stable Diffusion's
    /// for 4 (0.18215).
    pub fn infer(index: &crate::model::ModelIndex) -> Result<Self, FamilyError> {
        let shapes = Shapes::new(index, "an AutoencoderKL");
        let decoder = shapes.has("decoder.conv_in.weight");
        let (coder, blocks, resnets_less) = match decoder {
            true => ("decoder", "up_blocks", 1),
            false => ("encoder", "down_blocks", 0),
        };
        let levels = shapes.count(&format!("{coder}.{blocks}."));
        if levels == 0 {
            return Err(shapes.bad(format!("it has no `{coder}.{blocks}.N` tensors")));
        }
        // Full resolution first: the decoder's up blocks run the other way.
        let channels = (0..levels)
            .map(|level| {
                let block = if decoder { levels - 1 - level } else { level };
                shapes
                    .matrix(&format!("{coder}.{blocks}.{block}.resnets.0.conv2.weight"))
                    .map(|(rows, _)| rows)
            })
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(width) = channels.iter().find(|&&width| width % GROUPS != 0) {
            return Err(shapes.bad(format!(
                "a block of {width} channels is not a multiple of the {GROUPS} groups every AutoencoderKL norms in; give the VAE's folder with its config.json"
            )));
        }
        let resnets = shapes.count(&format!("{coder}.{blocks}.0.resnets."));
        let (latent_channels, image_channels) = match decoder {
            true => (
                shapes.matrix("decoder.conv_in.weight")?.1,
                shapes.matrix("decoder.conv_out.weight")?.0,
            ),
            false => (
                shapes.matrix("encoder.conv_out.weight")?.0 / 2,
                shapes.matrix("encoder.conv_in.weight")?.1,
            ),
        };
        let (scaling, shift, sample_size) = match latent_channels {
            16 => (0.3611, 0.1159, 1024),
            4 => (0.18215, 0.0, 512),
            other => {
                return Err(shapes.bad(format!(
                    "a latent of {other} channels is neither Flux's 16 nor Stable Diffusion's 4, so its scaling is unknown; give the VAE's folder with its config.json"
                )))
            }
        };
        Ok(Self {
            image_channels,
            latent_channels,
            layers_per_block: resnets.saturating_sub(resnets_less),
            groups: GROUPS,
            mid_attention: shapes.has(&format!("{coder}.mid_block.attentions.0.to_q.weight")),
            scaling,
            shift,
            post_quant_conv: shapes.has("post_quant_conv.weight"),
            quant_conv: shapes.has("quant_conv.weight"),
            sample_size,
            channels,
        })
    }
}
