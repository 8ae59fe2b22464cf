//! The image autoencoder of latent diffusion (`AutoencoderKL` as diffusers writes it:
//! Flux's 16-channel VAE, SD's 4-channel ones): its decoder turns a denoised latent
//! into pixels. Written once against the compute port, on channels-last images (see
//! [`crate::compute::pipeline`]).
//!
//! The latent a pipeline hands over is un-scaled first (`z / scaling_factor +
//! shift_factor`: 0.3611 and 0.1159 for Flux). The decoder: an optional 1×1
//! `post_quant_conv`, a 3×3 convolution in, the middle block (ResNet block,
//! single-head self-attention over the pixels, ResNet block), then the up blocks from
//! the deepest channels back to the first, each `layers_per_block + 1` ResNet blocks
//! (GroupNorm, SiLU, 3×3 convolution, twice, beside a residual that a 1×1 convolution
//! widens when the channels change) and, but the last, nearest ×2 upsampling and a
//! 3×3 convolution; then GroupNorm, SiLU and a 3×3 convolution out to RGB.
//!
//! Blocks: the input convolution with the middle block, each up block, the output.
//! A step decodes one tile of a latent (the whole latent untiled, see [`Tiling`]);
//! its output is the tile's image `[channels, height, width]` in the decoder's range
//! (about −1 … 1), as diffusers' `vae.decode` returns it, and
//! [`VaeDecoder::assemble`] blends a latent's tiles into its image. The step's
//! working set is reserved through the activation path before its first block.

mod config;
mod encoder;
mod open;
mod tiles;
mod weights;

use stagehand_actors::{BlockId, ModelLayout};

pub use config::VaeConfig;
pub use encoder::{ImageInput, VaeEncoder};
pub use tiles::{working_set_bytes, Tile, Tiling};
use weights::{Conv, Decoder, Pair, Resnet, SelfAttention};

use super::blocks::{Blocks, Held};
use super::family::{Facts, Family, StepOutput};
use super::inputs::WorkloadKind;
use super::placement::Placement;
use super::FamilyError;
use crate::compute::pipeline::{Conv2d, GroupNorm, Image};
use crate::compute::{Attention, Compute, Mask};
use crate::model::ModelIndex;

/// Latents to decode: each `[channels, height, width]`, as the pipeline's
/// transformer leaves them (scaled; the decoder un-scales them).
#[derive(Debug, Clone, PartialEq)]
pub struct LatentInput {
    pub latents: Vec<Vec<f32>>,
    pub height: usize,
    pub width: usize,
    /// Decode in tiles of this many latent positions a side ([`Tiling`]); `None`:
    /// whole.
    pub tile: Option<usize>,
}

/// A VAE decoder over its latents.
pub struct VaeDecoder {
    pub config: VaeConfig,
    placement: Placement,
    decoder: Decoder,
    input: LatentInput,
    pub tiling: Tiling,
}

/// Whether the step's working set is reserved; every tensor is sized by its stage.
pub struct VaeState {
    reserved: bool,
}

impl VaeDecoder {
    fn new(index: &ModelIndex, config: VaeConfig, input: LatentInput) -> Result<Self, FamilyError> {
        let expected = config.latent_channels * input.height * input.width;
        if input.latents.is_empty() || input.height == 0 || input.width == 0 {
            return Err(FamilyError::request(
                "latents",
                "no latent to decode".into(),
            ));
        }
        if let Some(latent) = input.latents.iter().find(|latent| latent.len() != expected) {
            return Err(FamilyError::request(
                "latents",
                format!(
                    "a latent of {} values is not [{}, {}, {}]",
                    latent.len(),
                    config.latent_channels,
                    input.height,
                    input.width
                ),
            ));
        }
        let (placement, decoder) = weights::place_decoder(index, &config)?;
        let tiling = Tiling::new(input.height, input.width, input.tile, config.scale_factor());
        Ok(Self {
            config,
            placement,
            decoder,
            input,
            tiling,
        })
    }

    /// Bytes a step holds live: its largest tile's decode.
    pub fn working_set_bytes(&self) -> u64 {
        let (rows, cols) = self.tiling.largest();
        working_set_bytes(&self.config, rows, cols)
    }

    /// Steps a latent takes: one per tile.
    pub fn steps_per_image(&self) -> usize {
        self.tiling.tiles.len()
    }

    /// Latents to decode.
    pub fn images(&self) -> usize {
        self.input.latents.len()
    }

    /// The image `[channels, height, width]` of one latent's steps' outputs.
    pub fn assemble(&self, tiles: &[&[f32]]) -> Vec<f32> {
        self.tiling.assemble(tiles, self.config.image_channels)
    }

    /// The latent tile of step `step`, un-scaled, channels-last, and its size.
    fn channels_last(&self, step: u64) -> (Vec<f32>, Image) {
        let tiles = self.tiling.tiles.len() as u64;
        let latent = &self.input.latents[(step / tiles) as usize % self.input.latents.len()];
        let tile = self.tiling.tiles[(step % tiles) as usize];
        let channels = self.config.latent_channels;
        let (height, width) = (self.input.height, self.input.width);
        let (scaling, shift) = (self.config.scaling, self.config.shift);
        let mut values = vec![0.0; tile.rows * tile.cols * channels];
        for (channel, plane) in latent.chunks_exact(height * width).enumerate() {
            for y in 0..tile.rows {
                let row = &plane[(tile.row + y) * width + tile.col..][..tile.cols];
                for (x, &value) in row.iter().enumerate() {
                    values[(y * tile.cols + x) * channels + channel] = value / scaling + shift;
                }
            }
        }
        let image = Image {
            height: tile.rows,
            width: tile.cols,
        };
        (values, image)
    }

    /// The decoder from the latent `z` (channels-last, un-scaled) to the image.
    fn decode<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        blocks: &mut B,
        (z, mut image): (&[f32], Image),
    ) -> Result<C::Tensor, FamilyError> {
        let mut x = compute.tensor(image.pixels(), self.config.latent_channels)?;
        compute.write(&mut x, z)?;
        let stages = Stages {
            compute,
            groups: self.config.groups,
        };
        let decoder = &self.decoder;
        let held = blocks.acquire(compute, BlockId(0))?;
        let middle = (|| {
            if let Some(conv) = &decoder.post_quant {
                x = stages.conv(&held, conv, &x, image)?;
            }
            x = stages.conv(&held, &decoder.conv_in, &x, image)?;
            x = stages.resnet(&held, &decoder.mid[0], &x, image)?;
            if let Some(attention) = &decoder.mid_attention {
                x = stages.attention(&held, attention, &x, image)?;
            }
            stages.resnet(&held, &decoder.mid[1], &x, image)
        })();
        blocks.release(compute, held)?;
        x = middle?;
        for (number, up) in decoder.up.iter().enumerate() {
            let held = blocks.acquire(compute, BlockId(number as u32 + 1))?;
            let outcome = (|| {
                let mut y = stages.resnet(&held, &up.resnets[0], &x, image)?;
                for resnet in &up.resnets[1..] {
                    y = stages.resnet(&held, resnet, &y, image)?;
                }
                if let Some(conv) = &up.upsample {
                    let (rows, cols) = compute.dims(&y);
                    let mut wide = compute.tensor(rows * 4, cols)?;
                    compute.pipeline()?.upsample_nearest(&y, image, &mut wide)?;
                    let doubled = Image {
                        height: image.height * 2,
                        width: image.width * 2,
                    };
                    return Ok::<_, FamilyError>((
                        stages.conv(&held, conv, &wide, doubled)?,
                        doubled,
                    ));
                }
                Ok((y, image))
            })();
            blocks.release(compute, held)?;
            (x, image) = outcome?;
        }
        let last = BlockId(decoder.up.len() as u32 + 1);
        let held = blocks.acquire(compute, last)?;
        let outcome = (|| {
            let normed = stages.norm(&held, &decoder.norm_out, &x, true)?;
            stages.conv(&held, &decoder.conv_out, &normed, image)
        })();
        blocks.release(compute, held)?;
        outcome
    }
}

/// The decoder's and the encoder's stages over one held block.
struct Stages<'c, C: Compute> {
    compute: &'c C,
    groups: usize,
}

impl<C: Compute> Stages<'_, C> {
    /// A convolution that keeps the size.
    fn conv(
        &self,
        held: &Held<C::Block>,
        conv: &Conv,
        x: &C::Tensor,
        image: Image,
    ) -> Result<C::Tensor, FamilyError> {
        self.conv_shaped(held, conv, x, Conv2d::same(image, conv.kernel))
    }

    /// A convolution of any geometry (the encoder's downsampling).
    fn conv_shaped(
        &self,
        held: &Held<C::Block>,
        conv: &Conv,
        x: &C::Tensor,
        shape: Conv2d,
    ) -> Result<C::Tensor, FamilyError> {
        let view = held.view(self.compute);
        let mut y = self
            .compute
            .tensor(shape.output().pixels(), conv.weight.rows)?;
        self.compute.pipeline()?.conv2d(
            x,
            &view.weight(&conv.weight)?,
            Some(&view.weight(&conv.bias)?),
            &shape,
            &mut y,
        )?;
        Ok(y)
    }

    fn norm(
        &self,
        held: &Held<C::Block>,
        norm: &Pair,
        x: &C::Tensor,
        silu: bool,
    ) -> Result<C::Tensor, FamilyError> {
        let view = held.view(self.compute);
        let (rows, cols) = self.compute.dims(x);
        let mut y = self.compute.tensor(rows, cols)?;
        let shape = GroupNorm {
            groups: self.groups,
            eps: config::NORM_EPS,
            silu,
        };
        self.compute.pipeline()?.group_norm(
            x,
            &view.weight(&norm.weight)?,
            &view.weight(&norm.bias)?,
            shape,
            &mut y,
        )?;
        Ok(y)
    }

    /// `shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))`.
    fn resnet(
        &self,
        held: &Held<C::Block>,
        resnet: &Resnet,
        x: &C::Tensor,
        image: Image,
    ) -> Result<C::Tensor, FamilyError> {
        let h = self.norm(held, &resnet.norm1, x, true)?;
        let h = self.conv(held, &resnet.conv1, &h, image)?;
        let h = self.norm(held, &resnet.norm2, &h, true)?;
        let mut h = self.conv(held, &resnet.conv2, &h, image)?;
        match &resnet.shortcut {
            Some(shortcut) => {
                let widened = self.conv(held, shortcut, x, image)?;
                self.compute.add(&mut h, &widened)?;
            }
            None => self.compute.add(&mut h, x)?,
        }
        Ok(h)
    }

    /// `x + out(attention(q, k, v))` of the group-normed pixels, one head.
    fn attention(
        &self,
        held: &Held<C::Block>,
        attention: &SelfAttention,
        x: &C::Tensor,
        image: Image,
    ) -> Result<C::Tensor, FamilyError> {
        let compute = self.compute;
        let view = held.view(compute);
        let h = self.norm(held, &attention.norm, x, false)?;
        let (pixels, channels) = (image.pixels(), attention.channels);
        let project = |pair: &Pair, input: &C::Tensor| -> Result<C::Tensor, FamilyError> {
            let mut y = compute.tensor(pixels, channels)?;
            compute.linear(
                input,
                &view.weight(&pair.weight)?,
                Some(&view.weight(&pair.bias)?),
                &mut y,
            )?;
            Ok(y)
        };
        let (q, k, v) = (
            project(&attention.q, &h)?,
            project(&attention.k, &h)?,
            project(&attention.v, &h)?,
        );
        let mut context = compute.tensor(pixels, channels)?;
        let lengths = [pixels];
        let shape = Attention {
            sequences: 1,
            sequence_length: pixels,
            heads: 1,
            kv_heads: 1,
            head_dim: channels,
            scale: 1.0 / (channels as f32).sqrt(),
            mask: Mask::Padding(&lengths),
        };
        compute.attention(&q, &k, &v, &shape, &mut context)?;
        let mut out = project(&attention.out, &context)?;
        compute.add(&mut out, x)?;
        Ok(out)
    }
}

impl Facts for VaeDecoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Autoencoder
    }

    fn describe(&self) -> &'static str {
        "vae decoder"
    }

    fn layout(&self) -> &ModelLayout {
        &self.placement.layout
    }

    fn reference_key(&self, step: u64) -> u64 {
        step % (self.input.latents.len() * self.tiling.tiles.len()) as u64
    }

    /// Latent positions of a step (its largest tile).
    fn tokens_per_step(&self) -> u64 {
        let (rows, cols) = self.tiling.largest();
        (rows * cols) as u64
    }

    fn activation_bytes(&self, _steps: u64) -> u64 {
        self.working_set_bytes()
    }

    /// The decode's working set, reserved before its first block (every block's
    /// stage runs inside it).
    fn activations(&self) -> Option<super::Activations> {
        let blocks = self.placement.layout.len() as u64;
        Some(super::Activations::whole_step(
            "decode",
            blocks,
            self.working_set_bytes(),
        ))
    }
}

impl Family for VaeDecoder {
    type State<C: Compute> = VaeState;

    fn start<C: Compute>(&self, compute: &C) -> Result<VaeState, FamilyError> {
        compute.pipeline()?;
        Ok(VaeState { reserved: false })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut VaeState,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        if !state.reserved {
            blocks.reserve_activations(self.working_set_bytes())?;
            state.reserved = true;
        }
        let (z, tile) = self.channels_last(step);
        let image = self.decode(compute, blocks, (&z, tile))?;
        let values = compute.read(&image)?;
        let (pixels, channels) = compute.dims(&image);
        let mut planar = vec![0.0; values.len()];
        for (pixel, row) in values.chunks_exact(channels).enumerate() {
            for (channel, &value) in row.iter().enumerate() {
                planar[channel * pixels + pixel] = value;
            }
        }
        Ok(StepOutput {
            output: Some(planar),
            ..StepOutput::default()
        })
    }
}
