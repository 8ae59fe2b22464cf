//! The input of a causal 3-D convolution as the 2-D convolution's input it is: the
//! frames of each temporal window interleaved channel by channel, so the file's
//! weight `[out, in, 3, kh, kw]`, read as `[out, in·3·kh·kw]`, convolves them as a
//! 2-D convolution over `3·in` channels ordered (channel, frame) (see
//! [`super::layers`]).

use stagehand_actors::MemorySpace;

use crate::compute::Compute;
use crate::families::FamilyError;

/// Temporal taps of every causal convolution stacked here.
pub const TAPS: usize = 3;

/// The windows of `TAPS` frames over `padding` zero frames then `sources` (each
/// `[pixels, channels]`), every `stride` frames, each as one `[pixels, 3·channels]`
/// tensor. On a compute whose tensors hold no values (the simulator's recording)
/// the tensors are written as the moves they are, without host copies of frames
/// that are not there.
pub fn stack_windows<C: Compute>(
    compute: &C,
    sources: &[&C::Tensor],
    (padding, channels, stride): (usize, usize, usize),
) -> Result<Vec<C::Tensor>, FamilyError> {
    let length = padding + sources.len();
    let windows = match length >= TAPS && stride > 0 {
        true => (length - TAPS) / stride + 1,
        false => 0,
    };
    let pixels = sources.first().map_or(0, |frame| compute.dims(frame).0);
    let mut stacked = Vec::with_capacity(windows);
    if compute.memory_space() == MemorySpace::Opaque {
        for _ in 0..windows {
            let mut tensor = compute.tensor(pixels, TAPS * channels)?;
            compute.write(&mut tensor, &[])?;
            stacked.push(tensor);
        }
        return Ok(stacked);
    }
    let values = sources
        .iter()
        .map(|frame| compute.read(frame))
        .collect::<Result<Vec<_>, _>>()?;
    let zeros = vec![0.0; pixels * channels];
    let stream: Vec<&[f32]> = std::iter::repeat_n(zeros.as_slice(), padding)
        .chain(values.iter().map(Vec::as_slice))
        .collect();
    let mut interleaved = vec![0.0; pixels * channels * TAPS];
    for window in stream.windows(TAPS).step_by(stride).take(windows) {
        for (pixel, row) in interleaved.chunks_exact_mut(TAPS * channels).enumerate() {
            for (tap, frame) in window.iter().enumerate() {
                let source = &frame[pixel * channels..][..channels];
                for (channel, &value) in source.iter().enumerate() {
                    row[channel * TAPS + tap] = value;
                }
            }
        }
        let mut tensor = compute.tensor(pixels, TAPS * channels)?;
        compute.write(&mut tensor, &interleaved)?;
        stacked.push(tensor);
    }
    Ok(stacked)
}
