//! Where the WAN VAE decoder's weights are, by diffusers' names
//! (`decoder.up_blocks.N.resnets.M.conv1`, `decoder.up_blocks.N.upsamplers.0.
//! time_conv`), checked against the config and placed as blocks: `post_quant_conv`
//! with the input convolution and the middle block, one block per up block, and the
//! output norm and convolution. One walk lays the blocks out and gives the slots
//! ([`crate::families::walk`]).

use std::path::Path;

use crate::compute::TensorSlot;
use crate::families::placement::Placement;
use crate::families::walk::{self, Tensors};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::WanVaeConfig;

/// A causal 3-D convolution (`WanCausalConv3d`), or a 2-D one (`frames` 1): its
/// weight as the `[out, in·frames·kernel²]` matrix it is in the file, its bias.
#[derive(Debug, Clone, Copy)]
pub struct Conv {
    pub weight: TensorSlot,
    pub bias: TensorSlot,
    pub input: usize,
    /// Temporal taps (3, or 1 for the 1×1×1 ones) and the square spatial kernel.
    pub frames: usize,
    pub kernel: usize,
}

/// `WanResidualBlock`: RMS norms (their `gamma`), SiLU, causal 3×3×3 convolutions,
/// and a 1×1×1 convolution of the residual when the channels change.
#[derive(Debug, Clone, Copy)]
pub struct Resnet {
    pub norm1: TensorSlot,
    pub conv1: Conv,
    pub norm2: TensorSlot,
    pub conv2: Conv,
    pub shortcut: Option<Conv>,
}

/// `WanAttentionBlock`: one head over each frame's pixels.
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    pub norm: TensorSlot,
    /// `to_qkv` as the 1×1 convolution it is: q, k, v are its rows in thirds.
    pub qkv: TensorSlot,
    pub qkv_bias: TensorSlot,
    pub proj: TensorSlot,
    pub proj_bias: TensorSlot,
    pub channels: usize,
}

/// `WanResample`'s upsampling: nearest ×2 and a 3×3 convolution that halves the
/// channels, after (`upsample3d`) a causal 3×1×1 `time_conv` to twice the channels,
/// read as two frames.
#[derive(Debug, Clone, Copy)]
pub struct Upsample {
    pub conv: Conv,
    pub time_conv: Option<Conv>,
}

#[derive(Debug, Clone)]
pub struct UpBlock {
    pub resnets: Vec<Resnet>,
    pub upsample: Option<Upsample>,
    /// Wan 2.2's shortcut around an upsampling block (`DupUp3D`, no weights).
    pub shortcut: Option<DupUp>,
}

/// `DupUp3D`: the block's input with each channel repeated `repeats` times, the
/// copies laid out as 2 × 2 pixels (and `frames` frames where the block doubles the
/// frames) of the `out` channels; added to the block's output.
#[derive(Debug, Clone, Copy)]
pub struct DupUp {
    pub input: usize,
    pub out: usize,
    /// 2 where the block doubles the frames, else 1 (`factor_t`).
    pub frames: usize,
    pub repeats: usize,
}

/// The decoder's weights, placed.
#[derive(Debug, Clone)]
pub struct Decoder {
    pub post_quant: Conv,
    pub conv_in: Conv,
    pub mid: [Resnet; 2],
    pub attention: Attention,
    pub up: Vec<UpBlock>,
    pub norm_out: TensorSlot,
    pub conv_out: Conv,
}

struct Walk<'s> {
    source: &'s mut dyn Tensors,
    config: &'s WanVaeConfig,
}

impl Walk<'_> {
    /// A convolution `[out, input, frames, kernel, kernel]` (no `frames` axis when
    /// `frames` is 0: a 2-D one, used as 1 frame).
    fn conv(
        &mut self,
        stem: &str,
        [out, input, frames, kernel]: [usize; 4],
    ) -> Result<Conv, FamilyError> {
        let shape: Vec<usize> = match frames {
            0 => vec![out, input, kernel, kernel],
            _ => vec![out, input, frames, kernel, kernel],
        };
        Ok(Conv {
            weight: self.source.tensor(&format!("{stem}.weight"), &shape)?,
            bias: self.source.tensor(&format!("{stem}.bias"), &[out])?,
            input,
            frames: frames.max(1),
            kernel,
        })
    }

    /// An RMS norm's `gamma` (`[channels, 1, 1, 1]`, or `[channels, 1, 1]` over
    /// images), as the `[1, channels]` vector it scales by.
    fn gamma(
        &mut self,
        stem: &str,
        channels: usize,
        axes: usize,
    ) -> Result<TensorSlot, FamilyError> {
        let mut shape = vec![1; axes + 1];
        shape[0] = channels;
        let slot = self.source.tensor(&format!("{stem}.gamma"), &shape)?;
        Ok(TensorSlot {
            rows: 1,
            cols: channels,
            ..slot
        })
    }

    fn resnet(&mut self, stem: &str, input: usize, out: usize) -> Result<Resnet, FamilyError> {
        Ok(Resnet {
            norm1: self.gamma(&format!("{stem}.norm1"), input, 3)?,
            conv1: self.conv(&format!("{stem}.conv1"), [out, input, 3, 3])?,
            norm2: self.gamma(&format!("{stem}.norm2"), out, 3)?,
            conv2: self.conv(&format!("{stem}.conv2"), [out, out, 3, 3])?,
            shortcut: match input != out {
                true => Some(self.conv(&format!("{stem}.conv_shortcut"), [out, input, 1, 1])?),
                false => None,
            },
        })
    }

    fn attention(&mut self, stem: &str, channels: usize) -> Result<Attention, FamilyError> {
        let qkv = self.conv(&format!("{stem}.to_qkv"), [3 * channels, channels, 0, 1])?;
        let proj = self.conv(&format!("{stem}.proj"), [channels, channels, 0, 1])?;
        Ok(Attention {
            norm: self.gamma(&format!("{stem}.norm"), channels, 2)?,
            qkv: qkv.weight,
            qkv_bias: qkv.bias,
            proj: proj.weight,
            proj_bias: proj.bias,
            channels,
        })
    }

    /// `WanResample` upsampling to `out` channels (half of `channels` in Wan 2.1,
    /// all of them in Wan 2.2's residual blocks).
    fn upsample(
        &mut self,
        stem: &str,
        [channels, out]: [usize; 2],
        temporal: bool,
    ) -> Result<Upsample, FamilyError> {
        Ok(Upsample {
            conv: self.conv(&format!("{stem}.resample.1"), [out, channels, 0, 3])?,
            time_conv: match temporal {
                true => {
                    Some(self.conv(&format!("{stem}.time_conv"), [2 * channels, channels, 3, 1])?)
                }
                false => None,
            },
        })
    }

    fn decoder(&mut self) -> Result<Decoder, FamilyError> {
        let config = self.config;
        let (latent, dims) = (config.z_dim, config.dims());
        let top = dims[0];
        self.source.block("decoder.mid_block");
        let post_quant = self.conv("post_quant_conv", [latent, latent, 1, 1])?;
        let conv_in = self.conv("decoder.conv_in", [top, latent, 3, 3])?;
        let mid = [
            self.resnet("decoder.mid_block.resnets.0", top, top)?,
            self.resnet("decoder.mid_block.resnets.1", top, top)?,
        ];
        let attention = self.attention("decoder.mid_block.attentions.0", top)?;
        let mut up = Vec::with_capacity(dims.len() - 1);
        let levels = dims.len() - 1;
        for number in 0..levels {
            let stem = format!("decoder.up_blocks.{number}");
            self.source.block(&stem);
            let (block_input, out) = up_channels(config, number);
            let mut input = block_input;
            let mut resnets = Vec::with_capacity(config.num_res_blocks + 1);
            for layer in 0..=config.num_res_blocks {
                resnets.push(self.resnet(&format!("{stem}.resnets.{layer}"), input, out)?);
                input = out;
            }
            let temporal = number + 1 < levels && config.temporal_upsample[number];
            let (upsample, shortcut) = match (number + 1 < levels, config.is_residual) {
                (false, _) => (None, None),
                (true, false) => {
                    let channels = [out, out / 2];
                    let stem = format!("{stem}.upsamplers.0");
                    (Some(self.upsample(&stem, channels, temporal)?), None)
                }
                (true, true) => {
                    let stem = format!("{stem}.upsampler");
                    let upsample = self.upsample(&stem, [out, out], temporal)?;
                    (Some(upsample), Some(dup_up(block_input, out, temporal)?))
                }
            };
            up.push(UpBlock {
                resnets,
                upsample,
                shortcut,
            });
        }
        self.source.block("decoder.conv_out");
        let bottom = dims[levels];
        Ok(Decoder {
            post_quant,
            conv_in,
            mid,
            attention,
            up,
            norm_out: self.gamma("decoder.norm_out", bottom, 3)?,
            conv_out: self.conv("decoder.conv_out", [config.out_channels, bottom, 3, 3])?,
        })
    }
}

/// The input and output channels of up block `number`: in Wan 2.1 every upsampling
/// halves the channels, so a block after one takes half of the widths' list.
pub fn up_channels(config: &WanVaeConfig, number: usize) -> (usize, usize) {
    let dims = config.dims();
    match number == 0 || config.is_residual {
        true => (dims[number], dims[number + 1]),
        false => (dims[number] / 2, dims[number + 1]),
    }
}

/// The `DupUp3D` shortcut of a block from `input` to `out` channels.
fn dup_up(input: usize, out: usize, temporal: bool) -> Result<DupUp, FamilyError> {
    let frames = if temporal { 2 } else { 1 };
    let copies = out * frames * 4;
    if input == 0 || copies % input != 0 {
        // The channels come from `config.json`'s `dim_mult`; its path is not at hand.
        return Err(FamilyError::config(Path::new("config.json"), Some("dim_mult"), format!(
            "a residual up block from {input} to {out} channels: DupUp3D needs {out} · {} a multiple of {input}",
            frames * 4
        )));
    }
    Ok(DupUp {
        input,
        out,
        frames,
        repeats: copies / input,
    })
}

/// `WanResample` downsampling: zero padding right and bottom, a 3×3 convolution at
/// stride 2, then (`downsample3d`) a causal 3×1×1 `time_conv` at stride 2.
#[derive(Debug, Clone, Copy)]
pub struct Downsample {
    pub conv: Conv,
    pub time_conv: Option<Conv>,
}

/// One resolution of the encoder: its ResNet blocks and, but the last, a
/// downsampling; in Wan 2.2 a shortcut around them.
#[derive(Debug, Clone)]
pub struct DownLevel {
    pub resnets: Vec<Resnet>,
    pub downsample: Option<Downsample>,
    pub shortcut: Option<AvgDown>,
}

/// `AvgDown3D`: the level's input with each group of `frames` frames and `side` ×
/// `side` pixels folded into channels, and the mean of each `group` of those
/// channels as one of the `out` channels; added to the level's output.
#[derive(Debug, Clone, Copy)]
pub struct AvgDown {
    pub input: usize,
    pub out: usize,
    pub frames: usize,
    pub side: usize,
    pub group: usize,
}

/// The encoder's weights, placed.
#[derive(Debug, Clone)]
pub struct Encoder {
    pub conv_in: Conv,
    pub levels: Vec<DownLevel>,
    pub mid: [Resnet; 2],
    pub attention: Attention,
    pub norm_out: TensorSlot,
    pub conv_out: Conv,
    /// `quant_conv`'s rows of the latent distribution's mean (its first `z_dim`).
    pub quant_mean: Conv,
}

impl Walk<'_> {
    /// The encoder: `encoder.down_blocks` is one flat list (each level's ResNet
    /// blocks, then its resample), placed one block per level; then the middle
    /// block; then the output norm, convolution and `quant_conv`.
    fn encoder(&mut self) -> Result<Encoder, FamilyError> {
        let config = self.config;
        let dims: Vec<usize> = std::iter::once(1)
            .chain(config.dim_mult.iter().copied())
            .map(|mult| config.encoder_base_dim * mult)
            .collect();
        let levels = dims.len() - 1;
        let mut conv_in = None;
        let mut down = Vec::with_capacity(levels);
        let mut module = 0;
        for level in 0..levels {
            let stem = format!(
                "encoder.down_blocks.{}",
                if config.is_residual { level } else { module }
            );
            self.source.block(&stem);
            if level == 0 {
                let input = 3 * config.patch_size * config.patch_size;
                conv_in = Some(self.conv("encoder.conv_in", [dims[0], input, 3, 3])?);
            }
            let temporal = level + 1 < levels && config.temporal_upsample[levels - 2 - level];
            let (input, out) = (dims[level], dims[level + 1]);
            if config.is_residual {
                down.push(self.residual_level(
                    &stem,
                    [input, out],
                    (level + 1 < levels, temporal),
                )?);
                continue;
            }
            let mut input = input;
            let mut resnets = Vec::with_capacity(config.num_res_blocks);
            for _ in 0..config.num_res_blocks {
                let stem = format!("encoder.down_blocks.{module}");
                resnets.push(self.resnet(&stem, input, out)?);
                (input, module) = (out, module + 1);
            }
            let downsample = match level + 1 < levels {
                true => {
                    let stem = format!("encoder.down_blocks.{module}");
                    module += 1;
                    Some(self.downsample(&stem, out, temporal)?)
                }
                false => None,
            };
            down.push(DownLevel {
                resnets,
                downsample,
                shortcut: None,
            });
        }
        let top = dims[levels];
        let (latent, moments) = (config.z_dim, 2 * config.z_dim);
        self.source.block("encoder.mid_block");
        let mid = [
            self.resnet("encoder.mid_block.resnets.0", top, top)?,
            self.resnet("encoder.mid_block.resnets.1", top, top)?,
        ];
        let attention = self.attention("encoder.mid_block.attentions.0", top)?;
        self.source.block("encoder.conv_out");
        let norm_out = self.gamma("encoder.norm_out", top, 3)?;
        let conv_out = self.conv("encoder.conv_out", [moments, top, 3, 3])?;
        let quant = self.conv("quant_conv", [moments, moments, 1, 1])?;
        Ok(Encoder {
            conv_in: conv_in
                .ok_or_else(|| FamilyError::internal("a WAN VAE encoder without levels".into()))?,
            levels: down,
            mid,
            attention,
            norm_out,
            conv_out,
            quant_mean: Conv {
                weight: quant.weight.sub_rows(0, latent),
                bias: quant.bias.sub_vector(0, latent),
                ..quant
            },
        })
    }
}

impl Walk<'_> {
    /// `WanResample` downsampling of `channels` (`downsample3d` when `temporal`).
    fn downsample(
        &mut self,
        stem: &str,
        channels: usize,
        temporal: bool,
    ) -> Result<Downsample, FamilyError> {
        Ok(Downsample {
            conv: self.conv(&format!("{stem}.resample.1"), [channels, channels, 0, 3])?,
            time_conv: match temporal {
                true => Some(self.conv(&format!("{stem}.time_conv"), [channels, channels, 3, 1])?),
                false => None,
            },
        })
    }

    /// Wan 2.2's `WanResidualDownBlock`: its ResNet blocks, its `downsampler` when
    /// `down`, and the `AvgDown3D` shortcut.
    fn residual_level(
        &mut self,
        stem: &str,
        [input, out]: [usize; 2],
        (down, temporal): (bool, bool),
    ) -> Result<DownLevel, FamilyError> {
        let mut resnets = Vec::with_capacity(self.config.num_res_blocks);
        let mut channels = input;
        for layer in 0..self.config.num_res_blocks {
            resnets.push(self.resnet(&format!("{stem}.resnets.{layer}"), channels, out)?);
            channels = out;
        }
        let downsample = match down {
            true => Some(self.downsample(&format!("{stem}.downsampler"), out, temporal)?),
            false => None,
        };
        let (frames, side) = (if temporal { 2 } else { 1 }, if down { 2 } else { 1 });
        let folded = input * frames * side * side;
        if out == 0 || folded % out != 0 {
            let config = Path::new("config.json");
            return Err(FamilyError::config(config, Some("dim_mult"), format!(
                "a residual down block from {input} to {out} channels: AvgDown3D needs {input} · {} a multiple of {out}",
                frames * side * side
            )));
        }
        Ok(DownLevel {
            resnets,
            downsample,
            shortcut: Some(AvgDown {
                input,
                out,
                frames,
                side,
                group: folded / out,
            }),
        })
    }
}

/// The encoder's blocks and every weight's slot.
pub fn place_encoder(
    index: &ModelIndex,
    config: &WanVaeConfig,
) -> Result<(Placement, Encoder), FamilyError> {
    walk::place(index, |source| Walk { source, config }.encoder())
}

/// The decoder's blocks and every weight's slot.
pub fn place_decoder(
    index: &ModelIndex,
    config: &WanVaeConfig,
) -> Result<(Placement, Decoder), FamilyError> {
    walk::place(index, |source| Walk { source, config }.decoder())
}
