//! Wan 2.2's VAE beside Wan 2.1's: the shortcuts of its residual levels and the
//! 2 × 2 patches its frames are cut into. Both are moves of values, no weights:
//! `DupUp3D` (the decoder's shortcut around an upsampling block: each input channel
//! copied to 2 × 2 pixels, and 2 frames where the block doubles the frames, of the
//! output's channels), `AvgDown3D` (the encoder's: the mean of the groups of the
//! input's pixels and frames folded into channels), and `patchify`/`unpatchify`.
//! Done on the host, as the causal convolutions' windows are (see [`super::stack`]):
//! exact, a plain copy on the CPU backend.

use stagehand_actors::MemorySpace;

use crate::compute::pipeline::Image;
use crate::compute::Compute;
use crate::families::FamilyError;

use super::weights::{AvgDown, DupUp};

/// A tensor of `rows × cols` with `values` (none on a compute that holds no
/// values: the simulator's recording).
fn written<C: Compute>(
    compute: &C,
    (rows, cols): (usize, usize),
    values: &[f32],
) -> Result<C::Tensor, FamilyError> {
    let mut tensor = compute.tensor(rows, cols)?;
    match compute.memory_space() {
        MemorySpace::Opaque => compute.write(&mut tensor, &[])?,
        _ => compute.write(&mut tensor, values)?,
    }
    Ok(tensor)
}

/// `DupUp3D` of a chunk's frames (each `[pixels, input]` of `image`): its frames
/// at twice the size (`[4·pixels, out]`), `dup.frames` of each; the video's first
/// chunk keeps only the last of them (`first_chunk`, as its upsampling keeps one).
pub fn dup_up<C: Compute>(
    compute: &C,
    dup: &DupUp,
    frames: &[C::Tensor],
    (image, first_chunk): (Image, bool),
) -> Result<Vec<C::Tensor>, FamilyError> {
    let (width, pixels) = (image.width, image.pixels());
    let factor = dup.frames * 4;
    let first = if first_chunk { dup.frames - 1 } else { 0 };
    let opaque = compute.memory_space() == MemorySpace::Opaque;
    let mut out = Vec::with_capacity(frames.len() * dup.frames);
    for frame in frames {
        let values = match opaque {
            true => Vec::new(),
            false => compute.read(frame)?,
        };
        for time in first..dup.frames {
            let mut wide = vec![0.0; if opaque { 0 } else { 4 * pixels * dup.out }];
            if !opaque {
                for (pixel, source) in values.chunks_exact(dup.input).enumerate() {
                    let (row, col) = (pixel / width, pixel % width);
                    for (dy, dx) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                        let at = ((2 * row + dy) * 2 * width + 2 * col + dx) * dup.out;
                        let offset = time * 4 + dy * 2 + dx;
                        for (channel, value) in wide[at..at + dup.out].iter_mut().enumerate() {
                            *value = source[(channel * factor + offset) / dup.repeats];
                        }
                    }
                }
            }
            out.push(written(compute, (4 * pixels, dup.out), &wide)?);
        }
    }
    Ok(out)
}

/// `AvgDown3D` of a chunk's frames (each `[pixels, input]` of `image`), zero frames
/// put before them to make whole groups of `down.frames` (as diffusers pads each
/// chunk): one frame per group, each `[pixels / side², out]`.
pub fn avg_down<C: Compute>(
    compute: &C,
    down: &AvgDown,
    frames: &[C::Tensor],
    image: Image,
) -> Result<Vec<C::Tensor>, FamilyError> {
    let (side, width) = (down.side, image.width);
    let small = Image {
        height: image.height / side,
        width: image.width / side,
    };
    let padding = (down.frames - frames.len() % down.frames) % down.frames;
    let groups = (padding + frames.len()) / down.frames;
    if compute.memory_space() == MemorySpace::Opaque {
        return (0..groups)
            .map(|_| written(compute, (small.pixels(), down.out), &[]))
            .collect();
    }
    let zeros = vec![0.0; image.pixels() * down.input];
    let mut values = vec![zeros; padding];
    for frame in frames {
        values.push(compute.read(frame)?);
    }
    let factor = down.frames * side * side;
    let mut out = Vec::with_capacity(groups);
    for group in values.chunks_exact(down.frames) {
        let mut folded = vec![0.0; small.pixels() * down.out];
        for (pixel, target) in folded.chunks_exact_mut(down.out).enumerate() {
            let (row, col) = (pixel / small.width, pixel % small.width);
            for (channel, value) in target.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for member in 0..down.group {
                    let folded_channel = channel * down.group + member;
                    let (source, rest) = (folded_channel / factor, folded_channel % factor);
                    let (time, dy, dx) = (rest / (side * side), rest / side % side, rest % side);
                    let at = (row * side + dy) * width + col * side + dx;
                    sum += group[time][at * down.input + source];
                }
                *value = sum / down.group as f32;
            }
        }
        out.push(written(compute, (small.pixels(), down.out), &folded)?);
    }
    Ok(out)
}

/// `patchify` of one frame `[channels, height, width]` into channels-last
/// `[(height / patch) · (width / patch), channels · patch²]`: the inverse of
/// [`unpatchify`].
pub fn patchify_frame(
    frame: &[f32],
    channels: usize,
    (height, width): (usize, usize),
    patch: usize,
) -> Vec<f32> {
    let (small_width, cols) = (width / patch, channels * patch * patch);
    let mut out = vec![0.0; frame.len()];
    for channel in 0..channels {
        let plane = &frame[channel * height * width..][..height * width];
        for (pixel, &value) in plane.iter().enumerate() {
            let (row, col) = (pixel / width, pixel % width);
            let target = (row / patch) * small_width + col / patch;
            let packed = (channel * patch + col % patch) * patch + row % patch;
            out[target * cols + packed] = value;
        }
    }
    out
}

/// `unpatchify` of a video `[channels · patch², frames, height, width]` into
/// `[channels, frames, patch · height, patch · width]`: channel `c · patch² + i ·
/// patch + j` is the pixel `j` rows down and `i` columns across of each patch.
pub fn unpatchify(
    video: &[f32],
    channels: usize,
    (frames, height, width): (usize, usize, usize),
    patch: usize,
) -> Vec<f32> {
    if patch == 1 {
        return video.to_vec();
    }
    let (wide, plane) = (width * patch, height * width);
    let mut out = vec![0.0; video.len()];
    for channel in 0..channels {
        for across in 0..patch {
            for down in 0..patch {
                let source = (channel * patch + across) * patch + down;
                for frame in 0..frames {
                    let from = &video[(source * frames + frame) * plane..][..plane];
                    let to = (channel * frames + frame) * plane * patch * patch;
                    for (pixel, &value) in from.iter().enumerate() {
                        let (row, col) = (pixel / width, pixel % width);
                        out[to + (row * patch + down) * wide + col * patch + across] = value;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpatchify_puts_channel_c_i_j_at_row_j_column_i() {
        // Proves diffusers' layout: of 4 channels of one pixel, channel 1 (i 0, j 1)
        // lands one row down, channel 2 (i 1, j 0) one column across.
        let video = [10.0, 11.0, 12.0, 13.0];
        assert_eq!(
            unpatchify(&video, 1, (1, 1, 1), 2),
            [10.0, 12.0, 11.0, 13.0]
        );
    }
}
