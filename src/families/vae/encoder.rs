//! The VAE's encoder (`AutoencoderKL.encode`): an image to the latent a pipeline
//! starts image-to-image from. A 3×3 convolution in; the down blocks, each
//! `layers_per_block` ResNet blocks and, but the last, a 3×3 convolution at stride 2
//! over the image padded by one pixel at the bottom and right (diffusers'
//! `Downsample2D` with `padding=0`); the middle block (ResNet, single-head attention,
//! ResNet); GroupNorm, SiLU and a 3×3 convolution to the latent distribution's mean
//! and log-variance. A step's output is the mean — the distribution's mode, diffusers'
//! `latent_dist.mode()` — scaled as a pipeline scales it: `(mean − shift_factor) ·
//! scaling_factor`, `[latent_channels, height / 8, width / 8]`.
//!
//! It is the family [`WorkloadKind::ImageEncoder`] of the same `vae/` folder: a run
//! asks for it by kind (the registry's first match of a folder is the decoder).

use stagehand_actors::{BlockId, ModelLayout};

use super::weights::{self, Encoder};
use super::{Stages, VaeConfig};
use crate::compute::pipeline::{Conv2d, Image};
use crate::families::blocks::Blocks;
use crate::families::family::{Facts, Family, StepOutput};
use crate::families::inputs::WorkloadKind;
use crate::families::placement::Placement;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::FamilyError;

/// Images to encode: each `[3, height, width]` in [−1, 1] (pixels / 127.5 − 1).
#[derive(Debug, Clone, PartialEq)]
pub struct ImageInput {
    pub images: Vec<Vec<f32>>,
    pub height: usize,
    pub width: usize,
}

/// A VAE encoder over its images.
pub struct VaeEncoder {
    pub config: VaeConfig,
    placement: Placement,
    encoder: Encoder,
    input: ImageInput,
}

impl VaeEncoder {
    /// The latent's size in positions.
    pub fn latent(&self) -> Image {
        let scale = self.config.scale_factor();
        Image {
            height: self.input.height / scale,
            width: self.input.width / scale,
        }
    }

    /// The image of step `step`, channels-last.
    fn channels_last(&self, step: u64) -> Vec<f32> {
        let image = &self.input.images[step as usize % self.input.images.len()];
        let pixels = self.input.height * self.input.width;
        let channels = self.config.image_channels;
        let mut values = vec![0.0; image.len()];
        for (channel, plane) in image.chunks_exact(pixels).enumerate() {
            for (pixel, &value) in plane.iter().enumerate() {
                values[pixel * channels + channel] = value;
            }
        }
        values
    }

    fn encode<C: crate::compute::Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        blocks: &mut B,
        pixels: &[f32],
    ) -> Result<C::Tensor, FamilyError> {
        let mut image = Image {
            height: self.input.height,
            width: self.input.width,
        };
        let mut x = compute.tensor(image.pixels(), self.config.image_channels)?;
        compute.write(&mut x, pixels)?;
        let stages = Stages {
            compute,
            groups: self.config.groups,
        };
        let encoder = &self.encoder;
        for (number, down) in encoder.down.iter().enumerate() {
            let held = blocks.acquire(compute, BlockId(number as u32))?;
            let outcome = (|| {
                let first = match number {
                    0 => Some(stages.conv(&held, &encoder.conv_in, &x, image)?),
                    _ => None,
                };
                let mut y =
                    stages.resnet(&held, &down.resnets[0], first.as_ref().unwrap_or(&x), image)?;
                for resnet in &down.resnets[1..] {
                    y = stages.resnet(&held, resnet, &y, image)?;
                }
                if let Some(conv) = &down.downsample {
                    let shape = Conv2d {
                        input: image,
                        kernel: 3,
                        stride: 2,
                        padding: [0, 1, 0, 1],
                    };
                    return Ok::<_, FamilyError>((
                        stages.conv_shaped(&held, conv, &y, shape)?,
                        shape.output(),
                    ));
                }
                Ok((y, image))
            })();
            blocks.release(compute, held)?;
            (x, image) = outcome?;
        }
        let last = BlockId(encoder.down.len() as u32);
        let held = blocks.acquire(compute, last)?;
        let outcome = (|| {
            let mut y = stages.resnet(&held, &encoder.mid[0], &x, image)?;
            if let Some(attention) = &encoder.mid_attention {
                y = stages.attention(&held, attention, &y, image)?;
            }
            y = stages.resnet(&held, &encoder.mid[1], &y, image)?;
            let normed = stages.norm(&held, &encoder.norm_out, &y, true)?;
            let moments = stages.conv(&held, &encoder.conv_out, &normed, image)?;
            match &encoder.quant {
                Some(quant) => stages.conv(&held, quant, &moments, image),
                None => Ok(moments),
            }
        })();
        blocks.release(compute, held)?;
        outcome
    }
}

impl Facts for VaeEncoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::ImageEncoder
    }

    fn describe(&self) -> &'static str {
        "vae encoder"
    }

    fn layout(&self) -> &ModelLayout {
        &self.placement.layout
    }

    fn reference_key(&self, step: u64) -> u64 {
        step % self.input.images.len() as u64
    }

    fn tokens_per_step(&self) -> u64 {
        let latent = self.latent();
        (latent.height * latent.width) as u64
    }
}

impl Family for VaeEncoder {
    type State<C: crate::compute::Compute> = ();

    fn start<C: crate::compute::Compute>(&self, compute: &C) -> Result<(), FamilyError> {
        compute.pipeline()?;
        Ok(())
    }

    fn step<C: crate::compute::Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        _state: &mut (),
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let moments = self.encode(compute, blocks, &self.channels_last(step))?;
        let values = compute.read(&moments)?;
        let latent = self.config.latent_channels;
        let pixels = values.len() / (2 * latent).max(1);
        let (scaling, shift) = (self.config.scaling, self.config.shift);
        // The mean is the first half of the channels; the log-variance is not needed.
        let mut planar = vec![0.0; latent * pixels];
        for (pixel, row) in values.chunks_exact(2 * latent).enumerate() {
            for (channel, &mean) in row[..latent].iter().enumerate() {
                planar[channel * pixels + pixel] = (mean - shift) * scaling;
            }
        }
        Ok(StepOutput {
            output: Some(planar),
            ..StepOutput::default()
        })
    }
}

impl Open for VaeEncoder {
    const NAME: &'static str = "vae-encoder";
    const KIND: WorkloadKind = WorkloadKind::ImageEncoder;
    const STEP: StepUnit = StepUnit::Batch;

    fn recognises(found: &Found<'_>) -> bool {
        <super::VaeDecoder as Open>::recognises(found)
    }

    /// The encoder over the run's images (an image-to-image pipeline's), or one
    /// seeded image of 64².
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = VaeConfig::of(request)?;
        let input = request
            .extras
            .input::<ImageInput>()
            .cloned()
            .unwrap_or_else(|| ImageInput {
                images: vec![crate::families::flux::gaussian(3 * 64 * 64, 0)],
                height: 64,
                width: 64,
            });
        let scale = config.scale_factor();
        let fits = input.height > 0
            && input.width > 0
            && input.height % scale == 0
            && input.width % scale == 0
            && input
                .images
                .iter()
                .all(|image| image.len() == 3 * input.height * input.width);
        if !fits || input.images.is_empty() {
            return Err(FamilyError::request("images", format!(
                "an image to encode is [3, height, width] with both multiples of {scale}; got {} values for {}×{}",
                input.images.first().map_or(0, Vec::len),
                input.width,
                input.height
            )));
        }
        let (placement, encoder) = weights::place_encoder(request.index, &config)?;
        Ok(Self {
            config,
            placement,
            encoder,
            input,
        })
    }
}
