//! The CPU's pipeline kernels ([`Pipeline`]): the convolution is [`convolution`]'s;
//! the rest are loops whose every output element is computed by one thread in one
//! fixed order, so the bits do not depend on the pool's size.

use std::sync::Mutex;

use super::elementwise::{self, exp};
use super::pool::share;
use super::{attention, convolution, vector, CpuCompute, CpuTensor};
use crate::compute::pipeline::{self, BiasedAttention, Conv2d, GroupNorm, Image, Pipeline};
use crate::compute::{ComputeError, Weight};

/// Pixels whose group-norm sums one task takes: the partial sums are per chunk and
/// added in chunk order, so the bits do not depend on the thread count.
const NORM_CHUNK_PIXELS: usize = 1024;

impl Pipeline for CpuCompute {
    type Tensor = CpuTensor;

    fn quick_gelu(&self, x: &mut CpuTensor) -> Result<(), ComputeError> {
        elementwise::quick_gelu(&self.pool, &mut x.data);
        Ok(())
    }

    fn gelu_tanh_mul(&self, gate: &mut CpuTensor, up: &CpuTensor) -> Result<(), ComputeError> {
        crate::compute::shapes::same("gelu_tanh_mul", gate.dims(), up.dims())?;
        elementwise::gelu_tanh_mul(&self.pool, &mut gate.data, &up.data);
        Ok(())
    }

    fn attention_biased(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        bias: &CpuTensor,
        shape: BiasedAttention<'_>,
        out: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        let (sequences, head_dim) = pipeline::attention_biased(
            (q.dims(), k.dims(), v.dims(), out.dims()),
            bias.dims(),
            shape,
        )?;
        let BiasedAttention {
            heads,
            length,
            keys,
        } = shape;
        attention::biased(
            &self.pool,
            &self.scratch,
            (&q.data, &k.data, &v.data),
            (&bias.data, keys),
            (sequences, length, heads, head_dim),
            &mut out.data,
        );
        Ok(())
    }

    fn conv2d(
        &self,
        x: &CpuTensor,
        weight: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        shape: &Conv2d,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        convolution::conv2d(self, x, weight, bias, shape, y)
    }

    fn group_norm(
        &self,
        x: &CpuTensor,
        gamma: &Weight<'_>,
        beta: &Weight<'_>,
        norm: GroupNorm,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        let GroupNorm { groups, eps, silu } = norm;
        pipeline::group_norm(x.dims(), groups, gamma.cols() * gamma.rows(), y.dims())?;
        let channels = x.cols;
        let mut cast = self.cast.borrow_mut();
        let mut small = self.cast_small.borrow_mut();
        let gamma = vector("group_norm gamma", gamma, channels, &mut cast)?;
        let beta = vector("group_norm beta", beta, channels, &mut small)?;
        let (means, inverses) = self.group_moments(x, groups, eps);
        let per_group = channels / groups;
        // Per channel: y = x·a + b.
        let scales: Vec<f32> = (0..channels)
            .map(|c| inverses[c / per_group] * gamma[c])
            .collect();
        let shifts: Vec<f32> = (0..channels)
            .map(|c| beta[c] - means[c / per_group] * inverses[c / per_group] * gamma[c])
            .collect();
        let source = &x.data;
        self.pool.split(&mut y.data, channels, &|part, start| {
            let input = &source[start..][..part.len()];
            for (row_out, row_in) in part
                .chunks_exact_mut(channels)
                .zip(input.chunks_exact(channels))
            {
                for (((out, &value), &scale), &shift) in
                    row_out.iter_mut().zip(row_in).zip(&scales).zip(&shifts)
                {
                    let normed = value * scale + shift;
                    *out = if silu {
                        normed / (1.0 + exp(-normed))
                    } else {
                        normed
                    };
                }
            }
        });
        Ok(())
    }

    fn upsample_nearest(
        &self,
        x: &CpuTensor,
        input: Image,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        pipeline::upsample_nearest(x.dims(), input, y.dims())?;
        let channels = x.cols;
        let wide = 2 * input.width;
        let source = &x.data;
        // Each output row of pixels is a part: it reads one input row.
        self.pool
            .split(&mut y.data, wide * channels, &|part, start| {
                let first_row = start / (wide * channels);
                for (offset, row) in part.chunks_exact_mut(wide * channels).enumerate() {
                    let input_row = (first_row + offset) / 2;
                    for (column, pixel) in row.chunks_exact_mut(channels).enumerate() {
                        let from = (input_row * input.width + column / 2) * channels;
                        pixel.copy_from_slice(&source[from..][..channels]);
                    }
                }
            });
        Ok(())
    }
}

impl CpuCompute {
    /// Each group's mean and 1/√(var + eps), over fixed chunks of pixels in f64, the
    /// chunks added in order.
    fn group_moments(&self, x: &CpuTensor, groups: usize, eps: f32) -> (Vec<f32>, Vec<f32>) {
        let channels = x.cols;
        let per_group = channels / groups;
        let chunks = x.rows.div_ceil(NORM_CHUNK_PIXELS).max(1);
        let threads = self.pool.threads().min(chunks).max(1);
        let partials: Mutex<Vec<(usize, Vec<f64>)>> = Mutex::new(Vec::with_capacity(chunks));
        self.pool.run(&|index| {
            if index >= threads {
                return;
            }
            let (first, end) = share(chunks, threads, index, 1);
            for chunk in first..end {
                let mut sums = vec![0.0f64; 2 * groups];
                let rows = chunk * NORM_CHUNK_PIXELS..((chunk + 1) * NORM_CHUNK_PIXELS).min(x.rows);
                for row in x.data[rows.start * channels..rows.end * channels].chunks_exact(channels)
                {
                    for (group, values) in row.chunks_exact(per_group).enumerate() {
                        let (sum, squares) = values.iter().fold((0.0f64, 0.0f64), |(s, q), &v| {
                            let v = f64::from(v);
                            (s + v, q + v * v)
                        });
                        sums[2 * group] += sum;
                        sums[2 * group + 1] += squares;
                    }
                }
                partials
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .push((chunk, sums));
            }
        });
        let mut partials = partials
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        partials.sort_by_key(|(chunk, _)| *chunk);
        let mut totals = vec![0.0f64; 2 * groups];
        for (_, sums) in &partials {
            for (total, value) in totals.iter_mut().zip(sums) {
                *total += value;
            }
        }
        let count = (x.rows * per_group) as f64;
        let mut means = Vec::with_capacity(groups);
        let mut inverses = Vec::with_capacity(groups);
        for group in 0..groups {
            let mean = totals[2 * group] / count;
            let variance = (totals[2 * group + 1] / count - mean * mean).max(0.0);
            means.push(mean as f32);
            inverses.push((1.0 / (variance + f64::from(eps)).sqrt()) as f32);
        }
        (means, inverses)
    }
}
