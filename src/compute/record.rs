//! A compute adapter that computes nothing and records each call as the [`Kernel`]
//! it is: a family's own step, run over it, lists the kernels the step calls, block
//! by block, with their real shapes. The simulator describes a family this way
//! (`crate::simulate`), so a prediction and a run are about the same work by
//! construction — there is no second, hand-written list of what a family calls.
//!
//! Tensors are shapes only. [`Recorder::read`] returns seeded pseudo-random values,
//! so what a family decides from its activations (a router's top-k, a sampled
//! token) spreads as it does on real data rather than collapsing onto ties.

use std::cell::{Cell, RefCell};

use stagehand_actors::{DevicePtr, MemorySpace};

use super::work::{ElementOp, Kernel};
use super::{Attention, BlockView, CachedAttention, Compute, ComputeError, LowRank, Weight};

/// Records the kernels of the calls made on it.
#[derive(Debug, Default)]
pub struct Recorder {
    kernels: RefCell<Vec<Kernel>>,
    /// State of the values [`Recorder::read`] makes up.
    random: Cell<u64>,
}

/// A tensor of the recorder: its shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub rows: usize,
    pub cols: usize,
}

impl Shape {
    pub(super) fn values(&self) -> u64 {
        (self.rows * self.cols) as u64
    }
}

/// A block the recorder "loaded": its length.
#[derive(Debug, Clone, Copy)]
pub struct RecordedBlock {
    pub bytes: u64,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            kernels: RefCell::new(Vec::new()),
            random: Cell::new(0x005e_ed0f_5eed),
        }
    }

    /// Kernels recorded so far.
    pub fn len(&self) -> usize {
        self.kernels.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kernels recorded from position `from` on.
    pub fn since(&self, from: usize) -> Vec<Kernel> {
        self.kernels.borrow().get(from..).unwrap_or(&[]).to_vec()
    }

    pub(super) fn push(&self, kernel: Kernel) {
        self.kernels.borrow_mut().push(kernel);
    }

    pub(super) fn element(&self, op: ElementOp, elements: u64) -> Result<(), ComputeError> {
        self.push(Kernel::Elementwise { op, elements });
        Ok(())
    }

    /// A value in [-1, 1), from a SplitMix64 sequence.
    fn next_value(&self) -> f32 {
        let state = self.random.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        self.random.set(state);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let unit = ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32;
        unit * 2.0 - 1.0
    }
}

impl Compute for Recorder {
    type Tensor = Shape;
    type Fence = ();
    type Block = RecordedBlock;

    fn name(&self) -> String {
        "record".to_string()
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Opaque
    }

    fn tensor(&self, rows: usize, cols: usize) -> Result<Shape, ComputeError> {
        Ok(Shape { rows, cols })
    }

    fn dims(&self, tensor: &Shape) -> (usize, usize) {
        (tensor.rows, tensor.cols)
    }

    fn write(&self, tensor: &mut Shape, _values: &[f32]) -> Result<(), ComputeError> {
        self.element(ElementOp::Move, tensor.values())
    }

    fn read(&self, tensor: &Shape) -> Result<Vec<f32>, ComputeError> {
        self.element(ElementOp::Move, tensor.values())?;
        Ok((0..tensor.values()).map(|_| self.next_value()).collect())
    }

    fn copy(&self, from: &Shape, _to: &mut Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Move, from.values())
    }

    fn load_block(&self, bytes: &[u8]) -> Result<RecordedBlock, ComputeError> {
        Ok(RecordedBlock {
            bytes: bytes.len() as u64,
        })
    }

    fn block_view<'a>(&self, block: &'a RecordedBlock) -> BlockView<'a> {
        // SAFETY: the recorder never reads through a view's address (its memory space
        // is opaque); the view only carries the block's length for bounds checks.
        unsafe { BlockView::new(DevicePtr(0), block.bytes) }
    }

    fn linear(
        &self,
        x: &Shape,
        weight: &Weight<'_>,
        _bias: Option<&Weight<'_>>,
        _y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.push(Kernel::Linear {
            rows: x.rows as u64,
            inner: weight.cols() as u64,
            outer: weight.rows() as u64,
            dtype: weight.dtype(),
        });
        Ok(())
    }

    fn low_rank_add(
        &self,
        x: &Shape,
        factors: &LowRank<'_>,
        _scale: f32,
        _scratch: &mut Shape,
        _y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.push(Kernel::LowRank {
            rows: x.rows as u64,
            inner: factors.in_features() as u64,
            rank: factors.rank() as u64,
            outer: factors.out_features() as u64,
        });
        Ok(())
    }

    fn merge_low_rank(
        &self,
        weight: &Weight<'_>,
        _factors: &LowRank<'_>,
        _scale: f32,
    ) -> Result<(), ComputeError> {
        self.push(Kernel::Other {
            elements: weight.elements() as u64,
        });
        Ok(())
    }

    fn add(&self, x: &mut Shape, _y: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Add, x.values())
    }

    fn add_scaled_rows(
        &self,
        acc: &mut Shape,
        _y: &Shape,
        _scales: &[f32],
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::Add, acc.values())
    }

    fn gather_add(
        &self,
        table: &Weight<'_>,
        rows: &[u32],
        _out: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::Gather, (rows.len() * table.cols()) as u64)
    }

    fn layer_norm(
        &self,
        x: &Shape,
        _gamma: &Weight<'_>,
        _beta: &Weight<'_>,
        _eps: f32,
        _y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::LayerNorm, x.values())
    }

    fn rms_norm(
        &self,
        x: &Shape,
        _gamma: Option<&Weight<'_>>,
        _eps: f32,
        _y: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::RmsNorm, x.values())
    }

    fn rms_norm_heads(
        &self,
        x: &mut Shape,
        _heads: usize,
        _gamma: &Weight<'_>,
        _eps: f32,
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::RmsNorm, x.values())
    }

    fn gelu_erf(&self, x: &mut Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::GeluErf, x.values())
    }

    fn attention(
        &self,
        _q: &Shape,
        _k: &Shape,
        _v: &Shape,
        shape: &Attention<'_>,
        _out: &mut Shape,
    ) -> Result<(), ComputeError> {
        let length = shape.sequence_length as u64;
        let queries = shape.sequences as u64 * shape.heads as u64 * length;
        self.push(Kernel::Attention {
            score_dims: queries * shape.head_dim as u64 * length,
            queries,
        });
        Ok(())
    }

    fn silu_mul(&self, gate: &mut Shape, _up: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::SiluMul, gate.values())
    }

    fn rope(
        &self,
        x: &mut Shape,
        _heads: usize,
        _head_dim: usize,
        _positions: &[u32],
        _inv_freq: &[f32],
    ) -> Result<(), ComputeError> {
        self.element(ElementOp::Rope, x.values())
    }

    fn resize_rows(&self, tensor: &mut Shape, rows: usize) -> Result<(), ComputeError> {
        let kept = tensor.rows.min(rows);
        tensor.rows = rows;
        self.element(ElementOp::Move, (kept * tensor.cols) as u64)
    }

    fn slice_rows(&self, _from: &Shape, _first: usize, to: &mut Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Move, to.values())
    }

    fn write_rows(&self, _cache: &mut Shape, _at: usize, rows: &Shape) -> Result<(), ComputeError> {
        self.element(ElementOp::Move, rows.values())
    }

    fn attention_cached(
        &self,
        _q: &Shape,
        _k_cache: &Shape,
        _v_cache: &Shape,
        shape: &CachedAttention,
        _out: &mut Shape,
    ) -> Result<(), ComputeError> {
        self.push(Kernel::CachedAttention {
            score_dims: (shape.heads * shape.head_dim) as u64
                * shape.queries as u64
                * (shape.past + shape.queries) as u64,
        });
        Ok(())
    }

    fn pipeline(&self) -> Result<&dyn super::Pipeline<Tensor = Shape>, ComputeError> {
        Ok(self)
    }

    fn diffusion(&self) -> Result<&dyn super::Diffusion<Tensor = Shape>, ComputeError> {
        Ok(self)
    }

    fn checksum(&self, block: &BlockView<'_>) -> Result<u64, ComputeError> {
        self.element(ElementOp::Checksum, block.bytes())?;
        Ok(0)
    }

    fn fence(&self) -> Result<(), ComputeError> {
        Ok(())
    }

    fn is_done(&self, _fence: &()) -> Result<bool, ComputeError> {
        Ok(true)
    }

    fn wait(&self, _fence: ()) -> Result<(), ComputeError> {
        Ok(())
    }
}
