//! One model inside a checkpoint that holds others too, or in names other than the
//! ones its family reads.
//!
//! ComfyUI's all-in-one checkpoints keep a pipeline's models side by side under
//! prefixes (`model.diffusion_model.`, `text_encoders.clip_l.transformer.`,
//! `text_encoders.t5xxl.transformer.`, `vae.`), and the Flux autoencoder ships as
//! `ae.safetensors` in its original (LDM) names (`decoder.up.3.block.0.conv1`) where
//! diffusers writes `decoder.up_blocks.0.resnets.0.conv1`. A [`CheckpointPart`] says
//! which tensors are the model and what its family calls them; the index built from
//! it ([`super::ModelIndex::open_part`]) holds only those, renamed, at their places in
//! the file — no byte is copied, so a part streams and checks as a whole file does.

use super::header::HeaderTensor;
use super::wan_names::{is_original_wan, wan_to_diffusers};
use super::wan_vae_names::{is_original_wan_vae, WanVaeNames};

/// ComfyUI's prefix of a diffusion model in its files.
const COMFY_PREFIX: &str = "model.diffusion_model.";

/// Which tensors of a checkpoint are one model, under which names.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckpointPart {
    /// The prefix of the model's tensors, removed from their names (`""`: all).
    pub prefix: String,
    pub names: PartNames,
}

/// How a part's tensors are named in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PartNames {
    /// As the family reads them.
    #[default]
    AsIs,
    /// An autoencoder in the original (LDM) names, read as diffusers' `AutoencoderKL`.
    LdmAutoencoder,
    /// A WAN transformer in Wan-AI's original names (ComfyUI's
    /// `diffusion_models/wan2.2_*.safetensors`), read as `WanTransformer3DModel`'s.
    WanTransformer,
    /// The WAN VAE in Wan-AI's original names (ComfyUI's `vae/wan_2.1_vae.safetensors`
    /// and `vae/wan2.2_vae.safetensors`), read as `AutoencoderKLWan`'s.
    WanVae,
}

/// Tensors a part leaves out even under its prefix: ComfyUI's marker of a scaled-FP8
/// file, and the per-input scales of FP8 products (the weights are widened here).
const MARKERS: &[&str] = &["scaled_fp8"];
const DROPPED_SUFFIXES: &[&str] = &[".scale_input"];

impl CheckpointPart {
    /// The tensors under `prefix`, named as the family reads them.
    pub fn under(prefix: &str, names: PartNames) -> Self {
        Self {
            prefix: prefix.to_string(),
            names,
        }
    }

    /// The part a whole checkpoint is read as when nothing names one: an
    /// autoencoder in its original names (ComfyUI's `ae.safetensors`) is read in
    /// diffusers', as is a WAN transformer in Wan-AI's (bare or under ComfyUI's
    /// `model.diffusion_model.`); any other checkpoint as it is (`None`).
    pub fn implied(index: &super::ModelIndex) -> Option<Self> {
        let ldm = index.tensors.iter().any(|tensor| {
            let name = tensor.name.as_str();
            (name.starts_with("decoder.up.") || name.starts_with("encoder.down."))
                && name.contains(".block.")
        });
        if ldm {
            return Some(Self::under("", PartNames::LdmAutoencoder));
        }
        let names = || index.tensors.iter().map(|tensor| tensor.name.as_str());
        if is_original_wan_vae("", names()) {
            return Some(Self::under("", PartNames::WanVae));
        }
        [COMFY_PREFIX, ""]
            .into_iter()
            .find(|prefix| is_original_wan(prefix, names()))
            .map(|prefix| Self::under(prefix, PartNames::WanTransformer))
    }

    /// The names of `tensors` under the prefix, without it.
    fn local_names<'a>(&'a self, tensors: &'a [HeaderTensor]) -> impl Iterator<Item = &'a str> {
        let prefix = self.prefix.as_str();
        tensors
            .iter()
            .filter_map(move |tensor| tensor.name.strip_prefix(prefix))
    }

    /// The first of a header's tensors under the prefix that the part's names have no
    /// name for, with why (a WAN VAE's: diffusers' conversion would keep it and then
    /// fail its strict load, so it is refused here by name).
    pub(crate) fn unknown_tensor(&self, tensors: &[HeaderTensor]) -> Option<(String, String)> {
        let PartNames::WanVae = self.names else {
            return None;
        };
        let names = WanVaeNames::of(self.local_names(tensors));
        tensors.iter().find_map(|tensor| {
            let local = tensor.name.strip_prefix(self.prefix.as_str())?;
            let problem = names.diffusers_name(local).err()?;
            Some((tensor.name.clone(), problem))
        })
    }

    /// The part's tensors of one file's header, renamed (and, for the LDM
    /// attention's 1×1 convolutions, reshaped to the matrices they are), in the
    /// header's order.
    pub(crate) fn select(&self, tensors: Vec<HeaderTensor>) -> Vec<HeaderTensor> {
        let levels = match self.names {
            PartNames::AsIs | PartNames::WanTransformer | PartNames::WanVae => 0,
            PartNames::LdmAutoencoder => ldm_up_levels(&self.prefix, &tensors),
        };
        let wan_vae = WanVaeNames::of(self.local_names(&tensors));
        tensors
            .into_iter()
            .filter_map(|mut tensor| {
                let local = tensor.name.strip_prefix(self.prefix.as_str())?;
                if MARKERS.contains(&local)
                    || DROPPED_SUFFIXES.iter().any(|end| local.ends_with(end))
                {
                    return None;
                }
                let name = match self.names {
                    PartNames::AsIs => local.to_string(),
                    PartNames::WanTransformer => wan_to_diffusers(local),
                    // Names it has none for are refused before (`unknown_tensor`).
                    PartNames::WanVae => wan_vae.diffusers_name(local).ok()?,
                    PartNames::LdmAutoencoder => {
                        let (name, matrix) = ldm_to_diffusers(local, levels)?;
                        if matrix && tensor.shape.len() == 4 && tensor.shape[2..] == [1, 1] {
                            tensor.shape.truncate(2);
                        }
                        name
                    }
                };
                tensor.name = name;
                Some(tensor)
            })
            .collect()
    }
}

/// How many up levels an LDM decoder has (`decoder.up.N.` with the largest N, plus one).
fn ldm_up_levels(prefix: &str, tensors: &[HeaderTensor]) -> usize {
    tensors
        .iter()
        .filter_map(|tensor| {
            let rest = tensor
                .name
                .strip_prefix(prefix)?
                .strip_prefix("decoder.up.")?;
            rest.split('.').next()?.parse::<usize>().ok()
        })
        .max()
        .map_or(0, |last| last + 1)
}

/// diffusers' name of an LDM autoencoder tensor (the inverse of nothing: this is
/// diffusers' own `convert_ldm_vae_checkpoint`), and whether it is an attention
/// projection stored as a 1×1 convolution; `None` for a tensor diffusers drops.
/// The decoder's up levels run the other way round: LDM's `up.0` is the last.
fn ldm_to_diffusers(name: &str, levels: usize) -> Option<(String, bool)> {
    let (coder, rest) = name.split_once('.')?;
    if !matches!(coder, "encoder" | "decoder") {
        let kept = matches!(coder, "quant_conv" | "post_quant_conv");
        return kept.then(|| (name.to_string(), false));
    }
    let parts: Vec<&str> = rest.split('.').collect();
    let renamed = match parts.as_slice() {
        ["norm_out", tail] => format!("conv_norm_out.{tail}"),
        [conv @ ("conv_in" | "conv_out"), tail] => format!("{conv}.{tail}"),
        [level @ ("down" | "up"), index, "block", resnet, tail @ ..] => {
            let index: usize = index.parse().ok()?;
            let (blocks, index) = match *level {
                "down" => ("down_blocks", index),
                _ => ("up_blocks", levels.checked_sub(index + 1)?),
            };
            format!("{blocks}.{index}.resnets.{resnet}.{}", resnet_tail(tail))
        }
        ["down", index, "downsample", tail @ ..] => {
            format!("down_blocks.{index}.downsamplers.0.{}", tail.join("."))
        }
        ["up", index, "upsample", tail @ ..] => {
            let index = levels.checked_sub(index.parse::<usize>().ok()? + 1)?;
            format!("up_blocks.{index}.upsamplers.0.{}", tail.join("."))
        }
        ["mid", block @ ("block_1" | "block_2"), tail @ ..] => {
            let index = if *block == "block_1" { 0 } else { 1 };
            format!("mid_block.resnets.{index}.{}", resnet_tail(tail))
        }
        ["mid", "attn_1", layer, tail] => {
            let (renamed, matrix) = match *layer {
                "norm" => ("group_norm", false),
                "q" => ("to_q", true),
                "k" => ("to_k", true),
                "v" => ("to_v", true),
                "proj_out" => ("to_out.0", true),
                _ => return None,
            };
            return Some((
                format!("{coder}.mid_block.attentions.0.{renamed}.{tail}"),
                matrix,
            ));
        }
        _ => return None,
    };
    Some((format!("{coder}.{renamed}"), false))
}

/// A resnet's layer in diffusers' names (`nin_shortcut` is `conv_shortcut`).
fn resnet_tail(tail: &[&str]) -> String {
    match tail {
        ["nin_shortcut", rest @ ..] => format!("conv_shortcut.{}", rest.join(".")),
        _ => tail.join("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, shape: &[usize]) -> HeaderTensor {
        HeaderTensor {
            name: name.to_string(),
            dtype: "F32".to_string(),
            shape: shape.to_vec(),
            offset: 0,
            bytes: 0,
        }
    }

    #[test]
    fn ldm_autoencoder_names_become_diffusers_names() {
        // Proves the LDM → diffusers table of the Flux `ae.safetensors` (as diffusers'
        // convert_ldm_vae_checkpoint maps it): up levels reversed, the mid attention's
        // 1×1 convolutions read as matrices, nin_shortcut and norm_out renamed, and
        // what diffusers drops left out.
        let part = CheckpointPart::under("vae.", PartNames::LdmAutoencoder);
        let tensors = [
            ("vae.decoder.up.0.block.0.conv1.weight", &[8, 8, 3, 3][..]),
            ("vae.decoder.up.3.block.2.nin_shortcut.bias", &[8]),
            ("vae.decoder.up.3.upsample.conv.weight", &[8, 8, 3, 3]),
            ("vae.decoder.mid.attn_1.q.weight", &[8, 8, 1, 1]),
            ("vae.decoder.mid.attn_1.proj_out.bias", &[8]),
            ("vae.decoder.mid.attn_1.norm.weight", &[8]),
            ("vae.decoder.mid.block_2.norm1.weight", &[8]),
            ("vae.decoder.norm_out.bias", &[8]),
            ("vae.encoder.down.1.downsample.conv.weight", &[8, 8, 3, 3]),
            ("vae.encoder.down.0.block.1.conv2.weight", &[8, 8, 3, 3]),
            ("vae.encoder.conv_in.weight", &[8, 3, 3, 3]),
            ("vae.quant_conv.weight", &[32, 32, 1, 1]),
            ("vae.loss.logvar", &[]),
            ("model.diffusion_model.img_in.weight", &[8, 8]),
        ];
        let selected = part.select(
            tensors
                .iter()
                .map(|(name, shape)| tensor(name, shape))
                .collect(),
        );
        let names: Vec<(&str, &[usize])> = selected
            .iter()
            .map(|tensor| (tensor.name.as_str(), tensor.shape.as_slice()))
            .collect();
        assert_eq!(
            names,
            [
                (
                    "decoder.up_blocks.3.resnets.0.conv1.weight",
                    &[8, 8, 3, 3][..]
                ),
                ("decoder.up_blocks.0.resnets.2.conv_shortcut.bias", &[8]),
                (
                    "decoder.up_blocks.0.upsamplers.0.conv.weight",
                    &[8, 8, 3, 3]
                ),
                ("decoder.mid_block.attentions.0.to_q.weight", &[8, 8]),
                ("decoder.mid_block.attentions.0.to_out.0.bias", &[8]),
                ("decoder.mid_block.attentions.0.group_norm.weight", &[8]),
                ("decoder.mid_block.resnets.1.norm1.weight", &[8]),
                ("decoder.conv_norm_out.bias", &[8]),
                (
                    "encoder.down_blocks.1.downsamplers.0.conv.weight",
                    &[8, 8, 3, 3]
                ),
                (
                    "encoder.down_blocks.0.resnets.1.conv2.weight",
                    &[8, 8, 3, 3]
                ),
                ("encoder.conv_in.weight", &[8, 3, 3, 3]),
                ("quant_conv.weight", &[32, 32, 1, 1]),
            ]
        );
    }

    #[test]
    fn a_prefix_part_keeps_its_own_tensors_without_the_markers() {
        // Proves a prefixed part holds only its tensors, renamed without the prefix,
        // and leaves out ComfyUI's scaled-FP8 marker and input scales.
        let part = CheckpointPart::under("text_encoders.t5xxl.transformer.", PartNames::AsIs);
        let tensors = [
            "text_encoders.t5xxl.transformer.shared.weight",
            "text_encoders.t5xxl.transformer.scaled_fp8",
            "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.scale_weight",
            "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.scale_input",
            "text_encoders.clip_l.transformer.text_model.final_layer_norm.weight",
        ];
        let selected = part.select(tensors.iter().map(|name| tensor(name, &[1])).collect());
        let names: Vec<&str> = selected.iter().map(|tensor| tensor.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "shared.weight",
                "encoder.block.0.layer.0.SelfAttention.q.scale_weight"
            ]
        );
    }
}
