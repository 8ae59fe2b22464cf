//! Generated WAN transformers with WAN's block structure and seeded weights, as
//! diffusers lays them out (`transformer/config.json` and
//! `diffusion_pytorch_model.safetensors`; no model hub is reachable offline): tiny
//! and small ones for tests, and the published shapes for real-shape runs.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::config::{WanConfig, QK_NORM};
use super::open::CLASS_NAME;
use crate::compute::DType;
use crate::model::generated::{write_model_folder, TensorSpec};

/// Which shape `demo-model --arch wan` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum WanPreset {
    /// 2 blocks of width 32 (2 heads of 16), FFN 64, text width 32.
    Tiny,
    /// 4 blocks of width 128 (4 heads of 32), FFN 256, text width 64.
    Small,
    /// One expert of Wan 2.2 T2V-A14B: 40 blocks of width 5120 (40 heads of 128),
    /// FFN 13 824, umT5's 4096, 16 latent channels: 14.3 B parameters (26.6 GiB in
    /// BF16).
    A14b,
    /// One expert of Wan 2.2 I2V-A14B: as A14b with 36 channels in (noise, mask and
    /// the image's latent).
    I2vA14b,
    /// Wan 2.2 TI2V-5B: 30 blocks of width 3072 (24 heads of 128), FFN 14 336, 48
    /// latent channels in and out.
    Ti2v5b,
    /// Tiny with TI2V-5B's 48 latent channels in and out (the 48-channel VAE's).
    Ti2vTiny,
}

impl WanPreset {
    /// The preset's sizes.
    pub fn config(self) -> WanConfig {
        let tiny = WanConfig {
            patch: [1, 2, 2],
            heads: 2,
            head_dim: 16,
            in_channels: 16,
            out_channels: 16,
            text_dim: 32,
            freq_dim: 32,
            ffn_dim: 64,
            layers: 2,
            cross_attn_norm: true,
            eps: 1e-6,
            rope_max_seq_len: 1024,
        };
        let a14b = WanConfig {
            heads: 40,
            head_dim: 128,
            text_dim: 4096,
            freq_dim: 256,
            ffn_dim: 13_824,
            layers: 40,
            ..tiny.clone()
        };
        match self {
            WanPreset::Tiny => tiny,
            WanPreset::Small => WanConfig {
                heads: 4,
                head_dim: 32,
                text_dim: 64,
                freq_dim: 64,
                ffn_dim: 256,
                layers: 4,
                ..tiny
            },
            WanPreset::Ti2vTiny => WanConfig {
                in_channels: 48,
                out_channels: 48,
                ..tiny
            },
            WanPreset::A14b => a14b,
            WanPreset::I2vA14b => WanConfig {
                in_channels: 36,
                ..a14b
            },
            WanPreset::Ti2v5b => WanConfig {
                heads: 24,
                ffn_dim: 14_336,
                layers: 30,
                in_channels: 48,
                out_channels: 48,
                ..a14b
            },
        }
    }
}

/// A generated WAN transformer to write.
#[derive(Debug, Clone, Copy)]
pub struct WanDemo {
    pub preset: WanPreset,
    /// F32, F16 or BF16.
    pub dtype: DType,
    pub seed: u64,
}

/// The tensors of a preset, in diffusers' names, each from its own seed.
struct Tensors {
    seed: u64,
    list: Vec<TensorSpec>,
}

impl Tensors {
    fn push(&mut self, name: String, shape: Vec<usize>, center: f32, spread: f32) {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let tensor = TensorSpec::uniform(name, shape, self.seed, center, spread);
        self.list.push(tensor);
    }

    fn linear(&mut self, stem: &str, rows: usize, cols: usize) {
        let spread = 1.0 / (cols as f32).sqrt();
        self.push(format!("{stem}.weight"), vec![rows, cols], 0.0, spread);
        self.push(format!("{stem}.bias"), vec![rows], 0.0, 0.02);
    }

    fn attention(&mut self, at: &str, dim: usize) {
        for projection in ["to_q", "to_k", "to_v", "to_out.0"] {
            self.linear(&format!("{at}.{projection}"), dim, dim);
        }
        for norm in ["norm_q", "norm_k"] {
            self.push(format!("{at}.{norm}.weight"), vec![dim], 1.0, 0.1);
        }
    }
}

impl WanDemo {
    fn tensors(&self) -> Vec<TensorSpec> {
        let config = self.preset.config();
        let (dim, [pt, ph, pw]) = (config.dim(), config.patch);
        let mut tensors = Tensors {
            seed: self.seed,
            list: Vec::new(),
        };
        let patch = vec![dim, config.in_channels, pt, ph, pw];
        let spread = 1.0 / (config.patch_in() as f32).sqrt();
        tensors.push("patch_embedding.weight".into(), patch, 0.0, spread);
        tensors.push("patch_embedding.bias".into(), vec![dim], 0.0, 0.02);
        let embedder = "condition_embedder";
        tensors.linear(
            &format!("{embedder}.time_embedder.linear_1"),
            dim,
            config.freq_dim,
        );
        tensors.linear(&format!("{embedder}.time_embedder.linear_2"), dim, dim);
        tensors.linear(&format!("{embedder}.time_proj"), 6 * dim, dim);
        tensors.linear(
            &format!("{embedder}.text_embedder.linear_1"),
            dim,
            config.text_dim,
        );
        tensors.linear(&format!("{embedder}.text_embedder.linear_2"), dim, dim);
        let table_spread = 1.0 / (dim as f32).sqrt();
        for block in 0..config.layers {
            let at = format!("blocks.{block}");
            tensors.push(
                format!("{at}.scale_shift_table"),
                vec![1, 6, dim],
                0.0,
                table_spread,
            );
            tensors.attention(&format!("{at}.attn1"), dim);
            tensors.attention(&format!("{at}.attn2"), dim);
            tensors.push(format!("{at}.norm2.weight"), vec![dim], 1.0, 0.1);
            tensors.push(format!("{at}.norm2.bias"), vec![dim], 0.0, 0.02);
            tensors.linear(&format!("{at}.ffn.net.0.proj"), config.ffn_dim, dim);
            tensors.linear(&format!("{at}.ffn.net.2"), dim, config.ffn_dim);
        }
        tensors.push(
            "scale_shift_table".into(),
            vec![1, 2, dim],
            0.0,
            table_spread,
        );
        tensors.linear("proj_out", config.patch_out(), dim);
        tensors.list
    }

    /// Bytes of the weights written.
    pub fn weight_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|tensor| tensor.bytes(self.dtype))
            .sum()
    }

    /// diffusers' `config.json` of the preset.
    pub fn config_json(&self) -> serde_json::Value {
        let config = self.preset.config();
        json!({
            "_class_name": CLASS_NAME,
            "_diffusers_version": "0.42.1",
            "added_kv_proj_dim": null,
            "attention_head_dim": config.head_dim,
            "cross_attn_norm": config.cross_attn_norm,
            "eps": config.eps,
            "ffn_dim": config.ffn_dim,
            "freq_dim": config.freq_dim,
            "image_dim": null,
            "in_channels": config.in_channels,
            "num_attention_heads": config.heads,
            "num_layers": config.layers,
            "out_channels": config.out_channels,
            "patch_size": config.patch,
            "pos_embed_seq_len": null,
            "qk_norm": QK_NORM,
            "rope_max_seq_len": config.rope_max_seq_len,
            "text_dim": config.text_dim,
        })
    }

    /// Writes `transformer/` with `config.json` and
    /// `diffusion_pytorch_model.safetensors` under `dir`; returns what `--model` takes.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        write_model_folder(
            &dir.join("transformer"),
            &self.config_json(),
            ("diffusion_pytorch_model.safetensors", &self.tensors()),
            (self.dtype, "WAN"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_shape_presets_have_the_published_parameter_counts() {
        // Proves the A14B expert's tensors add up to the published 14.3 B parameters
        // (config/models/wan2.2-14b.toml counts them: 14 288 491 584), TI2V-5B's to
        // its 5 B, and that each preset's config.json reads back as its config.
        let parameters = |preset| {
            let demo = WanDemo {
                preset,
                dtype: DType::Bf16,
                seed: 1,
            };
            let path = Path::new("config.json");
            assert_eq!(
                WanConfig::from_json(path, &demo.config_json()).expect("reads"),
                preset.config()
            );
            demo.weight_bytes() / 2
        };
        assert_eq!(parameters(WanPreset::A14b), 14_288_491_584);
        let ti2v = parameters(WanPreset::Ti2v5b);
        assert!((4_900_000_000..5_100_000_000).contains(&ti2v), "{ti2v}");
        assert!(parameters(WanPreset::Tiny) < 100_000);
        assert!(parameters(WanPreset::Ti2vTiny) < 100_000);
    }
}
