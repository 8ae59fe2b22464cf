//! Where the VAE's weights are, by diffusers' names (`decoder.up_blocks.N.resnets.M.
//! conv1`), checked against the config and placed as blocks. The decoder: the
//! latent's input convolution with the middle block, one block per up block, and the
//! output norm and convolution. The encoder: one block per down block (the first with
//! the image's input convolution), then the middle block with the output.
//! One walk over the decoder's structure lays the blocks out and gives the slots
//! ([`crate::families::walk`]).

use crate::compute::TensorSlot;
use crate::families::placement::Placement;
use crate::families::walk::{self, Tensors};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::VaeConfig;

/// A convolution: its weight as the `[out, in·k²]` matrix it is in the file, its
/// bias, and its kernel size.
#[derive(Debug, Clone, Copy)]
pub struct Conv {
    pub weight: TensorSlot,
    pub bias: TensorSlot,
    pub kernel: usize,
}

/// A GroupNorm's affine weight and bias, or a linear layer's weight and bias.
#[derive(Debug, Clone, Copy)]
pub struct Pair {
    pub weight: TensorSlot,
    pub bias: TensorSlot,
}

#[derive(Debug, Clone, Copy)]
pub struct Resnet {
    pub norm1: Pair,
    pub conv1: Conv,
    pub norm2: Pair,
    pub conv2: Conv,
    /// The 1×1 convolution of the residual when the channels change.
    pub shortcut: Option<Conv>,
}

#[derive(Debug, Clone, Copy)]
pub struct SelfAttention {
    pub norm: Pair,
    pub q: Pair,
    pub k: Pair,
    pub v: Pair,
    pub out: Pair,
    pub channels: usize,
}

#[derive(Debug, Clone)]
pub struct UpBlock {
    pub resnets: Vec<Resnet>,
    /// Nearest ×2 then this 3×3 convolution (every up block but the last).
    pub upsample: Option<Conv>,
}

/// The decoder's weights, placed.
#[derive(Debug, Clone)]
pub struct Decoder {
    pub post_quant: Option<Conv>,
    pub conv_in: Conv,
    pub mid: [Resnet; 2],
    pub mid_attention: Option<SelfAttention>,
    pub up: Vec<UpBlock>,
    pub norm_out: Pair,
    pub conv_out: Conv,
}

struct Walk<'s> {
    source: &'s mut dyn Tensors,
    config: &'s VaeConfig,
}

impl Walk<'_> {
    fn conv(
        &mut self,
        stem: &str,
        out: usize,
        input: usize,
        kernel: usize,
    ) -> Result<Conv, FamilyError> {
        Ok(Conv {
            weight: self
                .source
                .tensor(&format!("{stem}.weight"), &[out, input, kernel, kernel])?,
            bias: self.source.tensor(&format!("{stem}.bias"), &[out])?,
            kernel,
        })
    }

    fn pair(&mut self, stem: &str, out: usize, input: Option<usize>) -> Result<Pair, FamilyError> {
        let shape: Vec<usize> = match input {
            Some(input) => vec![out, input],
            None => vec![out],
        };
        Ok(Pair {
            weight: self.source.tensor(&format!("{stem}.weight"), &shape)?,
            bias: self.source.tensor(&format!("{stem}.bias"), &[out])?,
        })
    }

    fn resnet(&mut self, stem: &str, input: usize, out: usize) -> Result<Resnet, FamilyError> {
        Ok(Resnet {
            norm1: self.pair(&format!("{stem}.norm1"), input, None)?,
            conv1: self.conv(&format!("{stem}.conv1"), out, input, 3)?,
            norm2: self.pair(&format!("{stem}.norm2"), out, None)?,
            conv2: self.conv(&format!("{stem}.conv2"), out, out, 3)?,
            shortcut: match input != out {
                true => Some(self.conv(&format!("{stem}.conv_shortcut"), out, input, 1)?),
                false => None,
            },
        })
    }

    fn attention(&mut self, stem: &str, channels: usize) -> Result<SelfAttention, FamilyError> {
        let c = Some(channels);
        Ok(SelfAttention {
            norm: self.pair(&format!("{stem}.group_norm"), channels, None)?,
            q: self.pair(&format!("{stem}.to_q"), channels, c)?,
            k: self.pair(&format!("{stem}.to_k"), channels, c)?,
            v: self.pair(&format!("{stem}.to_v"), channels, c)?,
            out: self.pair(&format!("{stem}.to_out.0"), channels, c)?,
            channels,
        })
    }

    fn decoder(&mut self) -> Result<Decoder, FamilyError> {
        let config = self.config;
        let latent = config.latent_channels;
        let top = *config.channels.last().unwrap_or(&latent);
        self.source.block("decoder.mid_block");
        let post_quant = match config.post_quant_conv {
            true => Some(self.conv("post_quant_conv", latent, latent, 1)?),
            false => None,
        };
        let conv_in = self.conv("decoder.conv_in", top, latent, 3)?;
        let mid = [
            self.resnet("decoder.mid_block.resnets.0", top, top)?,
            self.resnet("decoder.mid_block.resnets.1", top, top)?,
        ];
        let mid_attention = match config.mid_attention {
            true => Some(self.attention("decoder.mid_block.attentions.0", top)?),
            false => None,
        };
        let reversed: Vec<usize> = config.channels.iter().rev().copied().collect();
        let mut up = Vec::with_capacity(reversed.len());
        let mut previous = top;
        for (number, &out) in reversed.iter().enumerate() {
            let stem = format!("decoder.up_blocks.{number}");
            self.source.block(&stem);
            let resnets = (0..=config.layers_per_block)
                .map(|layer| {
                    let input = if layer == 0 { previous } else { out };
                    self.resnet(&format!("{stem}.resnets.{layer}"), input, out)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let upsample = match number + 1 < reversed.len() {
                true => Some(self.conv(&format!("{stem}.upsamplers.0.conv"), out, out, 3)?),
                false => None,
            };
            up.push(UpBlock { resnets, upsample });
            previous = out;
        }
        self.source.block("decoder.conv_out");
        let bottom = config.channels[0];
        Ok(Decoder {
            post_quant,
            conv_in,
            mid,
            mid_attention,
            up,
            norm_out: self.pair("decoder.conv_norm_out", bottom, None)?,
            conv_out: self.conv("decoder.conv_out", config.image_channels, bottom, 3)?,
        })
    }
}

#[derive(Debug, Clone)]
pub struct DownBlock {
    pub resnets: Vec<Resnet>,
    /// A 3×3 convolution at stride 2 padded bottom and right (every down block but
    /// the last).
    pub downsample: Option<Conv>,
}

/// The encoder's weights, placed.
#[derive(Debug, Clone)]
pub struct Encoder {
    pub conv_in: Conv,
    pub down: Vec<DownBlock>,
    pub mid: [Resnet; 2],
    pub mid_attention: Option<SelfAttention>,
    pub norm_out: Pair,
    /// To the latent distribution's mean and log-variance (`2 × latent` channels).
    pub conv_out: Conv,
    pub quant: Option<Conv>,
}

impl Walk<'_> {
    fn encoder(&mut self) -> Result<Encoder, FamilyError> {
        let config = self.config;
        let latent = config.latent_channels;
        let mut previous = config.channels[0];
        let mut down = Vec::with_capacity(config.channels.len());
        let mut conv_in = None;
        for (number, &out) in config.channels.iter().enumerate() {
            let stem = format!("encoder.down_blocks.{number}");
            self.source.block(&stem);
            if number == 0 {
                conv_in = Some(self.conv("encoder.conv_in", previous, config.image_channels, 3)?);
            }
            let resnets = (0..config.layers_per_block)
                .map(|layer| {
                    let input = if layer == 0 { previous } else { out };
                    self.resnet(&format!("{stem}.resnets.{layer}"), input, out)
                })
                .collect::<Result<Vec<_>, _>>()?;
            let downsample = match number + 1 < config.channels.len() {
                true => Some(self.conv(&format!("{stem}.downsamplers.0.conv"), out, out, 3)?),
                false => None,
            };
            down.push(DownBlock {
                resnets,
                downsample,
            });
            previous = out;
        }
        let top = previous;
        self.source.block("encoder.mid_block");
        let mid = [
            self.resnet("encoder.mid_block.resnets.0", top, top)?,
            self.resnet("encoder.mid_block.resnets.1", top, top)?,
        ];
        let mid_attention = match config.mid_attention {
            true => Some(self.attention("encoder.mid_block.attentions.0", top)?),
            false => None,
        };
        Ok(Encoder {
            conv_in: conv_in.ok_or_else(|| FamilyError::internal("a VAE without blocks".into()))?,
            down,
            mid,
            mid_attention,
            norm_out: self.pair("encoder.conv_norm_out", top, None)?,
            conv_out: self.conv("encoder.conv_out", 2 * latent, top, 3)?,
            quant: match config.quant_conv {
                true => Some(self.conv("quant_conv", 2 * latent, 2 * latent, 1)?),
                false => None,
            },
        })
    }
}

/// The encoder's blocks and every weight's slot.
pub fn place_encoder(
    index: &ModelIndex,
    config: &VaeConfig,
) -> Result<(Placement, Encoder), FamilyError> {
    walk::place(index, |source| Walk { source, config }.encoder())
}

/// The decoder's blocks and every weight's slot.
pub fn place_decoder(
    index: &ModelIndex,
    config: &VaeConfig,
) -> Result<(Placement, Decoder), FamilyError> {
    walk::place(index, |source| Walk { source, config }.decoder())
}
