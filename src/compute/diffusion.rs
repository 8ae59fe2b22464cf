//! The operations diffusion transformers (Flux) add to the compute port: adaLN
//! modulation, gated residuals, the tanh GELU, SiLU, rotary embedding on interleaved
//! pairs, and writing a tensor into columns of a wider one (the single-stream block's
//! concatenation).
//!
//! They sit behind [`super::Compute::diffusion`], so an adapter that has not written
//! these kernels (the CUDA adapter, for now) refuses a diffusion model by name when it
//! starts, instead of every adapter carrying stubs. The modulation vectors (`shift`,
//! `scale`, `gate`) are `[1, cols]` tensors broadcast over the rows.

use super::record::{Recorder, Shape};
use super::shapes::Dims;
use super::work::ElementOp;
use super::ComputeError;

/// Diffusion-transformer kernels of one adapter.
pub trait Diffusion {
    type Tensor;

    /// `y ← LayerNorm(x)·(1 + scale) + shift` per row, LayerNorm without affine
    /// weights (`(x − mean)/√(var + eps)`); `shift` and `scale` are `[1, cols]`.
    fn adaptive_norm(
        &self,
        x: &Self::Tensor,
        shift: &Self::Tensor,
        scale: &Self::Tensor,
        eps: f32,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `x ← x + gate·y` per row; `gate` is `[1, cols]`.
    fn add_gated(
        &self,
        x: &mut Self::Tensor,
        y: &Self::Tensor,
        gate: &Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `x ← x·σ(x)`.
    fn silu(&self, x: &mut Self::Tensor) -> Result<(), ComputeError>;
    /// `x ← ½x(1 + tanh(√(2/π)(x + 0.044715x³)))`, PyTorch's `gelu(approximate="tanh")`.
    fn gelu_tanh(&self, x: &mut Self::Tensor) -> Result<(), ComputeError>;
    /// Rotary embedding on interleaved pairs (Flux): in each head of row `r`, the pair
    /// `(2i, 2i + 1)` turns by the angle whose cosine and sine are `table[r][2i]` and
    /// `table[r][2i + 1]` (`table` is `[rows, head_dim]`).
    fn rope_pairs(
        &self,
        x: &mut Self::Tensor,
        heads: usize,
        table: &Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `to[.., at .. at + from.cols] ← from` (same rows).
    fn write_cols(
        &self,
        to: &mut Self::Tensor,
        at: usize,
        from: &Self::Tensor,
    ) -> Result<(), ComputeError>;
}

fn fail(what: &str, detail: String) -> Result<(), ComputeError> {
    Err(ComputeError::Shape(format!("{what}: {detail}")))
}

/// A `[1, cols]` modulation vector for `x`.
pub fn modulation(what: &str, x: Dims, vector: Dims) -> Result<(), ComputeError> {
    if vector != (1, x.1) {
        return fail(
            what,
            format!(
                "a [{}, {}] vector for [{}, {}]",
                vector.0, vector.1, x.0, x.1
            ),
        );
    }
    Ok(())
}

/// `x` as `heads` heads with a `[rows, head_dim]` cos/sin table. Returns `head_dim`.
pub fn rope_pairs(x: Dims, heads: usize, table: Dims) -> Result<usize, ComputeError> {
    if heads == 0 || table.0 != x.0 || table.1 * heads != x.1 || table.1 % 2 != 0 {
        fail(
            "rope_pairs",
            format!(
                "[{}, {}] as {heads} heads with a [{}, {}] table",
                x.0, x.1, table.0, table.1
            ),
        )?;
    }
    Ok(table.1)
}

pub fn write_cols(to: Dims, at: usize, from: Dims) -> Result<(), ComputeError> {
    if to.0 != from.0 || at.checked_add(from.1).is_none_or(|end| end > to.1) {
        return fail(
            "write_cols",
            format!(
                "[{}, {}] at column {at} of [{}, {}]",
                from.0, from.1, to.0, to.1
            ),
        );
    }
    Ok(())
}

/// The recorder counts these as the element-wise kernels they cost like, so a
/// calibrated profile times them without new entries.
impl Diffusion for Recorder {
    type Tensor = Shape;

    fn adaptive_norm(
        &self,
        x: &Shape,
        _shift: &Shape,
        _scale: &Shape,
        _eps: f32,
        _y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::LayerNorm, x.values())
    }

    fn add_gated(&self, x: &mut Shape, _y: &Shape, _gate: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Add, x.values())
    }

    fn silu(&self, x: &mut Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::SiluMul, x.values())
    }

    fn gelu_tanh(&self, x: &mut Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::GeluErf, x.values())
    }

    fn rope_pairs(&self, x: &mut Shape, _heads: usize, _table: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Rope, x.values())
    }

    fn write_cols(&self, _to: &mut Shape, _at: usize, from: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Move, from.values())
    }
}
