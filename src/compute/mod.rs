//! The compute port (DESIGN §6): the operations a model family's forward pass needs,
//! against weights that sit in the device tier in their storage dtype.
//!
//! A model family is written once against [`Compute`]; the adapters implement it —
//! `crate::device::cpu_compute` with `matrixmultiply` and plain loops, and the CUDA
//! adapter with cuBLAS and NVRTC kernels. A family never names an adapter and an
//! adapter never imports a family or the run loop.
//!
//! Activations are [`Compute::Tensor`]s: row-major f32 matrices owned by the adapter
//! (host vectors on the CPU, device buffers on CUDA). Weights are [`Weight`] views into
//! a block the caller holds — a session handle or a block loaded for the reference —
//! and the view's lifetime is that hold, so a kernel can never read a block after it
//! was released. Every operation casts its weights to f32 in the adapter's cast buffer
//! just before use, so the bytes on every link stay the file's.
//!
//! Operations are queued in order on one compute stream. [`Compute::fence`] marks the
//! point reached; a held block may be released once the fence after its last use is
//! done (always at once on the CPU, when the event completes on CUDA).

pub mod checksum;
pub mod diffusion;
mod dtype;
mod fp8;
pub mod pipeline;
pub mod quant;
pub mod record;
pub mod shapes;
mod shared_bytes;
mod view;
pub mod work;

pub use diffusion::Diffusion;
pub use dtype::{ComputeDtype, DType};
pub use pipeline::Pipeline;
pub use shared_bytes::SharedBytes;
pub use view::{BlockView, LowRank, TensorSlot, Weight};

/// What an operation could not do.
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// Shapes that do not fit together: a bug in a family or a malformed model.
    #[error("{0}")]
    Shape(String),
    /// Activations or scratch that do not fit in memory.
    #[error("{0}")]
    OutOfMemory(String),
    /// The device failed (driver error, lost device).
    #[error("{0}")]
    Device(String),
}

/// The mask of an attention: which keys each query may see.
#[derive(Debug, Clone, Copy)]
pub enum Mask<'a> {
    /// Encoders: sequence `s` has `lengths[s]` real tokens at its start; the padding
    /// after them is never attended to.
    Padding(&'a [usize]),
    /// Decoders: query `i` sees keys `0..=i` of its own sequence.
    Causal,
}

/// Multi-head (and grouped-query) attention over `sequences` sequences of
/// `sequence_length` rows each: `q` is `[sequences·sequence_length, heads·head_dim]`,
/// `k` and `v` are `[…, kv_heads·head_dim]`, the output is shaped like `q`.
#[derive(Debug, Clone, Copy)]
pub struct Attention<'a> {
    pub sequences: usize,
    pub sequence_length: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Applied to `q·kᵀ` before the softmax, usually `1/√head_dim`.
    pub scale: f32,
    pub mask: Mask<'a>,
}

/// Causal attention of a decoder step over its KV cache: `queries` new rows (at
/// positions `past .. past + queries` of one sequence) attend to the first
/// `past + queries` rows of the caches; query `i` sees keys `0 ..= past + i`.
#[derive(Debug, Clone, Copy)]
pub struct CachedAttention {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub past: usize,
    pub queries: usize,
}

/// The operations a forward pass is made of. Implemented by each device adapter.
pub trait Compute {
    /// A row-major f32 matrix on the compute device.
    type Tensor;
    /// A point in the compute stream (see the module docs).
    type Fence;
    /// Device memory the adapter owns, holding one block's bytes: the weights of a
    /// fully-resident reference pass, loaded straight from the file.
    type Block;

    /// Short adapter name for summaries: "cpu", "cuda:0".
    fn name(&self) -> String;

    /// The address space this adapter's kernels read weights from: only blocks of a
    /// session on a device of the same space may be viewed.
    fn memory_space(&self) -> stagehand_actors::MemorySpace;

    /// A `rows × cols` tensor of zeros. Fails cleanly when it does not fit.
    fn tensor(&self, rows: usize, cols: usize) -> Result<Self::Tensor, ComputeError>;
    /// `(rows, cols)` of a tensor.
    fn dims(&self, tensor: &Self::Tensor) -> (usize, usize);
    /// Overwrites a tensor with host values (`rows × cols` of them).
    fn write(&self, tensor: &mut Self::Tensor, values: &[f32]) -> Result<(), ComputeError>;
    /// The tensor's values, after every queued operation has run.
    fn read(&self, tensor: &Self::Tensor) -> Result<Vec<f32>, ComputeError>;
    /// `to ← from` (same shape).
    fn copy(&self, from: &Self::Tensor, to: &mut Self::Tensor) -> Result<(), ComputeError>;

    /// Copies one block's bytes into memory the adapter owns (the reference path).
    fn load_block(&self, bytes: &[u8]) -> Result<Self::Block, ComputeError>;
    /// A block of `length` bytes in memory the adapter owns, written by `fill` (the
    /// reference path: a read from the files). By default `fill` writes `scratch`,
    /// which [`Self::load_block`] copies; an adapter whose memory is the host's lets
    /// `fill` write the block itself, one pass over its bytes fewer.
    fn load_block_with<E: From<ComputeError>>(
        &self,
        length: usize,
        scratch: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Self::Block, E> {
        scratch.resize(length, 0);
        fill(scratch)?;
        Ok(self.load_block(scratch)?)
    }
    /// A block over `bytes`, host memory that stays unchanged while it is shared (a
    /// model file's cached pages, mapped: the reference path). An adapter whose memory
    /// is the host's computes from them where they are; by default they are copied in
    /// with [`Self::load_block`]. Never patched in place: a block a LoRA is merged into
    /// is loaded ([`Self::load_block_with`]), the mapping is read-only.
    fn share_block(&self, bytes: SharedBytes) -> Result<Self::Block, ComputeError> {
        self.load_block(bytes.as_slice())
    }
    /// A view of a loaded block, valid while the block is borrowed.
    fn block_view<'a>(&self, block: &'a Self::Block) -> BlockView<'a>;

    /// `y ← x·Wᵀ (+ bias)`: `x` is `[rows, in]`, `weight` `[out, in]`, `y` `[rows, out]`.
    fn linear(
        &self,
        x: &Self::Tensor,
        weight: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `y ← y + scale·(x·Aᵀ)·Bᵀ`: a LoRA on a streamed weight. `scratch` is
    /// `[rows, rank]`.
    fn low_rank_add(
        &self,
        x: &Self::Tensor,
        factors: &LowRank<'_>,
        scale: f32,
        scratch: &mut Self::Tensor,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `W ← W + scale·B·A` in place, rounded to `W`'s storage dtype: a LoRA baked into
    /// a resident weight. The caller holds the block alone while it does this.
    fn merge_low_rank(
        &self,
        weight: &Weight<'_>,
        factors: &LowRank<'_>,
        scale: f32,
    ) -> Result<(), ComputeError>;

    /// `x ← x + y` (same shape).
    fn add(&self, x: &mut Self::Tensor, y: &Self::Tensor) -> Result<(), ComputeError>;
    /// `acc[r] ← acc[r] + scales[r]·y[r]` row by row (MoE expert mixing).
    fn add_scaled_rows(
        &self,
        acc: &mut Self::Tensor,
        y: &Self::Tensor,
        scales: &[f32],
    ) -> Result<(), ComputeError>;
    /// `out[r] ← out[r] + table[rows[r]]`: an embedding lookup (`table` is
    /// `[entries, cols]`).
    fn gather_add(
        &self,
        table: &Weight<'_>,
        rows: &[u32],
        out: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `y ← (x − mean)/√(var + eps)·gamma + beta` per row.
    fn layer_norm(
        &self,
        x: &Self::Tensor,
        gamma: &Weight<'_>,
        beta: &Weight<'_>,
        eps: f32,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `y ← x/√(mean(x²) + eps)·gamma` per row (`gamma` absent: 1).
    fn rms_norm(
        &self,
        x: &Self::Tensor,
        gamma: Option<&Weight<'_>>,
        eps: f32,
        y: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// RMSNorm of each head in place: every row of `x` (`[rows, heads·head_dim]`) is
    /// `heads` slices of `head_dim` values, and each slice `v` becomes
    /// `v/√(mean(v²) + eps)·gamma` (`gamma` is `[head_dim]`): Qwen3's `q_norm` and
    /// `k_norm`.
    fn rms_norm_heads(
        &self,
        x: &mut Self::Tensor,
        heads: usize,
        gamma: &Weight<'_>,
        eps: f32,
    ) -> Result<(), ComputeError>;
    /// `x ← x·Φ(x)` with the exact (erf) Gaussian CDF.
    fn gelu_erf(&self, x: &mut Self::Tensor) -> Result<(), ComputeError>;
    /// Softmax attention, see [`Attention`].
    fn attention(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        v: &Self::Tensor,
        shape: &Attention<'_>,
        out: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// `gate ← silu(gate)·up` (SwiGLU), elementwise.
    fn silu_mul(&self, gate: &mut Self::Tensor, up: &Self::Tensor) -> Result<(), ComputeError>;
    /// Rotary position embedding of `x` (`[rows, heads·head_dim]`) in place, Llama's
    /// rotate-half layout: in each head, the pair `(i, i + head_dim/2)` of row `r`
    /// turns by `positions[r] · inv_freq[i]`.
    fn rope(
        &self,
        x: &mut Self::Tensor,
        heads: usize,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
    ) -> Result<(), ComputeError>;
    /// Grows (or shrinks) a tensor to `rows` rows, keeping the first rows' values.
    fn resize_rows(&self, tensor: &mut Self::Tensor, rows: usize) -> Result<(), ComputeError>;
    /// `to ← from[first .. first + to.rows]` (same columns).
    fn slice_rows(
        &self,
        from: &Self::Tensor,
        first: usize,
        to: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// Copies every row of `rows` into `cache` from row `at` on.
    fn write_rows(
        &self,
        cache: &mut Self::Tensor,
        at: usize,
        rows: &Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// Causal attention over a KV cache, see [`CachedAttention`]; `q` and `out` are
    /// `[queries, heads·head_dim]`, the caches `[≥ past + queries, kv_heads·head_dim]`.
    fn attention_cached(
        &self,
        q: &Self::Tensor,
        k_cache: &Self::Tensor,
        v_cache: &Self::Tensor,
        shape: &CachedAttention,
        out: &mut Self::Tensor,
    ) -> Result<(), ComputeError>;
    /// The most rows a product (`linear`) takes while still computing each row in the
    /// order it would alone: up to this many decode rows of different sequences can
    /// share one product and each keep its own bits (continuous batching). 1 when the
    /// adapter promises nothing of the kind.
    fn stackable_rows(&self) -> usize {
        1
    }

    /// Pushes a block's bytes out of the caches this adapter's kernels read through,
    /// so the next call reads the weight from memory as a run does (a block copied in
    /// with non-temporal stores, or last used a step ago): for calibration, never on
    /// a run's path. Default: nothing (a GPU's caches hold little of a block).
    fn flush_from_caches(&self, _block: &BlockView<'_>) {}

    /// A checksum of a block's bytes in the device tier (`stream-verify`), equal to
    /// `crate::families::stream_verify::checksum` of the same bytes.
    fn checksum(&self, block: &BlockView<'_>) -> Result<u64, ComputeError>;

    /// The diffusion-transformer kernels ([`Diffusion`]), or the error naming the
    /// adapter that has none: a Flux model is refused when it starts, not midway.
    fn diffusion(&self) -> Result<&dyn Diffusion<Tensor = Self::Tensor>, ComputeError> {
        Err(ComputeError::Device(format!(
            "the {} adapter has no diffusion-transformer kernels (adaptive LayerNorm, gated add, GELU-tanh, interleaved rope); run Flux with --device cpu",
            self.name()
        )))
    }

    /// The pipeline kernels ([`Pipeline`]: text encoders and the VAE), or the error
    /// naming the adapter that has none.
    fn pipeline(&self) -> Result<&dyn Pipeline<Tensor = Self::Tensor>, ComputeError> {
        Err(ComputeError::Device(format!(
            "the {} adapter has no pipeline kernels (quick GELU, biased attention, convolutions, group norm); run text encoders and the VAE with --device cpu",
            self.name()
        )))
    }

    /// Marks the point the compute stream has reached.
    fn fence(&self) -> Result<Self::Fence, ComputeError>;
    /// Whether everything queued before `fence` has run.
    fn is_done(&self, fence: &Self::Fence) -> Result<bool, ComputeError>;
    /// Waits until everything queued before `fence` has run.
    fn wait(&self, fence: Self::Fence) -> Result<(), ComputeError>;
}
