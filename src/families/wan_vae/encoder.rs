//! The WAN VAE's encoder (`AutoencoderKLWan.encode`): a video (an image-to-video
//! pipeline's first frame and the frames after it) to the latent the pipeline
//! conditions on. As `_encode`: the first frame alone, then 4 frames a chunk, each
//! through the causal convolutions continued by a feature cache — the input
//! convolution; per level, ResNet blocks and (but the last) a downsampling, 3×3 at
//! stride 2 and, where `downsample3d`, a causal `time_conv` at stride 2 that makes one
//! frame of a chunk's four; the middle block; RMS norm, SiLU and the output
//! convolution; `quant_conv`. A step's output is one latent frame's mean (the
//! distribution's mode, `retrieve_latents(..., sample_mode="argmax")`) normalised as
//! `WanImageToVideoPipeline` does: `(mean − latents_mean) · (1 / latents_std)`,
//! `[z_dim, height / 8, width / 8]`.
//!
//! It is the family [`WorkloadKind::ImageEncoder`] of the same `vae/` folder: a run
//! asks for it by kind (the registry's first match of a folder is the decoder).

use stagehand_actors::{BlockId, ModelLayout};

use super::cache::{ChunkState, FeatureCache};
use super::layers::Layers;
use super::weights::{self, Encoder};
use super::WanVaeConfig;
use crate::compute::pipeline::Image;
use crate::compute::Compute;
use crate::families::blocks::Blocks;
use crate::families::family::{Facts, Family, StepOutput};
use crate::families::inputs::WorkloadKind;
use crate::families::placement::Placement;
use crate::families::registry::{Found, Open, Request, StepUnit};
use crate::families::FamilyError;

/// Videos to encode: each `[3, frames, height, width]` in [−1, 1], `frames` one
/// more than a multiple of 4, the sizes multiples of 8.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoInput {
    pub videos: Vec<Vec<f32>>,
    pub frames: usize,
    pub height: usize,
    pub width: usize,
}

/// A WAN VAE encoder over its videos.
pub struct WanVaeEncoder {
    pub config: WanVaeConfig,
    placement: Placement,
    encoder: Encoder,
    input: VideoInput,
}

impl WanVaeEncoder {
    /// Bytes a step holds live, its feature cache included (an upper bound).
    pub fn working_set_bytes(&self) -> u64 {
        let (height, width) = (self.input.height, self.input.width);
        super::working_set::encoder_working_set_bytes(&self.config, height, width)
    }

    /// Latent frames of a video: its first frame, then one per 4.
    pub fn latent_frames(&self) -> usize {
        1 + (self.input.frames - 1) / 4
    }

    /// Causal convolutions of three taps in one chunk: the input convolution, two per
    /// ResNet block, each temporal downsampling's `time_conv`, the middle block's
    /// four, the output convolution.
    fn causal_convolutions(&self) -> usize {
        let levels = self.encoder.levels.len();
        let temporal = (self.encoder.levels.iter())
            .filter(|level| {
                level
                    .downsample
                    .is_some_and(|down| down.time_conv.is_some())
            })
            .count();
        1 + levels * 2 * self.config.num_res_blocks + temporal + 4 + 1
    }

    /// Video frames `first .. first + count` of video `video`, channels-last, one
    /// tensor each.
    fn frames<C: Compute>(
        &self,
        compute: &C,
        video: usize,
        (first, count): (usize, usize),
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let values = &self.input.videos[video];
        let (height, width) = (self.input.height, self.input.width);
        let (pixels, frames) = (height * width, self.input.frames);
        let patch = self.config.patch_size;
        (first..first + count)
            .map(|frame| {
                let mut planar = Vec::with_capacity(3 * pixels);
                for channel in 0..3 {
                    planar.extend_from_slice(
                        &values[(channel * frames + frame) * pixels..][..pixels],
                    );
                }
                // Wan 2.2's frames go in as 2 × 2 patches of 12 channels.
                let channels_last =
                    super::residual::patchify_frame(&planar, 3, (height, width), patch);
                let mut tensor = compute.tensor(pixels / (patch * patch), 3 * patch * patch)?;
                compute.write(&mut tensor, &channels_last)?;
                Ok(tensor)
            })
            .collect()
    }

    /// One chunk through the encoder: one latent frame's mean `[pixels, z_dim]`.
    fn encode_chunk<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        blocks: &mut B,
        (x, cache): (Vec<C::Tensor>, &mut FeatureCache<C::Tensor>),
    ) -> Result<C::Tensor, FamilyError> {
        let layers = Layers { compute };
        let encoder = &self.encoder;
        let patch = self.config.patch_size;
        let mut image = Image {
            height: self.input.height / patch,
            width: self.input.width / patch,
        };
        let mut x = x;
        for (number, level) in encoder.levels.iter().enumerate() {
            (x, image) = blocks.with_held(compute, BlockId(number as u32), |held, _| {
                let mut x = x;
                if number == 0 {
                    x = layers.causal_conv(held, &encoder.conv_in, x, (cache, image))?;
                }
                // Wan 2.2's shortcut of the level's input, added to its output.
                let shortcut = match &level.shortcut {
                    Some(down) => Some(super::residual::avg_down(compute, down, &x, image)?),
                    None => None,
                };
                for resnet in &level.resnets {
                    x = layers.resnet(held, resnet, x, (cache, image))?;
                }
                let (mut x, small) = match &level.downsample {
                    Some(down) => layers.downsample(held, down, x, (cache, image))?,
                    None => (x, image),
                };
                if let Some(shortcut) = shortcut {
                    if shortcut.len() != x.len() {
                        return Err(FamilyError::internal(format!(
                            "a residual down block made {} frames and its shortcut {}",
                            x.len(),
                            shortcut.len()
                        )));
                    }
                    for (frame, shortcut) in x.iter_mut().zip(&shortcut) {
                        compute.add(frame, shortcut)?;
                    }
                }
                Ok((x, small))
            })?;
        }
        let middle = BlockId(encoder.levels.len() as u32);
        let x = blocks.with_held(compute, middle, |held, _| {
            let x = layers.resnet(held, &encoder.mid[0], x, (cache, image))?;
            let x = layers.attention(held, &encoder.attention, x, image)?;
            layers.resnet(held, &encoder.mid[1], x, (cache, image))
        })?;
        let last = BlockId(encoder.levels.len() as u32 + 1);
        let mut mean = blocks.with_held(compute, last, |held, _| {
            let x = layers.norm(&encoder.norm_out, held, &x, true)?;
            let moments = layers.causal_conv(held, &encoder.conv_out, x, (cache, image))?;
            layers.conv_frames(held, &encoder.quant_mean, &moments, image)
        })?;
        cache.end_chunk()?;
        match (mean.pop(), mean.is_empty()) {
            (Some(frame), true) => Ok(frame),
            _ => Err(FamilyError::internal(
                "a WAN VAE encoder chunk did not make one latent frame".into(),
            )),
        }
    }
}

impl Facts for WanVaeEncoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::ImageEncoder
    }

    fn describe(&self) -> &'static str {
        "wan vae encoder"
    }

    fn layout(&self) -> &ModelLayout {
        &self.placement.layout
    }

    fn reference_key(&self, step: u64) -> u64 {
        step % (self.input.videos.len() * self.latent_frames()) as u64
    }

    /// A chunk continues the ones before it.
    fn reference_is_sequential(&self) -> bool {
        true
    }

    fn tokens_per_step(&self) -> u64 {
        (self.input.height * self.input.width) as u64
    }

    /// The encode's working set with its feature cache, reserved before its first
    /// block.
    fn activation_bytes(&self, _steps: u64) -> u64 {
        self.working_set_bytes()
    }
}

impl Family for WanVaeEncoder {
    type State<C: Compute> = ChunkState<C::Tensor>;

    fn start<C: Compute>(&self, compute: &C) -> Result<ChunkState<C::Tensor>, FamilyError> {
        compute.pipeline()?;
        compute.diffusion()?;
        Ok(ChunkState::new())
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut ChunkState<C::Tensor>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        state.reserve_once(blocks, self.working_set_bytes())?;
        let chunks = self.latent_frames();
        let step = step as usize % (self.input.videos.len() * chunks);
        let (video, chunk) = (step / chunks, step % chunks);
        let mut cache = state.take(chunk, self.causal_convolutions(), || {
            format!("chunk {chunk} of video {video} has no encode to continue: its earlier frames were not encoded")
        })?;
        let frames = match chunk {
            0 => (0, 1),
            _ => (1 + 4 * (chunk - 1), 4),
        };
        let x = self.frames(compute, video, frames)?;
        let mean = self.encode_chunk(compute, blocks, (x, &mut cache))?;
        state.keep(cache, chunk + 1 == chunks);
        let values = compute.read(&mean)?;
        let latent = self.config.z_dim;
        let pixels = values.len() / latent.max(1);
        let mut planar = vec![0.0; values.len()];
        for (pixel, row) in values.chunks_exact(latent).enumerate() {
            for (channel, &value) in row.iter().enumerate() {
                // `(mean − latents_mean) · latents_std` with the pipeline's 1 / std.
                let inverse = 1.0 / self.config.latents_std[channel];
                planar[channel * pixels + pixel] =
                    (value - self.config.latents_mean[channel]) * inverse;
            }
        }
        Ok(StepOutput {
            output: Some(planar),
            ..StepOutput::default()
        })
    }
}

impl Open for WanVaeEncoder {
    const NAME: &'static str = "wan-vae-encoder";
    const KIND: WorkloadKind = WorkloadKind::ImageEncoder;
    const STEP: StepUnit = StepUnit::Batch;

    fn recognises(found: &Found<'_>) -> bool {
        <super::WanVaeDecoder as Open>::recognises(found)
    }

    /// The encoder over the run's videos (an image-to-video pipeline's), or one
    /// seeded image of 64².
    fn open(request: &Request<'_>) -> Result<Self, FamilyError> {
        let config = WanVaeConfig::of(request)?;
        let input = request
            .extras
            .input::<VideoInput>()
            .cloned()
            .unwrap_or_else(|| VideoInput {
                videos: vec![crate::families::flux::gaussian(3 * 64 * 64, 0)],
                frames: 1,
                height: 64,
                width: 64,
            });
        let scale = config.pixel_scale();
        let (frames, height, width) = (input.frames, input.height, input.width);
        let fits = frames % 4 == 1
            && height > 0
            && width > 0
            && height % scale == 0
            && width % scale == 0
            && !input.videos.is_empty()
            && (input.videos.iter()).all(|video| video.len() == 3 * frames * height * width);
        if !fits {
            return Err(FamilyError::request("videos", format!(
                "a video to encode is [3, frames, height, width] with frames one more than a multiple of 4 and both sizes multiples of {scale}; got {} values for {frames} frames of {width}×{height}",
                input.videos.first().map_or(0, Vec::len),
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
