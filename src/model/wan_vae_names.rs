//! The WAN VAE's original (Wan-AI) names as diffusers names them, for ComfyUI's
//! `vae/wan_2.1_vae.safetensors` and `vae/wan2.2_vae.safetensors`: the renames of
//! diffusers' `scripts/convert_wan_to_diffusers.py` (`convert_vae()` for Wan 2.1,
//! `convert_vae_22()` for Wan 2.2), so the file reads as the `AutoencoderKLWan`
//! folder's tensors. Every original tensor is one diffusers tensor, its shape kept
//! (the conversion neither reshapes nor splits: the middle attention's `to_qkv` and
//! `proj` are 1×1 convolutions on both sides), so the bytes are read where they lie.
//!
//! diffusers' 2.1 conversion numbers the decoder's flat list for the published VAE
//! (up levels of three res blocks and an upsampler: 0-2, 3, 4-6, 7 …); here the
//! stride comes from the file (the first upsampler's place), which is the same
//! mapping for the published VAE and the right one for another number of res blocks.
//! A name the conversion does not know is refused by name (diffusers would keep it,
//! and then fail its strict load).

/// diffusers' key that says a checkpoint is an original WAN VAE
/// (`CHECKPOINT_KEY_NAMES["wan_vae"]` of its single-file loader).
const MARKER: &str = "decoder.middle.0.residual.0.gamma";

/// Whether `names` (a checkpoint's, after `prefix`) are an original WAN VAE's.
pub(crate) fn is_original_wan_vae<'a>(
    prefix: &str,
    mut names: impl Iterator<Item = &'a str>,
) -> bool {
    let marker = format!("{prefix}{MARKER}");
    names.any(|name| name == marker)
}

/// What renaming a whole file needs beyond one name: where Wan 2.1's decoder puts
/// each level's upsampler in its flat list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WanVaeNames {
    /// Entries a Wan 2.1 decoder level takes (its res blocks and its upsampler);
    /// `None` when no flat upsampler is there (Wan 2.2, or one level).
    up_stride: Option<usize>,
}

impl WanVaeNames {
    /// The layout of the file whose names (after its prefix) are `names`.
    pub(crate) fn of<'a>(names: impl Iterator<Item = &'a str>) -> Self {
        let up_stride = names
            .filter_map(|name| {
                let rest = name.strip_prefix("decoder.upsamples.")?;
                let (index, tail) = rest.split_once('.')?;
                let sampler = tail.starts_with("resample.") || tail.starts_with("time_conv.");
                sampler.then(|| index.parse::<usize>().ok()).flatten()
            })
            .min()
            .map(|first| first + 1);
        Self { up_stride }
    }

    /// diffusers' name of the original tensor `name`, or why it is not one.
    pub(crate) fn diffusers_name(self, name: &str) -> Result<String, String> {
        let unknown = || {
            "is not a tensor of Wan-AI's VAE (diffusers' convert_vae/convert_vae_22 know encoder./decoder. conv1, downsamples/upsamples, middle.0-2 and head.0/2, and conv1/conv2 beside them); is this file a WAN VAE (ComfyUI's vae/wan_2.1_vae.safetensors or wan2.2_vae.safetensors)?".to_string()
        };
        match name.split_once('.') {
            Some(("conv1", tail)) => Ok(format!("quant_conv.{tail}")),
            Some(("conv2", tail)) => Ok(format!("post_quant_conv.{tail}")),
            Some((coder @ ("encoder" | "decoder"), rest)) => self
                .coder(coder, rest)
                .map(|renamed| format!("{coder}.{renamed}"))
                .ok_or_else(unknown),
            _ => Err(unknown()),
        }
    }

    /// One coder's tensor (`rest`, after `encoder.` or `decoder.`) in diffusers' names.
    fn coder(&self, coder: &str, rest: &str) -> Option<String> {
        let parts: Vec<&str> = rest.split('.').collect();
        match parts.as_slice() {
            ["conv1", tail @ ("weight" | "bias")] => Some(format!("conv_in.{tail}")),
            ["head", "0", "gamma"] => Some("norm_out.gamma".into()),
            ["head", "2", tail @ ("weight" | "bias")] => Some(format!("conv_out.{tail}")),
            ["middle", "0", tail @ ..] => Some(format!("mid_block.resnets.0.{}", resnet(tail)?)),
            ["middle", "2", tail @ ..] => Some(format!("mid_block.resnets.1.{}", resnet(tail)?)),
            ["middle", "1", tail @ ..] => {
                let known = matches!(
                    tail,
                    ["norm", "gamma"] | ["to_qkv" | "proj", "weight" | "bias"]
                );
                known.then(|| format!("mid_block.attentions.0.{}", tail.join(".")))
            }
            // Wan 2.2: each level's own list of res blocks and its resampler.
            [outer @ ("downsamples" | "upsamples"), level, inner, index, tail @ ..]
                if outer == inner =>
            {
                let (level, index) = (number(level)?, number(index)?);
                let blocks = if coder == "encoder" { "down" } else { "up" };
                match resnet(tail) {
                    Some(layer) => Some(format!("{blocks}_blocks.{level}.resnets.{index}.{layer}")),
                    None => {
                        let sampler = if coder == "encoder" {
                            "downsampler"
                        } else {
                            "upsampler"
                        };
                        Some(format!(
                            "{blocks}_blocks.{level}.{sampler}.{}",
                            resample(tail)?
                        ))
                    }
                }
            }
            // Wan 2.1's encoder: one flat list, diffusers' the same list.
            ["downsamples", index, tail @ ..] if coder == "encoder" => {
                let layer = resnet(tail).or_else(|| resample(tail))?;
                Some(format!("down_blocks.{}.{layer}", number(index)?))
            }
            // Wan 2.1's decoder: one flat list, grouped per level by diffusers.
            ["upsamples", index, tail @ ..] if coder == "decoder" => {
                self.up_level(number(index)?, tail)
            }
            _ => None,
        }
    }

    /// Wan 2.1's decoder entry `index` of the flat list, placed in its level.
    fn up_level(&self, index: usize, tail: &[&str]) -> Option<String> {
        let (level, place, is_sampler) = match self.up_stride {
            Some(stride) => (index / stride, index % stride, index % stride + 1 == stride),
            None => (0, index, false),
        };
        match (resnet(tail), is_sampler) {
            (Some(layer), false) => Some(format!("up_blocks.{level}.resnets.{place}.{layer}")),
            (None, true) => Some(format!(
                "up_blocks.{level}.upsamplers.0.{}",
                resample(tail)?
            )),
            _ => None,
        }
    }
}

fn number(text: &str) -> Option<usize> {
    text.parse().ok()
}

/// A res block's layer in diffusers' names (`residual` is Sequential(norm, SiLU,
/// conv, norm, SiLU, dropout, conv)); `None`: not a res block's.
fn resnet(tail: &[&str]) -> Option<String> {
    let layer = match tail {
        ["residual", "0", "gamma"] => "norm1.gamma".to_string(),
        ["residual", "2", end @ ("weight" | "bias")] => format!("conv1.{end}"),
        ["residual", "3", "gamma"] => "norm2.gamma".to_string(),
        ["residual", "6", end @ ("weight" | "bias")] => format!("conv2.{end}"),
        ["shortcut", end @ ("weight" | "bias")] => format!("conv_shortcut.{end}"),
        _ => return None,
    };
    Some(layer)
}

/// A resampler's layer, named alike on both sides (`resample.1` the spatial
/// convolution, `time_conv` the temporal one); `None`: not a resampler's.
fn resample(tail: &[&str]) -> Option<String> {
    let known = matches!(
        tail,
        ["resample", "1", "weight" | "bias"] | ["time_conv", "weight" | "bias"]
    );
    known.then(|| tail.join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn published_wan21_names_become_diffusers_names() {
        // Proves the published 2.1 layout (three res blocks and an upsampler a level)
        // maps as diffusers' convert_vae maps it: 0-2 and 4-6 grouped, 3 and 7 the
        // upsamplers, 4's shortcut the second level's first res block's.
        let originals = [
            "decoder.upsamples.3.resample.1.weight",
            "decoder.upsamples.7.time_conv.bias",
            "decoder.middle.0.residual.0.gamma",
        ];
        let names = WanVaeNames::of(originals.into_iter());
        let cases = [
            ("conv1.weight", "quant_conv.weight"),
            ("conv2.bias", "post_quant_conv.bias"),
            ("encoder.conv1.weight", "encoder.conv_in.weight"),
            ("decoder.head.0.gamma", "decoder.norm_out.gamma"),
            ("decoder.head.2.bias", "decoder.conv_out.bias"),
            (
                "decoder.middle.2.residual.6.weight",
                "decoder.mid_block.resnets.1.conv2.weight",
            ),
            (
                "encoder.middle.1.to_qkv.weight",
                "encoder.mid_block.attentions.0.to_qkv.weight",
            ),
            (
                "encoder.downsamples.2.shortcut.bias",
                "encoder.down_blocks.2.conv_shortcut.bias",
            ),
            (
                "encoder.downsamples.3.time_conv.weight",
                "encoder.down_blocks.3.time_conv.weight",
            ),
            (
                "decoder.upsamples.2.residual.3.gamma",
                "decoder.up_blocks.0.resnets.2.norm2.gamma",
            ),
            (
                "decoder.upsamples.3.resample.1.bias",
                "decoder.up_blocks.0.upsamplers.0.resample.1.bias",
            ),
            (
                "decoder.upsamples.4.shortcut.weight",
                "decoder.up_blocks.1.resnets.0.conv_shortcut.weight",
            ),
            (
                "decoder.upsamples.7.time_conv.weight",
                "decoder.up_blocks.1.upsamplers.0.time_conv.weight",
            ),
            (
                "decoder.upsamples.14.residual.2.bias",
                "decoder.up_blocks.3.resnets.2.conv1.bias",
            ),
        ];
        for (original, diffusers) in cases {
            assert_eq!(
                names.diffusers_name(original).as_deref(),
                Ok(diffusers),
                "{original}"
            );
        }
    }

    #[test]
    fn wan22_names_become_diffusers_names() {
        // Proves the 2.2 nesting (each level's own list) maps as convert_vae_22 maps
        // it: res blocks to `resnets`, the last entry to the level's sampler.
        let names =
            WanVaeNames::of(["decoder.upsamples.0.upsamples.3.resample.1.weight"].into_iter());
        let cases = [
            (
                "encoder.downsamples.1.downsamples.0.residual.2.weight",
                "encoder.down_blocks.1.resnets.0.conv1.weight",
            ),
            (
                "encoder.downsamples.1.downsamples.2.time_conv.bias",
                "encoder.down_blocks.1.downsampler.time_conv.bias",
            ),
            (
                "decoder.upsamples.3.upsamples.0.shortcut.weight",
                "decoder.up_blocks.3.resnets.0.conv_shortcut.weight",
            ),
            (
                "decoder.upsamples.0.upsamples.3.resample.1.weight",
                "decoder.up_blocks.0.upsampler.resample.1.weight",
            ),
        ];
        for (original, diffusers) in cases {
            assert_eq!(
                names.diffusers_name(original).as_deref(),
                Ok(diffusers),
                "{original}"
            );
        }
    }

    #[test]
    fn unknown_names_are_refused() {
        // Proves a name outside the conversion's table is refused, not passed on.
        let names = WanVaeNames::of(["decoder.upsamples.3.resample.1.weight"].into_iter());
        for name in [
            "decoder.upsamples.3.residual.0.gamma",
            "decoder.upsamples.1.resample.1.weight",
            "decoder.middle.1.q.weight",
            "encoder.head.1.weight",
            "model.diffusion_model.head.head.weight",
            "vae.decoder.conv1.weight",
        ] {
            let error = names.diffusers_name(name).expect_err(name);
            assert!(error.contains("Wan-AI's VAE"), "{name}: {error}");
        }
        assert!(is_original_wan_vae("", [MARKER].into_iter()));
        assert!(!is_original_wan_vae("vae.", [MARKER].into_iter()));
    }
}
