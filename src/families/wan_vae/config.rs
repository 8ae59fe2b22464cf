//! The WAN video autoencoder's sizes, from diffusers' `vae/config.json`
//! (`_class_name: AutoencoderKLWan`), checked against what stagehand computes: Wan
//! 2.1's VAE (16 latent channels, used by Wan 2.1 and the Wan 2.2 A14B pipelines)
//! and Wan 2.2's (48 channels, TI2V-5B's: `is_residual` blocks with their
//! shortcuts, frames cut into 2 × 2 patches of 12 channels, `patch_size: 2`).

use std::path::Path;

use serde_json::Value;

use crate::families::config_json::ConfigJson;
use crate::families::FamilyError;

/// Every `config.json` key of `AutoencoderKLWan` (diffusers 0.42) stagehand reads or
/// knows changes nothing the decoder computes (the encoder's, dropout at inference,
/// the compression ratios it checks); another key is refused by name. `clip_output`
/// (which Wan 2.2's converted config may write as false) is not read by diffusers
/// 0.42, which clamps the decoded video to [−1, 1] whatever it says, as the original
/// Wan 2.2 code clamps after its decode: so does stagehand.
const KNOWN_KEYS: &[&str] = &[
    "_class_name",
    "_diffusers_version",
    "_name_or_path",
    "attn_scales",
    "base_dim",
    "clip_output",
    "decoder_base_dim",
    "dim_mult",
    "dropout",
    "in_channels",
    "is_residual",
    "latents_mean",
    "latents_std",
    "num_res_blocks",
    "out_channels",
    "patch_size",
    "scale_factor_spatial",
    "scale_factor_temporal",
    "temperal_downsample",
    "z_dim",
];

#[derive(Debug, Clone, PartialEq)]
pub struct WanVaeConfig {
    /// The decoder's base width (`decoder_base_dim`, else `base_dim`): 96 in Wan 2.1.
    pub base_dim: usize,
    /// The encoder's (`base_dim`).
    pub encoder_base_dim: usize,
    pub z_dim: usize,
    /// Width multipliers, full resolution first (Wan 2.1: 1, 2, 4, 4).
    pub dim_mult: Vec<usize>,
    pub num_res_blocks: usize,
    /// Per up block but the last, whether it doubles the frames (the encoder's
    /// `temperal_downsample` reversed: Wan 2.1's decoder doubles in its first two).
    pub temporal_upsample: Vec<bool>,
    /// A pipeline's latent is `(z − mean) / std` per channel of the VAE's own.
    pub latents_mean: Vec<f32>,
    pub latents_std: Vec<f32>,
    /// The decoder's output channels (`out_channels`): 3, or 3 · patch² when the
    /// frames are patched (12 in Wan 2.2).
    pub out_channels: usize,
    /// Wan 2.2's residual blocks (`is_residual`): no channel halving after an
    /// upsampling, and each level's shortcut (`DupUp3D` up, `AvgDown3D` down).
    pub is_residual: bool,
    /// The side of the square patches the frames are cut into (`patch_size`;
    /// 1 when `null`): the decoder's output is unpatchified, the encoder's input
    /// patchified.
    pub patch_size: usize,
}

impl WanVaeConfig {
    /// Channels of the decoder's stages: the middle block's, then each up block's.
    pub fn dims(&self) -> Vec<usize> {
        let deepest = self.dim_mult.last().copied().unwrap_or(1);
        std::iter::once(deepest)
            .chain(self.dim_mult.iter().rev().copied())
            .map(|mult| self.base_dim * mult)
            .collect()
    }

    /// Positions of the decoder's output per latent position along each side: 2 per
    /// up block but the last (the patches' grid when the frames are patched).
    pub fn spatial_scale(&self) -> usize {
        1 << (self.dim_mult.len() - 1)
    }

    /// Pixels per latent position along each side (`scale_factor_spatial`): the
    /// decoder's scale times the patch (8 in Wan 2.1, 16 in Wan 2.2).
    pub fn pixel_scale(&self) -> usize {
        self.spatial_scale() * self.patch_size
    }

    /// Colour channels of a video (`out_channels` over the patch's area).
    pub fn video_channels(&self) -> usize {
        self.out_channels / (self.patch_size * self.patch_size)
    }

    /// Video frames of `latent_frames` latent frames: the first frame alone, each
    /// later one doubled by every temporal upsampling.
    pub fn video_frames(&self, latent_frames: usize) -> usize {
        let per_chunk = 1 << self.temporal_upsample.iter().filter(|&&t| t).count();
        1 + per_chunk * latent_frames.saturating_sub(1)
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
                format!("key `{key}` is not one AutoencoderKLWan reads; remove it or fix its name"),
            ));
        }
        let patch_size = patch_size(&json, config)?;
        if config
            .get("attn_scales")
            .and_then(Value::as_array)
            .is_some_and(|scales| !scales.is_empty())
        {
            return Err(json.bad(
                "attn_scales",
                "`attn_scales` is not empty: attention outside the middle block is not computed (every published WAN VAE has none)".into(),
            ));
        }
        let dim_mult = json.counts("dim_mult")?;
        let base_dim = json.count("base_dim", Some(96))?;
        let z_dim = json.count("z_dim", Some(16))?;
        let temporal = flags(&json, config, "temperal_downsample", dim_mult.len() - 1)?;
        let parsed = Self {
            base_dim: json.count("decoder_base_dim", Some(base_dim))?,
            encoder_base_dim: base_dim,
            z_dim,
            num_res_blocks: json.count("num_res_blocks", Some(2))?,
            temporal_upsample: temporal.into_iter().rev().collect(),
            latents_mean: floats(&json, config, "latents_mean", z_dim)?,
            latents_std: floats(&json, config, "latents_std", z_dim)?,
            out_channels: json.count("out_channels", Some(3 * patch_size * patch_size))?,
            is_residual: json.flag("is_residual", false),
            patch_size,
            dim_mult,
        };
        parsed.check_channels(&json)?;
        parsed.check_scales(&json)?;
        Ok(parsed)
    }

    /// `scale_factor_spatial` / `scale_factor_temporal`, when given, must be what the
    /// blocks make.
    fn check_scales(&self, json: &ConfigJson<'_>) -> Result<(), FamilyError> {
        let temporal = self.video_frames(2) - 1;
        for (key, made) in [
            ("scale_factor_spatial", self.pixel_scale()),
            ("scale_factor_temporal", temporal),
        ] {
            let stated = json.count(key, Some(made))?;
            if stated != made {
                return Err(json.bad(
                    key,
                    format!(
                        "`{key}` is {stated}, but dim_mult and temperal_downsample make {made}"
                    ),
                ));
            }
        }
        if self.latents_std.iter().any(|&std| std <= 0.0) {
            return Err(json.bad(
                "latents_std",
                "`latents_std` has a value that is not positive".into(),
            ));
        }
        Ok(())
    }
}

impl WanVaeConfig {
    /// RGB in and out: `in_channels` and `out_channels` are 3 per patch position.
    fn check_channels(&self, json: &ConfigJson<'_>) -> Result<(), FamilyError> {
        let rgb = 3 * self.patch_size * self.patch_size;
        let in_channels = json.count("in_channels", Some(rgb))?;
        if in_channels != rgb || self.out_channels != rgb {
            return Err(json.bad("in_channels", format!(
                "`in_channels` {in_channels} and `out_channels` {}: RGB frames in patches of {} are {rgb} channels (3 · patch_size²)",
                self.out_channels, self.patch_size
            )));
        }
        Ok(())
    }
}

/// `patch_size`: `null` (1) or 2, Wan 2.2's; another size is refused by name.
fn patch_size(json: &ConfigJson<'_>, config: &Value) -> Result<usize, FamilyError> {
    match config.get("patch_size") {
        None | Some(Value::Null) => Ok(1),
        Some(_) => match json.count("patch_size", None)? {
            size @ (1 | 2) => Ok(size),
            size => Err(json.bad(
                "patch_size",
                format!(
                "`patch_size` is {size}: the published WAN VAEs have none (Wan 2.1) or 2 (Wan 2.2)"
            ),
            )),
        },
    }
}

/// A list of `len` booleans under `key`.
fn flags(
    json: &ConfigJson<'_>,
    config: &Value,
    key: &str,
    len: usize,
) -> Result<Vec<bool>, FamilyError> {
    let values: Option<Vec<bool>> = config
        .get(key)
        .and_then(Value::as_array)
        .and_then(|list| list.iter().map(Value::as_bool).collect());
    match values {
        Some(values) if values.len() >= len => Ok(values[..len].to_vec()),
        _ => Err(json.bad(
            key,
            format!(
                "`{key}` must be a list of at least {len} booleans (one per level but the last)"
            ),
        )),
    }
}

/// A list of `len` numbers under `key`.
fn floats(
    json: &ConfigJson<'_>,
    config: &Value,
    key: &str,
    len: usize,
) -> Result<Vec<f32>, FamilyError> {
    let values: Option<Vec<f32>> = config
        .get(key)
        .and_then(Value::as_array)
        .and_then(|list| list.iter().map(|v| v.as_f64().map(|v| v as f32)).collect());
    match values {
        Some(values) if values.len() == len => Ok(values),
        _ => Err(json.bad(
            key,
            format!("`{key}` must be a list of {len} numbers (one per latent channel, z_dim)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn wan21() -> Value {
        json!({
            "_class_name": "AutoencoderKLWan", "base_dim": 96, "z_dim": 16,
            "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
            "temperal_downsample": [false, true, true], "dropout": 0.0,
            "latents_mean": vec![0.0; 16], "latents_std": vec![1.0; 16],
            "is_residual": false, "in_channels": 3, "out_channels": 3,
            "patch_size": null, "scale_factor_temporal": 4, "scale_factor_spatial": 8,
        })
    }

    #[test]
    fn wan21_config_gives_its_stages_and_frames() {
        // Proves the decoder's widths (384 in the middle, down to 96) and that 21
        // latent frames decode to 81 video frames at 8× the size.
        let config = WanVaeConfig::from_json(Path::new("vae/config.json"), &wan21())
            .expect("reads Wan 2.1's config");
        assert_eq!(config.dims(), [384, 384, 384, 192, 96]);
        assert_eq!(config.temporal_upsample, [true, true, false]);
        assert_eq!(config.video_frames(21), 81);
        assert_eq!(config.spatial_scale(), 8);
    }

    /// TI2V-5B's VAE config as diffusers' conversion writes it (means and stds
    /// zero and one here).
    fn wan22() -> Value {
        json!({
            "_class_name": "AutoencoderKLWan", "base_dim": 160, "decoder_base_dim": 256,
            "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
            "temperal_downsample": [false, true, true], "dropout": 0.0,
            "latents_mean": vec![0.0; 48], "latents_std": vec![1.0; 48],
            "is_residual": true, "in_channels": 12, "out_channels": 12, "patch_size": 2,
            "scale_factor_temporal": 4, "scale_factor_spatial": 16, "clip_output": false,
        })
    }

    #[test]
    fn wan22_config_gives_its_residual_stages_and_patches() {
        // Proves Wan 2.2's VAE is read: no halved widths (1024 … 256), 16 pixels a
        // latent position (8 of the decoder's times the patch of 2), RGB in 12 channels.
        let config = WanVaeConfig::from_json(Path::new("vae/config.json"), &wan22())
            .expect("reads Wan 2.2's config");
        assert_eq!(config.dims(), [1024, 1024, 1024, 512, 256]);
        assert_eq!(config.encoder_base_dim, 160);
        assert!(config.is_residual);
        assert_eq!((config.spatial_scale(), config.pixel_scale()), (8, 16));
        assert_eq!((config.out_channels, config.video_channels()), (12, 3));
        assert_eq!(config.video_frames(31), 121);
    }

    #[test]
    fn bad_patches_and_unknown_keys_are_refused_by_name() {
        // Proves a patch other than 2, channels that are not RGB in patches, a wrong
        // scale and a misspelt key are refused, each naming why.
        let refuse = |config: Value| {
            WanVaeConfig::from_json(Path::new("vae/config.json"), &config)
                .expect_err("refused")
                .to_string()
        };
        let mut patch = wan22();
        patch["patch_size"] = json!(4);
        assert!(refuse(patch).contains("`patch_size` is 4"));
        let mut channels = wan22();
        channels["out_channels"] = json!(3);
        assert!(refuse(channels).contains("3 · patch_size²"));
        let mut scale = wan22();
        scale["scale_factor_spatial"] = json!(8);
        assert!(refuse(scale).contains("scale_factor_spatial"));
        let mut misspelt = wan21();
        misspelt["temporal_downsample"] = json!([false, true, true]);
        assert!(refuse(misspelt).contains("`temporal_downsample`"));
        let mut short = wan21();
        short["latents_std"] = json!([1.0]);
        assert!(refuse(short).contains("latents_std"));
    }
}
