//! The WAN VAE decoder's layers over one held block, on a chunk's frames (each a
//! channels-last `[pixels, channels]` tensor, see [`crate::compute::pipeline`]).
//!
//! A causal 3-D convolution is computed as the 2-D convolution it is over the frames
//! of its window stacked as channels: its weight `[out, in, 3, kh, kw]` is, as the
//! `[out, in·3·kh·kw]` matrix it is in the file, the weight of a 2-D convolution over
//! `3·in` channels ordered `(channel, frame)`. So an output frame is one
//! `Compute::conv2d` of its three input frames interleaved channel by channel, with
//! the file's weight as it lies (no copy, no re-layout, any storage dtype), and the
//! summation stays inside one kernel, deterministic like every other convolution.
//! The interleaving is done on the host (read, interleave, write): exact, and cheap
//! on the CPU backend where a tensor is host memory; on CUDA it is a round trip per
//! frame (a device gather or a conv3d kernel is the follow-up).

use crate::compute::pipeline::{Conv2d, Image};
use crate::compute::{Attention as AttentionShape, Compute, Mask, TensorSlot};
use crate::families::blocks::Held;
use crate::families::FamilyError;

use super::cache::{advance, FeatureCache, CACHE_FRAMES};
use super::stack::stack_windows;
use super::weights::{Attention, Conv, Downsample, Resnet, Upsample};

/// F.normalize's floor on the norm (1e-12), as an epsilon under the mean square of
/// `channels` values: `x / max(‖x‖, 1e-12) · √C = x / max(rms, 1e-12 / √C)`.
fn rms_eps(channels: usize) -> f32 {
    1e-24 / channels as f32
}

/// The layers of one chunk over the compute port.
pub struct Layers<'c, C: Compute> {
    pub compute: &'c C,
}

impl<C: Compute> Layers<'_, C> {
    /// `y ← conv2d(x)` with `weight`/`bias` (rows: output channels) over `kernel`².
    fn conv2d(
        &self,
        held: &Held<C::Block>,
        (weight, bias): (&TensorSlot, &TensorSlot),
        x: &C::Tensor,
        (image, kernel): (Image, usize),
    ) -> Result<C::Tensor, FamilyError> {
        let view = held.view(self.compute);
        let mut y = self.compute.tensor(image.pixels(), weight.rows)?;
        self.compute.pipeline()?.conv2d(
            x,
            &view.weight(weight)?,
            Some(&view.weight(bias)?),
            &Conv2d::same(image, kernel),
            &mut y,
        )?;
        Ok(y)
    }

    /// A convolution of one temporal tap, frame by frame (`post_quant_conv`, a
    /// residual's 1×1×1, the upsampling's 2-D 3×3).
    pub fn conv_frames(
        &self,
        held: &Held<C::Block>,
        conv: &Conv,
        frames: &[C::Tensor],
        image: Image,
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        frames
            .iter()
            .map(|frame| {
                self.conv2d(
                    held,
                    (&conv.weight, &conv.bias),
                    frame,
                    (image, conv.kernel),
                )
            })
            .collect()
    }

    /// The stacked inputs of a causal convolution of three taps over a chunk's
    /// `frames`: output frame `j` sees frames `j − 2, j − 1, j` of the stream the
    /// cache continues (zeros before the video's start); the cache then keeps the
    /// stream's last two frames.
    fn windows(
        &self,
        cached: &mut Vec<C::Tensor>,
        frames: Vec<C::Tensor>,
        channels: usize,
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let padding = CACHE_FRAMES - cached.len().min(CACHE_FRAMES);
        let sources: Vec<&C::Tensor> = cached.iter().chain(&frames).collect();
        let stacked = stack_windows(self.compute, &sources, (padding, channels, 1))?;
        advance(cached, frames);
        Ok(stacked)
    }

    /// `WanCausalConv3d` of three taps over a chunk's `frames`, continuing the
    /// cache's next entry.
    pub fn causal_conv(
        &self,
        held: &Held<C::Block>,
        conv: &Conv,
        frames: Vec<C::Tensor>,
        (cache, image): (&mut FeatureCache<C::Tensor>, Image),
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        if conv.frames != CACHE_FRAMES + 1 {
            return Err(FamilyError::internal(format!(
                "a causal convolution of {} temporal taps: the WAN VAE's have {}",
                conv.frames,
                CACHE_FRAMES + 1
            )));
        }
        let stacked = self.windows(cache.next_entry()?, frames, conv.input)?;
        self.conv_frames(held, conv, &stacked, image)
    }

    /// `x ← x / rms(x) · gamma` over each pixel's channels (`WanRMS_norm`), then
    /// SiLU when `silu`.
    pub fn norm(
        &self,
        gamma: &TensorSlot,
        held: &Held<C::Block>,
        frames: &[C::Tensor],
        silu: bool,
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let view = held.view(self.compute);
        let gamma = view.weight(gamma)?;
        let eps = rms_eps(gamma.elements());
        frames
            .iter()
            .map(|frame| {
                let (rows, cols) = self.compute.dims(frame);
                let mut y = self.compute.tensor(rows, cols)?;
                self.compute.rms_norm(frame, Some(&gamma), eps, &mut y)?;
                if silu {
                    self.compute.diffusion()?.silu(&mut y)?;
                }
                Ok(y)
            })
            .collect()
    }

    /// `WanResidualBlock`: `shortcut(x) + conv2(silu(norm2(conv1(silu(norm1(x))))))`.
    pub fn resnet(
        &self,
        held: &Held<C::Block>,
        resnet: &Resnet,
        x: Vec<C::Tensor>,
        (cache, image): (&mut FeatureCache<C::Tensor>, Image),
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let h = self.norm(&resnet.norm1, held, &x, true)?;
        let residual = match &resnet.shortcut {
            Some(shortcut) => self.conv_frames(held, shortcut, &x, image)?,
            None => x,
        };
        let h = self.causal_conv(held, &resnet.conv1, h, (cache, image))?;
        let h = self.norm(&resnet.norm2, held, &h, true)?;
        let mut h = self.causal_conv(held, &resnet.conv2, h, (cache, image))?;
        for (frame, residual) in h.iter_mut().zip(&residual) {
            self.compute.add(frame, residual)?;
        }
        Ok(h)
    }

    /// `WanAttentionBlock`: each frame's pixels attend to each other, one head.
    pub fn attention(
        &self,
        held: &Held<C::Block>,
        attention: &Attention,
        x: Vec<C::Tensor>,
        image: Image,
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let compute = self.compute;
        let view = held.view(compute);
        let (pixels, channels) = (image.pixels(), attention.channels);
        let normed = self.norm(&attention.norm, held, &x, false)?;
        let project = |weight: TensorSlot, bias: TensorSlot, input: &C::Tensor| {
            let mut y = compute.tensor(pixels, channels)?;
            compute.linear(
                input,
                &view.weight(&weight)?,
                Some(&view.weight(&bias)?),
                &mut y,
            )?;
            Ok::<_, FamilyError>(y)
        };
        let third = |part: usize| {
            (
                attention.qkv.sub_rows(part * channels, channels),
                attention.qkv_bias.sub_vector(part * channels, channels),
            )
        };
        let lengths = [pixels];
        let shape = AttentionShape {
            sequences: 1,
            sequence_length: pixels,
            heads: 1,
            kv_heads: 1,
            head_dim: channels,
            scale: 1.0 / (channels as f32).sqrt(),
            mask: Mask::Padding(&lengths),
        };
        let mut out = Vec::with_capacity(x.len());
        for (frame, h) in x.iter().zip(&normed) {
            let [q, k, v] = [0, 1, 2].map(|part| {
                let (weight, bias) = third(part);
                project(weight, bias, h)
            });
            let mut context = compute.tensor(pixels, channels)?;
            compute.attention(&q?, &k?, &v?, &shape, &mut context)?;
            let mut y = project(attention.proj, attention.proj_bias, &context)?;
            compute.add(&mut y, frame)?;
            out.push(y);
        }
        Ok(out)
    }

    /// `WanResample` upsampling: past the first chunk, `upsample3d`'s causal
    /// `time_conv` makes two frames of each (its output's two halves of channels);
    /// then nearest ×2 and the 3×3 convolution, frame by frame.
    pub fn upsample(
        &self,
        held: &Held<C::Block>,
        upsample: &Upsample,
        x: Vec<C::Tensor>,
        (cache, image): (&mut FeatureCache<C::Tensor>, Image),
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let frames = match &upsample.time_conv {
            // The first chunk keeps its frame, and its input never enters the cache
            // (diffusers' "Rep"): the second chunk pads with zeros.
            Some(_) if cache.first_chunk() => {
                cache.next_entry()?;
                x
            }
            Some(time_conv) => {
                let channels = time_conv.input;
                let stacked = self.windows(cache.next_entry()?, x, channels)?;
                let mut doubled = Vec::with_capacity(2 * stacked.len());
                for input in &stacked {
                    for half in 0..2 {
                        let weight = time_conv.weight.sub_rows(half * channels, channels);
                        let bias = time_conv.bias.sub_vector(half * channels, channels);
                        doubled.push(self.conv2d(held, (&weight, &bias), input, (image, 1))?);
                    }
                }
                doubled
            }
            None => x,
        };
        let wide = Image {
            height: image.height * 2,
            width: image.width * 2,
        };
        frames
            .iter()
            .map(|frame| {
                let (rows, cols) = self.compute.dims(frame);
                let mut y = self.compute.tensor(rows * 4, cols)?;
                self.compute
                    .pipeline()?
                    .upsample_nearest(frame, image, &mut y)?;
                let conv = &upsample.conv;
                self.conv2d(held, (&conv.weight, &conv.bias), &y, (wide, conv.kernel))
            })
            .collect()
    }
}

impl<C: Compute> Layers<'_, C> {
    /// `WanResample` downsampling: each frame zero-padded right and bottom and
    /// convolved 3×3 at stride 2; then (`downsample3d`) past the first chunk the
    /// `time_conv` at stride 2 over the last frame of the chunk before and this
    /// chunk's frames (the first chunk's frame only enters the cache).
    pub fn downsample(
        &self,
        held: &Held<C::Block>,
        downsample: &Downsample,
        x: Vec<C::Tensor>,
        (cache, image): (&mut FeatureCache<C::Tensor>, Image),
    ) -> Result<(Vec<C::Tensor>, Image), FamilyError> {
        let shape = Conv2d {
            input: image,
            kernel: 3,
            stride: 2,
            padding: [0, 1, 0, 1],
        };
        let view = held.view(self.compute);
        let conv = &downsample.conv;
        let (weight, bias) = (view.weight(&conv.weight)?, view.weight(&conv.bias)?);
        let mut frames = Vec::with_capacity(x.len());
        for frame in &x {
            let mut y = self
                .compute
                .tensor(shape.output().pixels(), conv.weight.rows)?;
            (self.compute.pipeline()?).conv2d(frame, &weight, Some(&bias), &shape, &mut y)?;
            frames.push(y);
        }
        let small = shape.output();
        let Some(time_conv) = &downsample.time_conv else {
            return Ok((frames, small));
        };
        let first = cache.first_chunk();
        let cached = cache.next_entry()?;
        let last = match frames.last() {
            Some(last) => last,
            None => return Ok((frames, small)),
        };
        let (rows, cols) = self.compute.dims(last);
        let mut kept = self.compute.tensor(rows, cols)?;
        self.compute.copy(last, &mut kept)?;
        if first {
            *cached = vec![kept];
            return Ok((frames, small));
        }
        let sources: Vec<&C::Tensor> = cached.iter().chain(&frames).collect();
        let stacked = stack_windows(self.compute, &sources, (0, time_conv.input, 2))?;
        *cached = vec![kept];
        Ok((self.conv_frames(held, time_conv, &stacked, small)?, small))
    }
}
