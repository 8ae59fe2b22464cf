//! The CPU's 2-D convolution: im2col in bands of [`BAND_PIXELS`] output pixels, each
//! band's product on one thread against the whole weight.
//!
//! A convolution has many pixels and few output channels (128–512): the linear
//! layer's split — output columns in blocks over the threads — would hand `gemm`
//! blocks of 16–64 channels and run its narrow microkernels. Here the threads split
//! the pixels instead: the weight is widened once per call into one panel per slice
//! of its inner dimension (as the linear layer slices it, at most 768 values, so
//! `gemm` reads contiguous operands), and each thread writes its bands' im2col rows
//! straight into that slice-major layout and multiplies them by every panel. The
//! bands, the slices and the order of their sums are fixed by the shape, so the bits
//! do not depend on the number of threads.

use super::gemm::{self, add_to_rows, to_bf16};
use super::pool::{share, SharedOut};
use super::{vector, weight_bytes, weight_scale, CpuCompute, CpuTensor};
use crate::compute::pipeline::{self, Conv2d, Image};
use crate::compute::{ComputeDtype, ComputeError, DType, Weight};

/// Output pixels of one band: a `gemm` call of a few hundred columns, and an im2col
/// buffer of `512 × in·k²` values per thread (9 MiB for a 3×3 over 512 channels).
const BAND_PIXELS: usize = 512;

/// `y ← conv(x, weight) + bias`, see [`pipeline::Pipeline::conv2d`].
pub(super) fn conv2d(
    compute: &CpuCompute,
    x: &CpuTensor,
    weight: &Weight<'_>,
    bias: Option<&Weight<'_>>,
    shape: &Conv2d,
    y: &mut CpuTensor,
) -> Result<(), ComputeError> {
    let channels = pipeline::conv2d(x.dims(), (weight.rows(), weight.cols()), shape, y.dims())?;
    if weight.dtype() == DType::U4 {
        return Err(ComputeError::Shape(
            "a convolution of a 4-bit group-quantized (awq_w4a16) weight is not implemented; dequantize the checkpoint".into(),
        ));
    }
    let (out, inner) = (weight.rows(), weight.cols());
    let bf16 = compute.compute_dtype == ComputeDtype::Bf16;
    let slices: Vec<(usize, usize)> = gemm::slices(inner).collect();
    let mut cast = compute.cast.borrow_mut();
    widen_into(weight, &slices, bf16, &mut cast);
    let panels = &cast[..out * inner];
    let mut small = compute.cast_small.borrow_mut();
    let bias = match bias {
        Some(bias) => Some(vector("conv2d bias", bias, out, &mut small)?),
        None => None,
    };
    let scale = weight_scale(weight).unwrap_or(1.0);
    let output = shape.output();
    let pixels = output.pixels();
    let bands = pixels.div_ceil(BAND_PIXELS);
    let threads = compute.pool.threads().min(bands).max(1);
    let scratches = &compute.scratch;
    let destination = SharedOut::new(&mut y.data);
    let geometry = Geometry {
        image: &x.data,
        channels,
        shape,
        output,
        slices: &slices,
    };
    compute.pool.run(&|index| {
        if index >= threads {
            return;
        }
        let (first_band, end_band) = share(bands, threads, index, 1);
        // This thread's scratch (kept between calls): a band, then one im2col row.
        let mut scratch = scratches[index]
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let needed = scratch.len().max((BAND_PIXELS + 1) * inner);
        scratch.resize(needed, 0.0);
        let (columns, row) = scratch.split_at_mut(BAND_PIXELS * inner);
        let row = &mut row[..inner];
        for band in first_band..end_band {
            let first = band * BAND_PIXELS;
            let count = BAND_PIXELS.min(pixels - first);
            let buffer = &mut columns[..count * inner];
            geometry.im2col(first, count, row, buffer);
            if bf16 {
                buffer.iter_mut().for_each(|value| *value = to_bf16(*value));
            }
            // SAFETY: band `band` owns output rows `first .. first + count`, and each
            // band is run by exactly one thread; `y` outlives the job.
            let rows = unsafe { destination.pointer().add(first * out) };
            // SAFETY: as above; the band's rows are this thread's.
            unsafe { band_product(rows, (out, count, scale), &slices, panels, buffer) };
            if let Some(bias) = bias {
                // SAFETY: this band's rows, written by this thread only.
                unsafe { add_to_rows(bias, rows, count, out) };
            }
        }
    });
    Ok(())
}

/// `rows ← Σ over slices of band·panelᵀ·scale`: the band's im2col slices
/// (`[count, length]` each, slice-major) against the weight's slice panels.
///
/// # Safety
/// `rows` is the band's `[count, out]` output with row stride `out`, written by this
/// thread only; the panels are `[out, length]` and the band's slices `[count, length]`.
unsafe fn band_product(
    rows: *mut f32,
    (out, count, scale): (usize, usize, f32),
    slices: &[(usize, usize)],
    panels: &[f32],
    band: &[f32],
) {
    for &(start, length) in slices {
        let panel = &panels[start * out..(start + length) * out];
        let slice = &band[start * count..(start + length) * count];
        // SAFETY: the caller's contract: dst `[out, count]` read transposed from the
        // rows, the panel and the slice contiguous; dst aliases neither.
        unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                out,
                count,
                length,
                rows,
                out as isize,
                1,
                start > 0,
                panel.as_ptr(),
                1,
                length as isize,
                slice.as_ptr(),
                length as isize,
                1,
                1.0,
                scale,
                false,
                false,
                false,
                gemm_common::Parallelism::None,
            );
        }
    }
}

/// The weight `[out, inner]` widened to f32 into `panels`, slice-major: slice
/// `(start, length)` is the `[out, length]` panel at `start·out` (rounded to bf16
/// under `compute_dtype = bf16`).
fn widen_into(weight: &Weight<'_>, slices: &[(usize, usize)], bf16: bool, panels: &mut Vec<f32>) {
    let (out, inner) = (weight.rows(), weight.cols());
    let dtype = weight.dtype();
    let element = dtype.size_bytes();
    let stored = weight_bytes(weight);
    panels.clear();
    panels.resize(out * inner, 0.0);
    for &(first, length) in slices {
        let panel = &mut panels[first * out..(first + length) * out];
        for (feature, target) in panel.chunks_exact_mut(length).enumerate() {
            let start = (feature * inner + first) * element;
            gemm::widen(dtype, &stored[start..start + length * element], target);
        }
    }
    if bf16 && matches!(dtype, DType::F32 | DType::F16) {
        panels.iter_mut().for_each(|value| *value = to_bf16(*value));
    }
}

/// What a band's im2col rows are made from.
struct Geometry<'a> {
    image: &'a [f32],
    channels: usize,
    shape: &'a Conv2d,
    output: Image,
    slices: &'a [(usize, usize)],
}

impl Geometry<'_> {
    /// The im2col rows of output pixels `first .. first + count`, slice-major: slice
    /// `(start, length)` is `[count, length]` at `start·count`. Column `c·k² + tap` is
    /// channel `c` at tap `(ky, kx)`, the order of the weight's `[out, in, kh, kw]`;
    /// outside the image, 0. Each pixel's row is written in column order into `row`,
    /// then cut into its slices.
    fn im2col(&self, first: usize, count: usize, row: &mut [f32], buffer: &mut [f32]) {
        let shape = self.shape;
        let (kernel, channels, input) = (shape.kernel, self.channels, shape.input);
        let taps = kernel * kernel;
        let (top, left) = (shape.padding[0], shape.padding[2]);
        let mut sources: Vec<Option<usize>> = vec![None; taps];
        for offset in 0..count {
            let pixel = first + offset;
            let (out_y, out_x) = (pixel / self.output.width, pixel % self.output.width);
            for (tap, source) in sources.iter_mut().enumerate() {
                let (ky, kx) = (tap / kernel, tap % kernel);
                let in_y = (out_y * shape.stride + ky)
                    .checked_sub(top)
                    .filter(|&y| y < input.height);
                let in_x = (out_x * shape.stride + kx)
                    .checked_sub(left)
                    .filter(|&x| x < input.width);
                *source = in_y
                    .zip(in_x)
                    .map(|(y, x)| (y * input.width + x) * channels);
            }
            for (channel, columns) in row.chunks_exact_mut(taps).enumerate() {
                for (value, source) in columns.iter_mut().zip(&sources) {
                    *value = source.map_or(0.0, |at| self.image[at + channel]);
                }
            }
            for &(start, length) in self.slices {
                buffer[start * count + offset * length..][..length]
                    .copy_from_slice(&row[start..start + length]);
            }
        }
    }
}
