//! Generated WAN transformers with WAN's block structure and seeded weights, as
//! diffusers lays them out (`transformer/config.json` and
//! `diffusion_pytorch_model.safetensors`; no model hub is reachable offline): tiny
//! and small ones for tests, and the published shapes for real-shape runs. In FP8
//! (`F8E4M3`) a demo is ComfyUI's scaled-FP8 file instead: one
//! `wan2.2_<preset>_fp8_scaled.safetensors` in Wan-AI's names under
//! `model.diffusion_model.`, each block's Linear weights F8_E4M3 with an F32
//! `scale_weight` (and a `scale_input` of 1), the `scaled_fp8` marker, and the rest
//! BF16 — the same seeded values, quantised.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::config::{WanConfig, QK_NORM};
use super::open::CLASS_NAME;
use super::single_file::HEAD_DIM_METADATA;
use crate::compute::DType;
use crate::model::diffusers_to_wan;
use crate::model::generated::{write_model_folder, write_single, TensorSpec, Values};

/// ComfyUI's prefix of a diffusion model's tensors in its files.
const COMFY_PREFIX: &str = "model.diffusion_model.";
/// Every published WAN's head width: a file of another says its own in metadata.
const PUBLISHED_HEAD_DIM: usize = 128;
/// E4M3's largest finite value: a quantised weight's codes span ± this.
const E4M3_MAX: f32 = 448.0;

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
    /// F32, F16 or BF16; F8E4M3 for ComfyUI's scaled-FP8 file.
    pub dtype: DType,
    pub seed: u64,
}

/// The tensors of a preset, in diffusers' names, each from its own seed.
struct Tensors {
    seed: u64,
    /// The blocks' Linear weights in F8_E4M3 with their scales.
    fp8: bool,
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
        if !(self.fp8 && stem.starts_with("blocks.")) {
            self.push(format!("{stem}.weight"), vec![rows, cols], 0.0, spread);
            self.push(format!("{stem}.bias"), vec![rows], 0.0, 0.02);
            return;
        }
        // The same seeded stream over ± E4M3's range, times spread / 448: the BF16
        // demo's weights, quantised.
        self.push(format!("{stem}.weight"), vec![rows, cols], 0.0, E4M3_MAX);
        if let Some(weight) = self.list.last_mut() {
            weight.dtype = Some(DType::F8E4M3);
        }
        let scalar = |name: String, value: f32| TensorSpec {
            name,
            shape: vec![],
            values: Values::Constant(value),
            dtype: Some(DType::F32),
        };
        self.list
            .push(scalar(format!("{stem}.scale_weight"), spread / E4M3_MAX));
        self.list.push(scalar(format!("{stem}.scale_input"), 1.0));
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
            fp8: self.fp8(),
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
        if !tensors.fp8 {
            return tensors.list;
        }
        for tensor in &mut tensors.list {
            tensor.name = format!("{COMFY_PREFIX}{}", diffusers_to_wan(&tensor.name));
        }
        tensors.list.push(TensorSpec {
            name: format!("{COMFY_PREFIX}scaled_fp8"),
            shape: vec![0],
            values: Values::Constant(0.0),
            dtype: Some(DType::F8E4M3),
        });
        tensors.list
    }

    /// ComfyUI's scaled-FP8 file rather than a diffusers folder.
    fn fp8(&self) -> bool {
        self.dtype == DType::F8E4M3
    }

    /// The dtype of the tensors that name none: BF16 beside FP8 weights.
    fn storage_dtype(&self) -> DType {
        match self.fp8() {
            true => DType::Bf16,
            false => self.dtype,
        }
    }

    /// Bytes of the weights written.
    pub fn weight_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|tensor| tensor.bytes(self.storage_dtype()))
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
    /// `diffusion_pytorch_model.safetensors` under `dir` (in FP8, the scaled-FP8 file);
    /// returns what `--model` takes.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        if self.fp8() {
            return self.write_fp8(dir);
        }
        write_model_folder(
            &dir.join("transformer"),
            &self.config_json(),
            ("diffusion_pytorch_model.safetensors", &self.tensors()),
            (self.dtype, "WAN"),
        )
    }
}

impl WanDemo {
    /// `dir/wan2.2_<preset>_fp8_scaled.safetensors`, with the head width in metadata
    /// when it is not the published 128 (what the shapes cannot say).
    fn write_fp8(&self, dir: &Path) -> std::io::Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let preset = format!("{:?}", self.preset).to_lowercase();
        let path = dir.join(format!("wan2.2_{preset}_fp8_scaled.safetensors"));
        let head_dim = self.preset.config().head_dim;
        let metadata = match head_dim == PUBLISHED_HEAD_DIM {
            true => Default::default(),
            false => [(HEAD_DIM_METADATA.to_string(), head_dim.to_string())].into(),
        };
        write_single(&path, &self.tensors(), DType::Bf16, &metadata)?;
        Ok(path)
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

    #[test]
    fn an_fp8_demo_is_a_scaled_fp8_file_the_family_reads() {
        // Proves `--dtype fp8` writes ComfyUI's scaled-FP8 file (original names under
        // model.diffusion_model., the marker, a scale per block Linear) that reads as
        // the preset's config and places every weight, and that A14B's expert in it
        // is 13.5 GiB: 13.1 GiB of FP8 block weights and 0.44 GiB of BF16 rest.
        let dir = tempfile::tempdir().expect("a temporary folder");
        let demo = WanDemo {
            preset: WanPreset::Tiny,
            dtype: DType::F8E4M3,
            seed: 3,
        };
        let path = demo.write(dir.path()).expect("writes");
        let index = crate::model::ModelIndex::open(&path, None).expect("opens");
        let marker = index
            .tensor("model.diffusion_model.scaled_fp8")
            .expect("marker");
        assert_eq!(marker.dtype, "F8_E4M3");
        let part = crate::model::CheckpointPart::implied(&index).expect("original names");
        let index = crate::model::ModelIndex::open_part(&path, None, &part).expect("renames");
        assert_eq!(
            index
                .tensor("blocks.1.ffn.net.2.weight")
                .expect("ffn")
                .dtype,
            "F8_E4M3"
        );
        assert!(index.tensor("blocks.1.ffn.net.2.scale_weight").is_some());
        assert_eq!(index.tensor("proj_out.weight").expect("head").dtype, "BF16");
        let config = super::super::single_file::inferred_config(&index).expect("a config");
        let config = WanConfig::from_json(&path, &config).expect("reads");
        assert_eq!(config, WanPreset::Tiny.config());
        super::super::check_file(&index).expect("places every weight");
        let a14b = WanDemo {
            preset: WanPreset::A14b,
            ..demo
        };
        let gib = a14b.weight_bytes() as f64 / (1u64 << 30) as f64;
        assert!((13.5..13.6).contains(&gib), "{gib} GiB");
    }
}
