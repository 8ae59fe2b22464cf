//! The WAN video autoencoder's sizes, from diffusers' `vae/config.json`
//! (`_class_name: AutoencoderKLWan`), checked against what stagehand computes: Wan
//! 2.1's VAE (16 latent channels, used by Wan 2.1 and the Wan 2.2 A14B pipelines).
//! Wan 2.2's 48-channel VAE (`is_residual`, `patch_size: 2`) is refused by name.

use std::path::Path;

use serde_json::Value;

use crate::families::config_json::ConfigJson;
use crate::families::FamilyError;

/// Every `config.json` key of `AutoencoderKLWan` (diffusers 0.42) stagehand reads or
/// knows changes nothing the decoder computes (the encoder's, dropout at inference,
/// the compression ratios it checks); another key is refused by name.
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
    pub out_channels: usize,
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

    /// Pixels per latent position along each side: 2 per up block but the last.
    pub fn spatial_scale(&self) -> usize {
        1 << (self.dim_mult.len() - 1)
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
            return Err(json.bad(format!(
                "key `{key}` is not one AutoencoderKLWan reads; remove it or fix its name"
            )));
        }
        refuse_wan22(path, &json, config)?;
        if config
            .get("attn_scales")
            .and_then(Value::as_array)
            .is_some_and(|scales| !scales.is_empty())
        {
            return Err(json.bad(
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
            out_channels: json.count("out_channels", Some(3))?,
            dim_mult,
        };
        parsed.check_scales(&json)?;
        Ok(parsed)
    }

    /// `scale_factor_spatial` / `scale_factor_temporal`, when given, must be what the
    /// blocks make.
    fn check_scales(&self, json: &ConfigJson<'_>) -> Result<(), FamilyError> {
        let temporal = self.video_frames(2) - 1;
        for (key, made) in [
            ("scale_factor_spatial", self.spatial_scale()),
            ("scale_factor_temporal", temporal),
        ] {
            let stated = json.count(key, Some(made))?;
            if stated != made {
                return Err(json.bad(format!(
                    "`{key}` is {stated}, but dim_mult and temperal_downsample make {made}"
                )));
            }
        }
        if self.latents_std.iter().any(|&std| std <= 0.0) {
            return Err(json.bad("`latents_std` has a value that is not positive".into()));
        }
        Ok(())
    }
}

/// Wan 2.2's 48-channel VAE (residual up blocks, 2 × 2 patches): another decoder,
/// refused as a model stagehand does not compute (a caller can match on it).
fn refuse_wan22(path: &Path, json: &ConfigJson<'_>, config: &Value) -> Result<(), FamilyError> {
    let residual = json.flag("is_residual", false);
    let patched = config
        .get("patch_size")
        .is_some_and(|value| !value.is_null());
    if residual || patched {
        return Err(FamilyError::Unsupported {
            path: path.to_path_buf(),
            found: "Wan 2.2's 48-channel VAE".into(),
            message: format!(
                "{}: this is Wan 2.2's 48-channel VAE (`is_residual: true` / `patch_size` set, used by Wan2.2-TI2V-5B): stagehand computes Wan 2.1's 16-channel AutoencoderKLWan (the Wan 2.2 A14B pipelines' VAE) only",
                path.display()
            ),
        });
    }
    if json.flag("clip_output", true) {
        return Ok(());
    }
    Err(json.bad(
        "`clip_output` is false: diffusers' AutoencoderKLWan clamps its output to [-1, 1], and so does stagehand".into(),
    ))
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
        _ => Err(json.bad(format!(
            "`{key}` must be a list of at least {len} booleans (one per level but the last)"
        ))),
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
        _ => Err(json.bad(format!(
            "`{key}` must be a list of {len} numbers (one per latent channel, z_dim)"
        ))),
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

    #[test]
    fn the_22_vae_and_unknown_keys_are_refused_by_name() {
        // Proves the 48-channel VAE and a misspelt key are refused, each naming why.
        let refuse = |config: Value| {
            WanVaeConfig::from_json(Path::new("vae/config.json"), &config)
                .expect_err("refused")
                .to_string()
        };
        let mut wan22 = wan21();
        wan22["is_residual"] = json!(true);
        wan22["patch_size"] = json!(2);
        let refusal = WanVaeConfig::from_json(Path::new("vae/config.json"), &wan22);
        assert!(matches!(refusal, Err(FamilyError::Unsupported { .. })));
        let message = refusal.err().map(|error| error.to_string());
        assert!(message.is_some_and(|message| message.contains("Wan 2.2's 48-channel VAE")));
        let mut misspelt = wan21();
        misspelt["temporal_downsample"] = json!([false, true, true]);
        assert!(refuse(misspelt).contains("`temporal_downsample`"));
        let mut short = wan21();
        short["latents_std"] = json!([1.0]);
        assert!(refuse(short).contains("latents_std"));
    }
}
