//! A WAN transformer's sizes, from diffusers' `transformer/config.json`
//! (`_class_name: WanTransformer3DModel`). Every key diffusers writes is named here:
//! those read, those that change nothing computed, and those whose other values
//! stagehand does not compute (Wan 2.1's image embedder) are refused by name.

use std::path::Path;

use serde_json::Value;

use crate::families::config_json::ConfigJson;
use crate::families::FamilyError;

/// Every `config.json` key of `WanTransformer3DModel` that stagehand reads.
const READ_KEYS: &[&str] = &[
    "patch_size",
    "num_attention_heads",
    "attention_head_dim",
    "in_channels",
    "out_channels",
    "text_dim",
    "freq_dim",
    "ffn_dim",
    "num_layers",
    "cross_attn_norm",
    "qk_norm",
    "eps",
    "image_dim",
    "added_kv_proj_dim",
    "rope_max_seq_len",
    "pos_embed_seq_len",
];
/// Keys that change nothing computed: bookkeeping of diffusers.
const IGNORED_KEYS: &[&str] = &["_class_name", "_diffusers_version", "_name_or_path"];

/// The one query/key normalisation stagehand computes (every published WAN's).
pub const QK_NORM: &str = "rms_norm_across_heads";

#[derive(Debug, Clone, PartialEq)]
pub struct WanConfig {
    /// Frames, rows and columns of one patch (1, 2, 2 in every WAN).
    pub patch: [usize; 3],
    pub heads: usize,
    pub head_dim: usize,
    /// Latent channels in (16; 36 for image-to-video: noise, mask and image) and out.
    pub in_channels: usize,
    pub out_channels: usize,
    /// umT5's hidden width.
    pub text_dim: usize,
    /// Sinusoidal frequencies of the timestep embedding.
    pub freq_dim: usize,
    pub ffn_dim: usize,
    pub layers: usize,
    /// `norm2`, an affine LayerNorm before cross-attention (else none).
    pub cross_attn_norm: bool,
    pub eps: f32,
    /// Positions of each rope axis (patches along frames, rows or columns).
    pub rope_max_seq_len: usize,
}

impl WanConfig {
    pub fn dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Values of one patch of the latent going in, and of the velocity coming out.
    pub fn patch_in(&self) -> usize {
        self.in_channels * self.patch.iter().product::<usize>()
    }

    pub fn patch_out(&self) -> usize {
        self.out_channels * self.patch.iter().product::<usize>()
    }

    /// The head's split over the rope's frame, row and column axes (diffusers'
    /// `WanRotaryPosEmbed`: rows and columns `2·(head_dim / 6)` each, frames the rest).
    pub fn rope_axes(&self) -> [usize; 3] {
        let spatial = 2 * (self.head_dim / 6);
        [self.head_dim - 2 * spatial, spatial, spatial]
    }

    /// From diffusers' `config.json`: unknown keys, and values that change the math
    /// stagehand does not compute, are refused by name.
    pub fn from_json(path: &Path, config: &Value) -> Result<Self, FamilyError> {
        let json = ConfigJson::new(path, config)?;
        let object = config.as_object().into_iter().flatten();
        for (key, value) in object {
            if !READ_KEYS.contains(&key.as_str()) && !IGNORED_KEYS.contains(&key.as_str()) {
                return Err(json.bad(
                    key,
                    format!(
                    "key `{key}` is not one WanTransformer3DModel reads; remove it or fix its name"
                ),
                ));
            }
            // Wan 2.1's image-to-video and first-last-frame models condition on CLIP
            // image states through extra k/v projections; Wan 2.2's take the image as
            // latent channels instead (in_channels 36), which is computed.
            let refused = matches!(
                key.as_str(),
                "image_dim" | "added_kv_proj_dim" | "pos_embed_seq_len"
            );
            if refused && !value.is_null() {
                return Err(json.bad(key, format!(
                    "`{key}` is {value}: the image embedder and the image k/v of Wan 2.1's image-to-video models are not computed; stagehand computes WAN transformers with `{key}: null` (Wan 2.2 T2V, I2V and TI2V)"
                )));
            }
        }
        json.require_text("qk_norm", &[QK_NORM])?;
        if config.get("qk_norm").is_some_and(Value::is_null) {
            return Err(json.bad(
                "qk_norm",
                format!("`qk_norm` is null; stagehand computes \"{QK_NORM}\""),
            ));
        }
        let patch = match config.get("patch_size") {
            None | Some(Value::Null) => [1, 2, 2],
            Some(_) => match json.counts("patch_size")?[..] {
                [frames, rows, cols] => [frames, rows, cols],
                ref other => {
                    return Err(json.bad(
                        "patch_size",
                        format!(
                    "`patch_size` is {other:?}; three numbers (frames, rows, columns) are expected"
                ),
                    ))
                }
            },
        };
        let in_channels = json.count("in_channels", Some(16))?;
        let config = Self {
            patch,
            heads: json.count("num_attention_heads", Some(40))?,
            head_dim: json.count("attention_head_dim", Some(128))?,
            in_channels,
            // diffusers: `out_channels or in_channels`.
            out_channels: json.count("out_channels", Some(in_channels))?,
            text_dim: json.count("text_dim", Some(4096))?,
            freq_dim: json.count("freq_dim", Some(256))?,
            ffn_dim: json.count("ffn_dim", Some(13824))?,
            layers: json.count("num_layers", Some(40))?,
            cross_attn_norm: json.flag("cross_attn_norm", true),
            eps: json.float("eps", 1e-6)? as f32,
            rope_max_seq_len: json.count("rope_max_seq_len", Some(1024))?,
        };
        if config.head_dim % 2 != 0 || config.freq_dim % 2 != 0 {
            return Err(json.bad("attention_head_dim", format!(
                "`attention_head_dim` {} and `freq_dim` {} must be even (rotary pairs, sine and cosine halves)",
                config.head_dim, config.freq_dim
            )));
        }
        if config.eps.is_nan() || config.eps <= 0.0 {
            return Err(json.bad("eps", format!("`eps` is {}; a positive number", config.eps)));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<WanConfig, FamilyError> {
        let value: Value = serde_json::from_str(text).expect("json");
        WanConfig::from_json(Path::new("config.json"), &value)
    }

    #[test]
    fn the_a14b_expert_and_ti2v_configs_read_and_wan21_image_keys_are_refused() {
        // Proves the published Wan 2.2 configs read as their shapes (the rope's axes of
        // a 128 head: 44, 42, 42), and that Wan 2.1's image embedder, an unknown key
        // and another q/k norm are refused by name.
        let a14b = parse(
            r#"{"_class_name": "WanTransformer3DModel", "_diffusers_version": "0.35.0",
                "added_kv_proj_dim": null, "attention_head_dim": 128, "cross_attn_norm": true,
                "eps": 1e-06, "ffn_dim": 13824, "freq_dim": 256, "image_dim": null,
                "in_channels": 16, "num_attention_heads": 40, "num_layers": 40,
                "out_channels": 16, "patch_size": [1, 2, 2], "pos_embed_seq_len": null,
                "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 1024, "text_dim": 4096}"#,
        )
        .expect("reads");
        assert_eq!((a14b.dim(), a14b.layers, a14b.ffn_dim), (5120, 40, 13824));
        assert_eq!(a14b.rope_axes(), [44, 42, 42]);
        assert_eq!((a14b.patch_in(), a14b.patch_out()), (64, 64));
        let ti2v = parse(
            r#"{"attention_head_dim": 128, "ffn_dim": 14336, "in_channels": 48,
                "num_attention_heads": 24, "num_layers": 30, "out_channels": 48}"#,
        )
        .expect("reads");
        assert_eq!((ti2v.dim(), ti2v.patch_in()), (3072, 192));
        for (text, named) in [
            (r#"{"image_dim": 1280}"#, "image_dim"),
            (r#"{"added_kv_proj_dim": 5120}"#, "added_kv_proj_dim"),
            (r#"{"pos_embed_seq_len": 514}"#, "pos_embed_seq_len"),
            (r#"{"qk_norm": "rms_norm"}"#, "qk_norm"),
            (r#"{"num_single_layers": 2}"#, "num_single_layers"),
        ] {
            let error = parse(text).expect_err(text).to_string();
            assert!(error.contains(named), "{error}");
        }
    }
}
