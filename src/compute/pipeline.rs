//! The operations a prompt-to-image pipeline adds to the compute port beside the
//! transformer's: CLIP's quick GELU, T5's attention under a learned position bias,
//! and the VAE's convolutions, group norms and nearest upsampling.
//!
//! Images are channels-last tensors: an `[height·width, channels]` matrix whose row
//! `y·width + x` is pixel `(y, x)`, so a 1×1 convolution is a `linear`, the VAE's
//! attention is the encoders' attention over pixels, and a convolution's weight
//! `[out, in, kh, kw]` is the `[out, in·kh·kw]` matrix it is in the file.
//!
//! They sit behind [`super::Compute::pipeline`], so an adapter without them refuses a
//! pipeline model by name when it starts.

use super::record::{Recorder, Shape};
use super::shapes::Dims;
use super::work::{ElementOp, Kernel};
use super::{ComputeError, Weight};

/// An image's size in pixels: the rows of its channels-last tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Image {
    pub height: usize,
    pub width: usize,
}

impl Image {
    pub fn pixels(&self) -> usize {
        self.height * self.width
    }
}

/// A 2-D convolution's geometry: a square kernel, one stride, and the zero padding
/// on each side (`[top, bottom, left, right]`: the VAE encoder's downsampling pads
/// only bottom and right).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2d {
    pub input: Image,
    pub kernel: usize,
    pub stride: usize,
    pub padding: [usize; 4],
}

impl Conv2d {
    /// A `kernel`×`kernel` convolution at stride 1 that keeps the size (padding
    /// `kernel / 2` on every side).
    pub fn same(input: Image, kernel: usize) -> Self {
        let pad = kernel / 2;
        Self {
            input,
            kernel,
            stride: 1,
            padding: [pad; 4],
        }
    }

    /// The output's size.
    pub fn output(&self) -> Image {
        let [top, bottom, left, right] = self.padding;
        let span = |size: usize, before: usize, after: usize| {
            (size + before + after).saturating_sub(self.kernel) / self.stride.max(1) + 1
        };
        Image {
            height: span(self.input.height, top, bottom),
            width: span(self.input.width, left, right),
        }
    }
}

/// T5's attention: its heads, the length of each sequence and the keys each
/// sequence's queries see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BiasedAttention<'a> {
    pub heads: usize,
    pub length: usize,
    /// The first `keys[s]` keys of sequence `s` are attended to, the rest are padding
    /// (a tokenizer's attention mask, as WanPipeline passes it to umT5); empty: every
    /// key (FluxPipeline passes no mask to T5).
    pub keys: &'a [usize],
}

/// A group norm's groups and epsilon, and whether SiLU follows it (the VAE's
/// ResNet blocks and output).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupNorm {
    pub groups: usize,
    pub eps: f32,
    pub silu: bool,
}

/// Pipeline kernels of one adapter.
pub trait Pipeline {
    type Tensor;

    /// `x ← x·σ(1.702·x)`, CLIP's `quick_gelu`.
    fn quick_gelu(&self, x: &mut Self::Tensor) -> Result<(), ComputeError>;

    /// `gate ← gelu_tanh(gate)·up`: T5's gated feed-forward.
    fn gelu_tanh_mul(&self, gate: &mut Self::Tensor, up: &Self::Tensor)
        -> Result<(), ComputeError>;

    /// Attention with no mask and no scaling, each score offset by a learned bias:
    /// T5's. `q`, `k`, `v` and `out` are `[sequences·length, heads·head_dim]`;
    /// `bias` is `[length·length, heads]`, row `i·length + j` holding each head's
    /// offset for query `i` and key `j` (the gathered rows of T5's bucket table).
    fn attention_biased(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        bias: &Self::Tensor,
        shape: BiasedAttention<'_>,
        out: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;

    /// `y ← conv(x, weight) + bias`: `x` is `[pixels, in]` of `shape.input`, `weight`
    /// `[out, in·kernel²]` (the file's `[out, in, kh, kw]`), `y` `[pixels, out]` of
    /// `shape.output()`.
    fn conv2d(
        &self,
        x: &Self::Tensor,
        weight: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        shape: &Conv2d,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;

    /// GroupNorm over the pixels and the channels of each group, then `·gamma +
    /// beta` per channel, then SiLU when `norm.silu`.
    fn group_norm(
        &self,
        x: &Self::Tensor,
        gamma: &Weight<'_>,
        beta: &Weight<'_>,
        norm: GroupNorm,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;

    /// Nearest-neighbour upsampling by 2 in both directions: `x` of `input`, `y` of
    /// twice its height and width.
    fn upsample_nearest(
        &self,
        x: &Self::Tensor,
        input: Image,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
}

fn fail(what: &str, detail: String) -> ComputeError {
    ComputeError::Shape(format!("{what}: {detail}"))
}

/// Checks an attention under a bias. Returns (sequences, head_dim).
pub fn attention_biased(
    (q, k, v, out): (Dims, Dims, Dims, Dims),
    bias: Dims,
    shape: BiasedAttention<'_>,
) -> Result<(usize, usize), ComputeError> {
    let BiasedAttention {
        heads,
        length,
        keys,
    } = shape;
    let sequences = q.0 / length.max(1);
    let bad_keys = !keys.is_empty()
        && (keys.len() != sequences || keys.iter().any(|&keys| keys == 0 || keys > length));
    let bad = heads == 0
        || length == 0
        || q != k
        || q != v
        || q != out
        || q.1 % heads != 0
        || bias != (length * length, heads)
        || q.0 % length != 0
        || bad_keys;
    if bad {
        return Err(fail(
            "attention_biased",
            format!(
                "q {q:?}, k {k:?}, v {v:?}, out {out:?} as {heads} heads of sequences of {length} with a bias of {bias:?} and keys {keys:?} (each 1 to the length, one a sequence, or none)"
            ),
        ));
    }
    Ok((q.0 / length, q.1 / heads))
}

/// Checks a convolution. Returns the input channels.
pub fn conv2d(x: Dims, weight: Dims, shape: &Conv2d, y: Dims) -> Result<usize, ComputeError> {
    let taps = shape.kernel * shape.kernel;
    let input = shape.input;
    let [top, bottom, left, right] = shape.padding;
    let fits = shape.kernel > 0
        && shape.stride > 0
        && input.height + top + bottom >= shape.kernel
        && input.width + left + right >= shape.kernel;
    let output = shape.output();
    let bad = !fits
        || x.0 != input.pixels()
        || x.1 == 0
        || weight.1 != x.1 * taps
        || y != (output.pixels(), weight.0);
    if bad {
        return Err(fail(
            "conv2d",
            format!(
                "x {x:?} of a {}×{} image, weight {weight:?}, a {}×{} kernel at stride {}, y {y:?}",
                input.height, input.width, shape.kernel, shape.kernel, shape.stride
            ),
        ));
    }
    Ok(x.1)
}

/// Checks a group norm.
pub fn group_norm(x: Dims, groups: usize, gamma: usize, y: Dims) -> Result<(), ComputeError> {
    if groups == 0 || x.1 % groups != 0 || gamma != x.1 || x != y {
        return Err(fail(
            "group_norm",
            format!("x {x:?} in {groups} groups, gamma of {gamma}, y {y:?}"),
        ));
    }
    Ok(())
}

/// Checks an upsampling.
pub fn upsample_nearest(x: Dims, input: Image, y: Dims) -> Result<(), ComputeError> {
    if x.0 != input.pixels() || y != (4 * x.0, x.1) {
        return Err(fail(
            "upsample_nearest",
            format!(
                "x {x:?} of a {}×{} image into y {y:?}",
                input.height, input.width
            ),
        ));
    }
    Ok(())
}

/// The recorder counts a convolution as the product it is (im2col rows times the
/// weight), the biased attention as attention, and the rest as the element-wise
/// kernels they cost like.
impl Pipeline for Recorder {
    type Tensor = Shape;

    fn quick_gelu(&self, x: &mut Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::GeluErf, x.values())
    }

    fn gelu_tanh_mul(&self, gate: &mut Shape, _up: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::SiluMul, gate.values())
    }

    fn attention_biased(
        &self,
        q: &Shape,
        _k: &Shape,
        _v: &Shape,
        _bias: &Shape,
        shape: BiasedAttention<'_>,
        _out: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.push(Kernel::Attention {
            score_dims: q.values() * shape.length as u64,
            queries: q.rows as u64 * shape.heads as u64,
        });
        Ok(())
    }

    fn conv2d(
        &self,
        x: &Shape,
        weight: &Weight<'_>,
        _bias: Option<&Weight<'_>>,
        shape: &Conv2d,
        y: &mut Shape,
    ) -> Result<(), ComputeError> {
        conv2d(
            (x.rows, x.cols),
            (weight.rows(), weight.cols()),
            shape,
            (y.rows, y.cols),
        )?;
        self.push(Kernel::Linear {
            rows: y.rows as u64,
            inner: weight.cols() as u64,
            outer: weight.rows() as u64,
            dtype: weight.dtype(),
        });
        Ok(())
    }

    fn group_norm(
        &self,
        x: &Shape,
        _gamma: &Weight<'_>,
        _beta: &Weight<'_>,
        _norm: GroupNorm,
        _y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::LayerNorm, x.values())
    }

    fn upsample_nearest(
        &self,
        _x: &Shape,
        _input: Image,
        y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::Move, y.values())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_convolutions_output_follows_its_padding_and_stride() {
        // Proves the output size of the VAE's three convolutions: a same-size 3×3, a
        // 1×1, and the encoder's stride-2 downsampling padded bottom and right.
        let image = Image {
            height: 8,
            width: 6,
        };
        assert_eq!(Conv2d::same(image, 3).output(), image);
        assert_eq!(Conv2d::same(image, 1).output(), image);
        let down = Conv2d {
            input: image,
            kernel: 3,
            stride: 2,
            padding: [0, 1, 0, 1],
        };
        assert_eq!(
            down.output(),
            Image {
                height: 4,
                width: 3
            }
        );
        assert!(conv2d((48, 4), (5, 36), &Conv2d::same(image, 3), (48, 5)).is_ok());
        assert!(conv2d((48, 4), (5, 35), &Conv2d::same(image, 3), (48, 5)).is_err());
    }
}
