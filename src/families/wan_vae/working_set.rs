//! What a WAN VAE decode holds live, computed from the shapes its layers allocate
//! (see [`super::layers`]): the feature cache (two input frames of every causal
//! convolution of three taps, at its resolution and width) beside the largest
//! stage of one chunk. A later chunk is the largest: its frames are doubled by every
//! temporal upsampling. Reserved through the activation path before the first block.

use super::cache::CACHE_FRAMES;
use super::config::WanVaeConfig;

/// One stage's frames, pixels and channels.
struct Level {
    frames: u64,
    pixels: u64,
    input: u64,
    out: u64,
}

/// The levels of a chunk past the first: the middle block's, then each up block's.
fn levels(config: &WanVaeConfig, pixels: u64) -> Vec<Level> {
    let dims: Vec<u64> = config.dims().into_iter().map(|d| d as u64).collect();
    let mut levels = vec![Level {
        frames: 1,
        pixels,
        input: dims[0],
        out: dims[0],
    }];
    let (mut frames, mut pixels) = (1, pixels);
    for number in 0..dims.len() - 1 {
        let input = super::weights::up_channels(config, number).0 as u64;
        levels.push(Level {
            frames,
            pixels,
            input,
            out: dims[number + 1],
        });
        if number + 1 < dims.len() - 1 {
            if config.temporal_upsample[number] {
                frames *= 2;
            }
            pixels *= 4;
        }
    }
    levels
}

/// Causal convolutions of three taps in one chunk, in call order (each one entry of
/// the feature cache): the input convolution, two per ResNet block, each temporal
/// upsampling's `time_conv`, the output convolution.
pub fn causal_convolutions(config: &WanVaeConfig) -> usize {
    let up_blocks = config.dims().len() - 1;
    let temporal = config.temporal_upsample.iter().filter(|&&t| t).count();
    1 + 2 * 2 + up_blocks * 2 * (config.num_res_blocks + 1) + temporal + 1
}

/// Bytes of the feature cache at its fullest: two frames of each causal
/// convolution's input.
pub fn cache_bytes(config: &WanVaeConfig, latent_pixels: usize) -> u64 {
    let levels = levels(config, latent_pixels as u64);
    let frames = CACHE_FRAMES as u64;
    let mut values = frames * levels[0].pixels * config.z_dim as u64;
    values += frames * levels[0].pixels * levels[0].out * 4;
    let resnets = config.num_res_blocks as u64 + 1;
    for (number, level) in levels.iter().enumerate().skip(1) {
        // conv1 of the first ResNet reads its input width, every other its output's.
        let widths = level.input + (2 * resnets - 1) * level.out;
        values += frames * level.pixels * widths;
        if config.temporal_upsample.get(number - 1) == Some(&true) && number + 1 < levels.len() {
            values += frames * level.pixels * level.out;
        }
    }
    let last = &levels[levels.len() - 1];
    values += frames * last.pixels * last.out;
    4 * values
}

/// Bytes a decode of a `height × width` latent holds live at its largest stage,
/// its feature cache included.
pub fn working_set_bytes(config: &WanVaeConfig, height: usize, width: usize) -> u64 {
    let latent_pixels = (height * width) as u64;
    let levels = levels(config, latent_pixels);
    let mid = &levels[0];
    // The latent, post_quant_conv's and conv_in's stacked input and output; the
    // attention's input, norm, q, k, v, context and output.
    let z = config.z_dim as u64;
    let mut peak = mid.pixels * (3 * z + 3 * z + mid.out).max(7 * mid.out);
    for level in &levels {
        let (frames, pixels) = (level.frames, level.pixels);
        let widest = level.input.max(level.out);
        // A ResNet block: its input, the norm, the residual, the stacked windows of
        // every frame and the convolution's output.
        let resnet = frames * pixels * (2 * level.input + 2 * level.out + 3 * widest);
        // An upsampling: its input, stacked windows, the doubled frames, one frame
        // widened ×4 and the convolution's outputs at 4× the pixels.
        let mut upsample = frames * pixels * level.out * 10 + 4 * pixels * level.out;
        if config.is_residual {
            // Wan 2.2's shortcut: the block's frames doubled and widened ×4.
            upsample += 2 * frames * 4 * pixels * level.out;
        }
        peak = peak.max(resnet).max(upsample);
    }
    let last = &levels[levels.len() - 1];
    let out = config.out_channels as u64;
    peak = peak.max(last.frames * last.pixels * (5 * last.out + out));
    4 * peak + cache_bytes(config, height * width)
}

/// Bytes an encode of `height × width` frames holds live, bounded from above: per
/// level, the feature cache (two frames of each causal convolution's input, one of
/// a `time_conv`'s) beside the largest level's chunk of four frames, eight tensors
/// of its widest channels each (input, norm, residual, stacked windows of three,
/// output).
pub fn encoder_working_set_bytes(config: &WanVaeConfig, height: usize, width: usize) -> u64 {
    let dims: Vec<u64> = std::iter::once(1)
        .chain(config.dim_mult.iter().copied())
        .map(|mult| (config.encoder_base_dim * mult) as u64)
        .collect();
    let convolutions = 2 * config.num_res_blocks as u64 + 1;
    let (mut pixels, mut frames) = ((height * width) as u64, 4u64);
    let (mut cache, mut peak) = (0u64, 0u64);
    for level in 0..dims.len() - 1 {
        let widest = dims[level].max(dims[level + 1]);
        cache += CACHE_FRAMES as u64 * pixels * widest * convolutions;
        peak = peak.max(8 * frames * pixels * widest);
        if level + 2 < dims.len() {
            pixels /= 4;
            frames = frames.div_ceil(2);
        }
    }
    let top = dims[dims.len() - 1];
    cache += CACHE_FRAMES as u64 * pixels * top * 5;
    4 * (cache + peak)
}
