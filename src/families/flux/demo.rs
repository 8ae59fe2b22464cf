//! Generated Flux transformers with Flux's block structure and seeded weights, in
//! each of the three layouts, and conditioning files for them (no model hub is
//! reachable offline).
//!
//! The same preset and seed write the same values in every layout: a fused original
//! weight (a qkv, a `linear1`) and its diffusers pieces come from one seeded stream,
//! each piece from its own position in it. FP8 (`F8_E4M3`) stores every linear
//! weight with ComfyUI's per-layer F32 `scale_weight` and the `scaled_fp8` marker;
//! int8 (`I8`) and AWQ (`U4`) quantize the same seeded weights ComfyUI's way
//! (`int8_tensorwise`, `awq_w4a16`; see [`crate::model::generated::QuantFormat`]),
//! each layer with its `comfy_quant` marker. Biases and norms of all three are BF16.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::json;

use super::config::AXES_METADATA;
use super::input::{CONTEXT_NAME, POOLED_NAME};
use super::names::{Layout, Names, COMFY_PREFIX};
use crate::compute::DType;
use crate::model::generated::{
    quantized_linear, write_atomically, write_single, QuantFormat, TensorSpec, Values,
};

/// Which shape `demo-model --arch flux` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum FluxPreset {
    /// 2 double + 2 single blocks of width 64 (4 heads of 16), with guidance (dev).
    Tiny,
    /// As tiny, without the guidance embedder (schnell).
    TinySchnell,
    /// 4 double + 8 single blocks of width 128.
    Small,
    /// Flux's 19 double + 38 single blocks at width 256 (4 heads of 64).
    FullDepth,
    /// Flux's 19 double + 38 single blocks, head size (128), rope axes (16/56/56),
    /// T5 width (4096) and pooled CLIP width (768), at a third of its width: 8 heads,
    /// width 1024, 1.3 B parameters (2.4 GiB in BF16). Blocks big enough that a GPU's
    /// link and its kernels, not launch overhead, set the step time.
    FullDepthWide,
    /// FLUX.1-dev's own shape: 19 double + 38 single blocks, 24 heads of 128 (width
    /// 3072), the MLP 4× wide, T5's and CLIP's widths: 11.9 B parameters (22.2 GiB in
    /// BF16, 11.1 GiB in FP8).
    Dev,
}

/// The sizes of a preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FluxShape {
    pub double_blocks: usize,
    pub single_blocks: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub axes: [usize; 3],
    pub context_dim: usize,
    pub pooled_dim: usize,
    pub guidance: bool,
}

impl FluxShape {
    pub fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }
}

impl FluxPreset {
    pub fn shape(self) -> FluxShape {
        let tiny = FluxShape {
            double_blocks: 2,
            single_blocks: 2,
            heads: 4,
            head_dim: 16,
            axes: [4, 6, 6],
            context_dim: 32,
            pooled_dim: 16,
            guidance: true,
        };
        match self {
            FluxPreset::Tiny => tiny,
            FluxPreset::TinySchnell => FluxShape {
                guidance: false,
                ..tiny
            },
            FluxPreset::Small => FluxShape {
                double_blocks: 4,
                single_blocks: 8,
                head_dim: 32,
                axes: [8, 12, 12],
                context_dim: 64,
                pooled_dim: 32,
                ..tiny
            },
            FluxPreset::FullDepth => FluxShape {
                double_blocks: 19,
                single_blocks: 38,
                head_dim: 64,
                axes: [8, 28, 28],
                context_dim: 256,
                pooled_dim: 64,
                ..tiny
            },
            FluxPreset::Dev => FluxShape {
                heads: 24,
                ..FluxPreset::FullDepthWide.shape()
            },
            FluxPreset::FullDepthWide => FluxShape {
                double_blocks: 19,
                single_blocks: 38,
                heads: 8,
                head_dim: 128,
                axes: [16, 56, 56],
                context_dim: 4096,
                pooled_dim: 768,
                ..tiny
            },
        }
    }
}

/// A generated Flux checkpoint to write.
#[derive(Debug, Clone, Copy)]
pub struct FluxDemo {
    pub preset: FluxPreset,
    pub layout: Layout,
    /// BF16, F16, F32, F8_E4M3 (linear weights scaled; biases and norms BF16), I8
    /// (`int8_tensorwise`) or U4 (`awq_w4a16`).
    pub dtype: DType,
    pub seed: u64,
}

/// Packed latent channels of every Flux.1.
const IN_CHANNELS: usize = 64;

/// The checkpoint's tensors in original names, then renamed for the layout.
struct Tensors {
    names: Names,
    fp8: bool,
    /// The integer format linear weights are quantized in.
    quant: Option<QuantFormat>,
    seed: u64,
    list: Vec<TensorSpec>,
}

impl Tensors {
    /// Biases' and norms' dtype: BF16 beside quantized weights.
    fn side_dtype(&self) -> Option<DType> {
        (self.fp8 || self.quant.is_some()).then_some(DType::Bf16)
    }

    fn next_seed(&mut self) -> u64 {
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        self.seed
    }

    fn vector(&mut self, name: String, width: usize, center: f32, spread: f32) {
        let seed = self.next_seed();
        let mut tensor = TensorSpec::uniform(name, vec![width], seed, center, spread);
        tensor.dtype = self.side_dtype();
        self.list.push(tensor);
    }

    fn norm(&mut self, original: &str, width: usize) {
        let name = self.names.full(original);
        self.vector(name, width, 1.0, 0.1);
    }

    /// The original linear `stem` (`[sum of parts, input]` and its bias), written as
    /// the layout's pieces.
    fn linear(&mut self, stem: &str, parts: &[usize], input: usize) {
        let (weight_seed, bias_seed) = (self.next_seed(), self.next_seed());
        let stems = self.names.pieces(stem);
        let rows: Vec<usize> = match stems.len() {
            1 => vec![parts.iter().sum()],
            _ => parts.to_vec(),
        };
        let spread = 1.0 / (input as f32).sqrt();
        let stored = if self.fp8 { 448.0 } else { spread };
        let mut first = 0usize;
        for (piece, rows) in stems.into_iter().zip(rows) {
            let values = Values::UniformFrom {
                seed: weight_seed,
                center: 0.0,
                spread: stored,
                first: (first * input) as u64,
            };
            match self.quant {
                Some(format) => {
                    self.list
                        .extend(quantized_linear(&piece, (rows, input), &values, format))
                }
                None => self.list.push(TensorSpec {
                    name: format!("{piece}.weight"),
                    shape: vec![rows, input],
                    values,
                    dtype: None,
                }),
            }
            if self.fp8 {
                self.list.push(TensorSpec {
                    name: format!("{piece}.scale_weight"),
                    shape: vec![1],
                    values: Values::Constant(spread / 448.0),
                    dtype: Some(DType::F32),
                });
            }
            self.list.push(TensorSpec {
                name: format!("{piece}.bias"),
                shape: vec![rows],
                values: Values::UniformFrom {
                    seed: bias_seed,
                    center: 0.0,
                    spread: 0.02,
                    first: first as u64,
                },
                dtype: self.side_dtype(),
            });
            first += rows;
        }
    }

    fn embedder(&mut self, stem: &str, input: usize, hidden: usize) {
        self.linear(&format!("{stem}.in_layer"), &[hidden], input);
        self.linear(&format!("{stem}.out_layer"), &[hidden], hidden);
    }

    fn double(&mut self, block: usize, shape: &FluxShape) {
        let (hidden, mlp) = (shape.hidden(), 4 * shape.hidden());
        for stream in ["img", "txt"] {
            let at = format!("double_blocks.{block}.{stream}");
            self.linear(&format!("{at}_mod.lin"), &[6 * hidden], hidden);
            self.linear(&format!("{at}_attn.qkv"), &[hidden; 3], hidden);
            self.norm(&format!("{at}_attn.norm.query_norm.scale"), shape.head_dim);
            self.norm(&format!("{at}_attn.norm.key_norm.scale"), shape.head_dim);
            self.linear(&format!("{at}_attn.proj"), &[hidden], hidden);
            self.linear(&format!("{at}_mlp.0"), &[mlp], hidden);
            self.linear(&format!("{at}_mlp.2"), &[hidden], mlp);
        }
    }

    fn single(&mut self, block: usize, shape: &FluxShape) {
        let (hidden, mlp) = (shape.hidden(), 4 * shape.hidden());
        let at = format!("single_blocks.{block}");
        self.linear(&format!("{at}.modulation.lin"), &[3 * hidden], hidden);
        self.linear(
            &format!("{at}.linear1"),
            &[hidden, hidden, hidden, mlp],
            hidden,
        );
        self.norm(&format!("{at}.norm.query_norm.scale"), shape.head_dim);
        self.norm(&format!("{at}.norm.key_norm.scale"), shape.head_dim);
        self.linear(&format!("{at}.linear2"), &[hidden], hidden + mlp);
    }
}

impl FluxDemo {
    fn tensors(&self) -> Vec<TensorSpec> {
        let shape = self.preset.shape();
        let hidden = shape.hidden();
        let mut tensors = Tensors {
            names: Names {
                layout: self.layout,
            },
            fp8: matches!(self.dtype, DType::F8E4M3 | DType::F8E5M2),
            quant: QuantFormat::of(self.dtype),
            seed: self.seed,
            list: Vec::new(),
        };
        tensors.linear("img_in", &[hidden], IN_CHANNELS);
        tensors.linear("txt_in", &[hidden], shape.context_dim);
        tensors.embedder("time_in", 256, hidden);
        tensors.embedder("vector_in", shape.pooled_dim, hidden);
        if shape.guidance {
            tensors.embedder("guidance_in", 256, hidden);
        }
        (0..shape.double_blocks).for_each(|block| tensors.double(block, &shape));
        (0..shape.single_blocks).for_each(|block| tensors.single(block, &shape));
        // The final modulation is one seeded stream in original order; diffusers
        // stores its halves swapped, so its values are written as the halves are.
        tensors.final_layer(hidden, self.layout);
        tensors.linear("final_layer.linear", &[IN_CHANNELS], hidden);
        if tensors.fp8 && self.layout != Layout::Diffusers {
            tensors.list.push(TensorSpec {
                name: prefixed(self.layout, "scaled_fp8"),
                shape: vec![0],
                values: Values::Constant(0.0),
                dtype: Some(DType::F8E4M3),
            });
        }
        if self.layout == Layout::ComfyUi {
            // A single-file checkpoint carries its VAE too: never streamed.
            tensors.list.push(TensorSpec::uniform(
                "first_stage_model.decoder.conv_in.weight".into(),
                vec![16, 16],
                1,
                0.0,
                0.1,
            ));
        }
        tensors.list
    }

    /// Bytes of the weights written.
    pub fn weight_bytes(&self) -> u64 {
        self.tensors()
            .iter()
            .map(|tensor| tensor.bytes(self.storage()))
            .sum()
    }

    /// The checkpoint's dtype for tensors that name none (quantized checkpoints give
    /// every tensor its own; the VAE tensor of a ComfyUI file is BF16 beside them).
    fn storage(&self) -> DType {
        match QuantFormat::of(self.dtype) {
            Some(_) => DType::Bf16,
            None => self.dtype,
        }
    }

    /// Writes the checkpoint under `dir`: `flux.safetensors` (original, ComfyUI) or
    /// `transformer/` with `config.json` and `diffusion_pytorch_model.safetensors`
    /// (diffusers). Returns what `--model` takes.
    pub fn write(&self, dir: &Path) -> std::io::Result<PathBuf> {
        let shape = self.preset.shape();
        let tensors = self.tensors();
        let mut metadata = BTreeMap::new();
        metadata.insert("format".to_string(), "pt".to_string());
        if self.layout == Layout::Diffusers {
            let folder = dir.join("transformer");
            std::fs::create_dir_all(&folder)?;
            let config = json!({
                "_class_name": "FluxTransformer2DModel",
                "_diffusers_version": "0.42.1",
                "attention_head_dim": shape.head_dim,
                "axes_dims_rope": shape.axes,
                "guidance_embeds": shape.guidance,
                "in_channels": IN_CHANNELS,
                "joint_attention_dim": shape.context_dim,
                "num_attention_heads": shape.heads,
                "num_layers": shape.double_blocks,
                "num_single_layers": shape.single_blocks,
                "out_channels": null,
                "patch_size": 1,
                "pooled_projection_dim": shape.pooled_dim,
            });
            let text = serde_json::to_string_pretty(&config).map_err(std::io::Error::other)?;
            write_atomically(&folder.join("config.json"), |file| {
                std::io::Write::write_all(file, text.as_bytes())
            })?;
            let path = folder.join("diffusion_pytorch_model.safetensors");
            write_single(&path, &tensors, self.storage(), &metadata)?;
            return Ok(folder);
        }
        std::fs::create_dir_all(dir)?;
        metadata.insert(AXES_METADATA.to_string(), json!(shape.axes).to_string());
        let path = dir.join("flux.safetensors");
        write_single(&path, &tensors, self.storage(), &metadata)?;
        Ok(path)
    }
}

impl Tensors {
    /// `final_layer.adaLN_modulation.1`: shift rows then scale rows in the original
    /// layouts; diffusers' `norm_out.linear` holds the same rows scale first.
    fn final_layer(&mut self, hidden: usize, layout: Layout) {
        let (weight_seed, bias_seed) = (self.next_seed(), self.next_seed());
        let stem = self.names.full("final_layer.adaLN_modulation.1");
        let spread = 1.0 / (hidden as f32).sqrt();
        let stored = if self.fp8 { 448.0 } else { spread };
        let values = |seed: u64, spread: f32, half: usize| match layout {
            Layout::Diffusers => Values::Swapped {
                seed,
                center: 0.0,
                spread,
                half: half as u64,
            },
            _ => Values::Uniform {
                seed,
                center: 0.0,
                spread,
            },
        };
        let weight = values(weight_seed, stored, hidden * hidden);
        match self.quant {
            Some(format) => {
                let tensors = quantized_linear(&stem, (2 * hidden, hidden), &weight, format);
                self.list.extend(tensors);
            }
            None => self.list.push(TensorSpec {
                name: format!("{stem}.weight"),
                shape: vec![2 * hidden, hidden],
                values: weight,
                dtype: None,
            }),
        }
        if self.fp8 {
            self.list.push(TensorSpec {
                name: format!("{stem}.scale_weight"),
                shape: vec![1],
                values: Values::Constant(spread / 448.0),
                dtype: Some(DType::F32),
            });
        }
        self.list.push(TensorSpec {
            name: format!("{stem}.bias"),
            shape: vec![2 * hidden],
            values: values(bias_seed, 0.02, hidden),
            dtype: self.side_dtype(),
        });
    }
}

fn prefixed(layout: Layout, name: &str) -> String {
    match layout {
        Layout::ComfyUi => format!("{COMFY_PREFIX}{name}"),
        _ => name.to_string(),
    }
}

/// Writes a conditioning file for a Flux of `shape`: `tokens` seeded T5-like states
/// and a pooled vector, F32.
pub fn write_conditioning(
    path: &Path,
    shape: &FluxShape,
    tokens: usize,
    seed: u64,
) -> std::io::Result<()> {
    let tensors = [
        TensorSpec::uniform(
            CONTEXT_NAME.into(),
            vec![1, tokens, shape.context_dim],
            seed,
            0.0,
            1.0,
        ),
        TensorSpec::uniform(
            POOLED_NAME.into(),
            vec![1, shape.pooled_dim],
            seed ^ 0x9e37,
            0.0,
            1.0,
        ),
    ];
    write_single(path, &tensors, DType::F32, &BTreeMap::new())
}
