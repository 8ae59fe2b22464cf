//! The WAN video autoencoder's decoder (diffusers' `AutoencoderKLWan`, Wan 2.1's
//! 16-channel VAE, which the Wan 2.2 A14B text- and image-to-video pipelines decode
//! with): a denoised latent video `[16, frames, height, width]` into RGB frames
//! `[3, 1 + 4·(frames − 1), 8·height, 8·width]` in −1 … 1. Written once against the
//! compute port, on channels-last frames.
//!
//! As `AutoencoderKLWan._decode` after `WanPipeline`'s un-normalisation: the latent
//! is `z / (1 / latents_std) + latents_mean` per channel, `post_quant_conv`
//! (1×1×1), then the decoder one latent frame at a time — a *chunk* — through causal
//! 3-D convolutions that continue from the chunks before through a feature cache
//! (`cache.rs`): the input convolution, the middle block (ResNet, per-frame attention,
//! ResNet), the up blocks (ResNet blocks and an upsampling that doubles the frames
//! past the first chunk, where `upsample3d`), RMS norm, SiLU and the output
//! convolution, clamped to [−1, 1].
//!
//! Blocks: `post_quant_conv` with the input convolution and the middle block, each
//! up block, the output. A step decodes one chunk of one video (the block order
//! repeats per chunk) and outputs its frames `[3, frames of the chunk, H, W]`;
//! [`WanVaeDecoder::assemble`] joins a video's chunks. Decoded in tiles of space
//! ([`WanTiling`], diffusers' `tiled_decode`), a step is one chunk of one tile, the
//! tiles one after another each over every frame, and `assemble` blends them. The steps of a video carry
//! its feature cache, so the reference replays them in order. The encoder, a video
//! to the latent an image-to-video pipeline conditions on, is [`WanVaeEncoder`].

mod cache;
mod config;
mod encoder;
mod layers;
mod open;
mod published;
mod residual;
mod single_file;
mod stack;
#[cfg(test)]
mod tests;
mod tiles;
mod weights;
mod working_set;

use stagehand_actors::{BlockId, ModelLayout};

pub use config::WanVaeConfig;
pub use encoder::{VideoInput, WanVaeEncoder};
pub use open::CLASS_NAME;
pub use published::latents_statistics;
pub use single_file::{inferred_config, is_wan_vae};
pub use tiles::{WanTile, WanTiling};
pub use working_set::working_set_bytes;

use cache::{ChunkState, FeatureCache};
use layers::Layers;
use weights::Decoder;

use super::blocks::Blocks;
use super::family::{Facts, Family, StepOutput};
use super::inputs::WorkloadKind;
use super::placement::Placement;
use super::FamilyError;
use crate::compute::pipeline::Image;
use crate::compute::Compute;
use crate::model::ModelIndex;

/// Latent videos to decode: each `[channels, frames, height, width]`, as a Wan
/// pipeline's transformer leaves them (normalised; the decoder un-normalises them).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoLatentInput {
    pub latents: Vec<Vec<f32>>,
    pub frames: usize,
    pub height: usize,
    pub width: usize,
    /// Decode in tiles of space ([`WanTiling`]); `None`: the whole frame at once.
    pub tile: Option<WanTile>,
}

/// A WAN VAE decoder over its latent videos.
pub struct WanVaeDecoder {
    pub config: WanVaeConfig,
    placement: Placement,
    decoder: Decoder,
    input: VideoLatentInput,
    pub tiling: WanTiling,
}

impl WanVaeDecoder {
    fn new(
        index: &ModelIndex,
        config: WanVaeConfig,
        input: VideoLatentInput,
    ) -> Result<Self, FamilyError> {
        let VideoLatentInput {
            frames,
            height,
            width,
            tile,
            ..
        } = input;
        let expected = config.z_dim * frames * height * width;
        if input.latents.is_empty() || expected == 0 {
            return Err(FamilyError::request(
                "latents",
                format!(
                    "no latent video to decode ({} latents of {frames} frames, {height} × {width})",
                    input.latents.len()
                ),
            ));
        }
        if let Some(latent) = input.latents.iter().find(|latent| latent.len() != expected) {
            return Err(FamilyError::request("latents", format!(
                "a latent video of {} values is not [{}, {frames}, {height}, {width}] (z_dim, frames, height, width)",
                latent.len(),
                config.z_dim,
            )));
        }
        if let Some(tile) = &tile {
            tile.check()?;
        }
        let (placement, decoder) = weights::place_decoder(index, &config)?;
        let tiling = WanTiling::new(height, width, tile, config.spatial_scale());
        Ok(Self {
            config,
            placement,
            decoder,
            input,
            tiling,
        })
    }

    /// Bytes a step holds live, its feature cache included: its largest tile's.
    pub fn working_set_bytes(&self) -> u64 {
        let (rows, cols) = self.tiling.grid.largest();
        working_set_bytes(&self.config, rows, cols)
    }

    /// Bytes a decode of the whole frame would hold live, tiled or not.
    pub fn whole_frame_bytes(&self) -> u64 {
        working_set_bytes(&self.config, self.input.height, self.input.width)
    }

    /// Steps a video takes: one per latent frame of each tile.
    pub fn steps_per_video(&self) -> usize {
        self.input.frames * self.tiling.count()
    }

    /// Latent frames, rows and columns of each video.
    pub fn latent_size(&self) -> [usize; 3] {
        [self.input.frames, self.input.height, self.input.width]
    }

    /// Latent videos to decode.
    pub fn videos(&self) -> usize {
        self.input.latents.len()
    }

    /// The video `[channels, frames, height, width]` of one latent's steps' outputs
    /// (each `[channels, frames of the chunk, height, width]` of a tile), in step
    /// order: each tile's chunks joined, then the tiles blended, then (Wan 2.2) the
    /// patches' channels put back as pixels, as `_decode`/`tiled_decode` do after
    /// the decoder and the blend.
    pub fn assemble(&self, chunks: &[&[f32]]) -> Vec<f32> {
        let channels = self.config.out_channels;
        let per_tile = self.input.frames.max(1);
        let tiles = chunks
            .chunks(per_tile)
            .map(|chunks| join_chunks(chunks, channels))
            .collect();
        let frames = self.config.video_frames(self.input.frames);
        let video = self.tiling.assemble(tiles, (channels, frames));
        let scale = self.config.spatial_scale();
        let size = (frames, self.input.height * scale, self.input.width * scale);
        let patch = self.config.patch_size;
        residual::unpatchify(&video, self.config.video_channels(), size, patch)
    }

    /// Latent frame `frame` of tile `tile` of video `video`, un-normalised as
    /// WanPipeline does, channels-last, and the tile's size.
    fn channels_last(&self, video: usize, tile: usize, frame: usize) -> (Vec<f32>, Image) {
        let latent = &self.input.latents[video];
        let tile = self.tiling.grid.tiles[tile];
        let (frames, channels) = (self.input.frames, self.config.z_dim);
        let (pixels, width) = (self.input.height * self.input.width, self.input.width);
        let mut values = vec![0.0; tile.rows * tile.cols * channels];
        for channel in 0..channels {
            let plane = &latent[(channel * frames + frame) * pixels..][..pixels];
            // `latents / (1 / std) + mean`, in the pipeline's own f32 steps.
            let inverse = 1.0 / self.config.latents_std[channel];
            let mean = self.config.latents_mean[channel];
            for y in 0..tile.rows {
                let row = &plane[(tile.row + y) * width + tile.col..][..tile.cols];
                for (x, &value) in row.iter().enumerate() {
                    values[(y * tile.cols + x) * channels + channel] = value / inverse + mean;
                }
            }
        }
        let image = Image {
            height: tile.rows,
            width: tile.cols,
        };
        (values, image)
    }

    /// One chunk through the decoder: its frames `[pixels, out]` of the output's
    /// size, unclamped.
    fn decode_chunk<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        blocks: &mut B,
        (z, mut image, cache): (&[f32], Image, &mut FeatureCache<C::Tensor>),
    ) -> Result<Vec<C::Tensor>, FamilyError> {
        let layers = Layers { compute };
        let decoder = &self.decoder;
        let mut latent = compute.tensor(image.pixels(), self.config.z_dim)?;
        compute.write(&mut latent, z)?;
        let mut x = blocks.with_held(compute, BlockId(0), |held, _| {
            let x = layers.conv_frames(held, &decoder.post_quant, &[latent], image)?;
            let x = layers.causal_conv(held, &decoder.conv_in, x, (cache, image))?;
            let x = layers.resnet(held, &decoder.mid[0], x, (cache, image))?;
            let x = layers.attention(held, &decoder.attention, x, image)?;
            layers.resnet(held, &decoder.mid[1], x, (cache, image))
        })?;
        for (number, up) in decoder.up.iter().enumerate() {
            let block = BlockId(number as u32 + 1);
            x = blocks.with_held(compute, block, |held, _| {
                // Wan 2.2's shortcut of the block's input, added to its output.
                let shortcut = match &up.shortcut {
                    Some(dup) => {
                        let first = cache.first_chunk();
                        Some(residual::dup_up(compute, dup, &x, (image, first))?)
                    }
                    None => None,
                };
                let mut x = x;
                for resnet in &up.resnets {
                    x = layers.resnet(held, resnet, x, (cache, image))?;
                }
                if let Some(upsample) = &up.upsample {
                    x = layers.upsample(held, upsample, x, (cache, image))?;
                }
                if let Some(shortcut) = shortcut {
                    if shortcut.len() != x.len() {
                        return Err(FamilyError::internal(format!(
                            "a residual up block made {} frames and its shortcut {}",
                            x.len(),
                            shortcut.len()
                        )));
                    }
                    for (frame, shortcut) in x.iter_mut().zip(&shortcut) {
                        compute.add(frame, shortcut)?;
                    }
                }
                Ok(x)
            })?;
            if up.upsample.is_some() {
                image = Image {
                    height: image.height * 2,
                    width: image.width * 2,
                };
            }
        }
        let last = BlockId(decoder.up.len() as u32 + 1);
        let frames = blocks.with_held(compute, last, |held, _| {
            let x = layers.norm(&decoder.norm_out, held, &x, true)?;
            layers.causal_conv(held, &decoder.conv_out, x, (cache, image))
        })?;
        cache.end_chunk()?;
        Ok(frames)
    }
}

impl Facts for WanVaeDecoder {
    fn kind(&self) -> WorkloadKind {
        WorkloadKind::Autoencoder
    }

    fn describe(&self) -> &'static str {
        "wan vae decoder"
    }

    fn layout(&self) -> &ModelLayout {
        &self.placement.layout
    }

    /// Every step is its own: a chunk continues the ones before it.
    fn reference_key(&self, step: u64) -> u64 {
        step % (self.input.latents.len() * self.steps_per_video()) as u64
    }

    fn reference_is_sequential(&self) -> bool {
        true
    }

    /// Latent positions of a step (one latent frame of its largest tile).
    fn tokens_per_step(&self) -> u64 {
        let (rows, cols) = self.tiling.grid.largest();
        (rows * cols) as u64
    }

    fn activation_bytes(&self, _steps: u64) -> u64 {
        self.working_set_bytes()
    }

    /// The decode's working set with its feature cache, reserved before its first
    /// block (every block's stage runs inside it).
    fn activations(&self) -> Option<super::Activations> {
        let blocks = self.placement.layout.len() as u64;
        Some(super::Activations::whole_step(
            "decode",
            blocks,
            self.working_set_bytes(),
        ))
    }
}

impl Family for WanVaeDecoder {
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
        let (frames, tiles) = (self.input.frames, self.tiling.count());
        let step = step as usize % (self.input.latents.len() * frames * tiles);
        let (video, tile, chunk) = (
            step / (frames * tiles),
            step / frames % tiles,
            step % frames,
        );
        let convolutions = working_set::causal_convolutions(&self.config);
        // A tile's decode has a cache of its own (diffusers' `clear_cache` per
        // tile), made at its first chunk and dropped after its last.
        let mut cache = state.take(chunk, convolutions, || {
            format!("latent frame {chunk} of tile {tile} of video {video} has no decode to continue: its earlier frames were not decoded")
        })?;
        let (z, image) = self.channels_last(video, tile, chunk);
        let decoded = self.decode_chunk(compute, blocks, (&z, image, &mut cache))?;
        state.keep(cache, chunk + 1 == frames);
        let mut planar = Vec::new();
        for frame in &decoded {
            planar.push(compute.read(frame)?);
        }
        // Tiles are blended before the clamp, as `tiled_decode` blends them.
        let clamp = self.tiling.tile.is_none();
        Ok(StepOutput {
            output: Some(planar_frames(&planar, self.config.out_channels, clamp)),
            ..StepOutput::default()
        })
    }
}

/// `[channels, frames, pixels]` of chunks each `[channels, chunk frames, pixels]`.
fn join_chunks(chunks: &[&[f32]], channels: usize) -> Vec<f32> {
    let mut video = vec![Vec::new(); channels];
    for chunk in chunks {
        let plane = chunk.len() / channels.max(1);
        for (channel, values) in chunk.chunks_exact(plane.max(1)).enumerate() {
            video[channel].extend_from_slice(values);
        }
    }
    video.concat()
}

/// Channels-last frames (each `[pixels, channels]`) as `[channels, frames, pixels]`,
/// clamped to [−1, 1] as `AutoencoderKLWan` clamps its output when `clamp` (a tile
/// is clamped after the blend).
fn planar_frames(frames: &[Vec<f32>], channels: usize, clamp: bool) -> Vec<f32> {
    let pixels = frames
        .first()
        .map_or(0, |frame| frame.len() / channels.max(1));
    let mut planar = vec![0.0; channels * frames.len() * pixels];
    for (index, frame) in frames.iter().enumerate() {
        for (pixel, row) in frame.chunks_exact(channels).enumerate() {
            for (channel, &value) in row.iter().enumerate() {
                planar[(channel * frames.len() + index) * pixels + pixel] = match clamp {
                    true => value.clamp(-1.0, 1.0),
                    false => value,
                };
            }
        }
    }
    planar
}
