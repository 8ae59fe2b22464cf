//! The CPU backend's compute (the `Compute` port), on a pool of compute threads:
//!
//! - decode products (few rows, `gemv`) read each weight once in its storage dtype and
//!   widen it in registers (AVX-512, AVX2/FMA/F16C or portable lanes, chosen once);
//! - prefill, encoder and batched products (`gemm`) go through the `gemm` crate, a
//!   weight widened one cache-sized panel at a time;
//! - attention (`attention`) keeps one tile of scores, parallel over K/V heads; the
//!   rest is plain loops.
//!
//! Every split of work over threads is fixed by the shape, and every output element
//! is reduced by one thread in one fixed order, so the bits of every operation are
//! the same for any number of compute threads — a pass over streamed blocks and a
//! pass over the same blocks loaded from the file agree bit for bit, whatever
//! `compute_threads` each was given.
//!
//! "Device memory" is host memory: a weight's `DevicePtr` is a host address in the CPU
//! device's arena (a held block) or a [`CpuBlock`] this adapter loaded. Small vectors
//! and LoRA factors are widened into this adapter's cast buffers; products never widen
//! a whole weight.

mod amx;
mod attention;
mod block;
mod checksum;
mod convolution;
mod diffusion;
mod dots;
mod elementwise;
mod gemm;
mod gemv;
mod grouped;
mod heads;
mod kernels;
mod pipeline;
mod pool;
mod products;
mod simd;
mod spare;
mod tensor;
mod weights;
use weights::{as_f32, vector, weight_bytes, weight_scale};

pub use block::CpuBlock;
pub use simd::kernel_path;
pub use tensor::CpuTensor;

use std::cell::RefCell;
use std::sync::Mutex;

use stagehand_actors::{DevicePtr, MemorySpace};

use crate::compute::{
    shapes, Attention, BlockView, CachedAttention, Compute, ComputeDtype, ComputeError, LowRank,
    SharedBytes, Weight,
};

/// The CPU compute stream. Not `Sync`: it belongs to the compute thread, which runs
/// every operation and shares the large ones with its pool's workers.
pub struct CpuCompute {
    pool: pool::Pool,
    /// One buffer per pool thread: a product's widened weight panel, an attention
    /// task's transposed keys. Each grows to its largest use and stays.
    scratch: Vec<Mutex<Vec<f32>>>,
    /// The activations of a many-rows product, cut into the slices its tiles read.
    packed: RefCell<Vec<f32>>,
    /// LoRA factors and norm weights widened to f32 just before use.
    cast: RefCell<Vec<f32>>,
    /// Small vectors (bias, norm weights) and the second LoRA factor.
    cast_small: RefCell<Vec<f32>>,
    /// The precision of the many-rows products.
    compute_dtype: ComputeDtype,
    /// With bf16 products on AMX: one weight panel per pool thread, and the
    /// activations packed into tiles.
    tile_panels: Vec<Mutex<amx::Panel>>,
    tile_rows: RefCell<Vec<u16>>,
    /// bf16 products run on AMX tiles (this machine has them; tests may turn it off
    /// to check the f32 kernels' bf16 path here too).
    tiles: bool,
    /// The cores this process may run on: a pool spanning them all shares one with
    /// the copy thread (see `checksum`).
    cores: usize,
}

impl Default for CpuCompute {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuCompute {
    /// Compute on the calling thread alone.
    pub fn new() -> Self {
        Self::with_threads(1)
    }

    /// Compute on `threads` threads: the calling thread and `threads − 1` workers
    /// started now (0 is taken as 1). The results are the same bits for any count.
    pub fn with_threads(threads: usize) -> Self {
        let pool = pool::Pool::new(threads);
        let scratch = (0..pool.threads()).map(|_| Mutex::default()).collect();
        let tile_panels = (0..pool.threads()).map(|_| Mutex::default()).collect();
        Self {
            pool,
            scratch,
            packed: RefCell::default(),
            cast: RefCell::default(),
            cast_small: RefCell::default(),
            compute_dtype: ComputeDtype::F32,
            tile_panels,
            tile_rows: RefCell::default(),
            tiles: amx::available(),
            cores: crate::settings::machine_cores(),
        }
    }

    /// The same compute with many-rows products in `compute_dtype`.
    pub fn with_compute_dtype(mut self, compute_dtype: ComputeDtype) -> Self {
        self.compute_dtype = compute_dtype;
        self
    }

    /// The precision of the many-rows products.
    pub fn compute_dtype(&self) -> ComputeDtype {
        self.compute_dtype
    }

    /// A many-rows product on the f32 kernels, with this compute's pool and buffers.
    fn f32_gemm(&self, product: &gemm::Gemm<'_>, y: &mut [f32]) {
        let mut packed = self.packed.borrow_mut();
        gemm::gemm(&self.pool, &self.scratch, &mut packed, product, y);
    }

    /// Products of at most this many rows take the few-rows path (`gemv`): every row
    /// then has the bits it has alone. Under `compute_dtype = bf16` the bound is the
    /// same on every CPU, so which products get bf16 operands depends on the setting
    /// and the shape, never on whether this CPU has AMX tiles (without them the f32
    /// kernels round the operands).
    fn gemv_rows(&self) -> usize {
        if self.compute_dtype == ComputeDtype::Bf16 {
            gemv::GEMV_ROWS_BF16
        } else {
            gemv::GEMV_ROWS
        }
    }

    /// The threads that compute, the calling one included.
    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Bytes the cast and scratch buffers hold now (grown to their largest use).
    pub fn cast_buffer_bytes(&self) -> u64 {
        let scratch: usize = self
            .scratch
            .iter()
            .map(|buffer| buffer.lock().map_or(0, |buffer| buffer.capacity()))
            .sum();
        let panels: usize = self
            .tile_panels
            .iter()
            .map(|panel| panel.lock().map_or(0, |panel| panel.bytes()))
            .sum();
        let halves = self.tile_rows.borrow().capacity();
        let floats = self.cast.borrow().capacity()
            + self.cast_small.borrow().capacity()
            + self.packed.borrow().capacity()
            + scratch;
        (floats * 4 + halves * 2 + panels) as u64
    }
}

impl Compute for CpuCompute {
    type Tensor = CpuTensor;
    type Fence = ();
    type Block = CpuBlock;

    fn name(&self) -> String {
        "cpu".into()
    }

    fn memory_space(&self) -> MemorySpace {
        MemorySpace::Host
    }

    fn tensor(&self, rows: usize, cols: usize) -> Result<CpuTensor, ComputeError> {
        Ok(CpuTensor {
            data: spare::allocate(rows, cols)?,
            rows,
            cols,
        })
    }

    fn dims(&self, tensor: &CpuTensor) -> (usize, usize) {
        (tensor.rows, tensor.cols)
    }

    fn write(&self, tensor: &mut CpuTensor, values: &[f32]) -> Result<(), ComputeError> {
        if values.len() != tensor.data.len() {
            return Err(ComputeError::Shape(format!(
                "write: {} values into [{}, {}]",
                values.len(),
                tensor.rows,
                tensor.cols
            )));
        }
        tensor.data.copy_from_slice(values);
        Ok(())
    }

    fn read(&self, tensor: &CpuTensor) -> Result<Vec<f32>, ComputeError> {
        Ok(tensor.data.clone())
    }

    fn copy(&self, from: &CpuTensor, to: &mut CpuTensor) -> Result<(), ComputeError> {
        shapes::same("copy", from.dims(), to.dims())?;
        to.data.copy_from_slice(&from.data);
        Ok(())
    }

    fn load_block(&self, bytes: &[u8]) -> Result<CpuBlock, ComputeError> {
        CpuBlock::filled(bytes.len(), |block| {
            block.copy_from_slice(bytes);
            Ok::<_, ComputeError>(())
        })
    }

    fn load_block_with<E: From<ComputeError>>(
        &self,
        length: usize,
        _scratch: &mut Vec<u8>,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<CpuBlock, E> {
        CpuBlock::filled(length, fill)
    }

    fn share_block(&self, bytes: SharedBytes) -> Result<CpuBlock, ComputeError> {
        Ok(CpuBlock::shared(bytes))
    }

    fn block_view<'a>(&self, block: &'a CpuBlock) -> BlockView<'a> {
        let bytes = block.bytes();
        // SAFETY: the bytes are host memory the block owns or shares; the view borrows
        // the block, so they stay allocated and unchanged for the view's lifetime.
        unsafe { BlockView::new(DevicePtr(bytes.as_ptr() as u64), bytes.len() as u64) }
    }

    fn linear(
        &self,
        x: &CpuTensor,
        weight: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        products::linear(self, x, weight, bias, y)
    }

    fn low_rank_add(
        &self,
        x: &CpuTensor,
        factors: &LowRank<'_>,
        scale: f32,
        scratch: &mut CpuTensor,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        products::low_rank_add(self, x, factors, scale, scratch, y)
    }

    fn merge_low_rank(
        &self,
        weight: &Weight<'_>,
        factors: &LowRank<'_>,
        scale: f32,
    ) -> Result<(), ComputeError> {
        products::merge_low_rank(self, weight, factors, scale)
    }

    fn add(&self, x: &mut CpuTensor, y: &CpuTensor) -> Result<(), ComputeError> {
        shapes::same("add", x.dims(), y.dims())?;
        kernels::add(&self.pool, &mut x.data, &y.data);
        Ok(())
    }

    fn add_scaled_rows(
        &self,
        acc: &mut CpuTensor,
        y: &CpuTensor,
        scales: &[f32],
    ) -> Result<(), ComputeError> {
        products::add_scaled_rows(acc, y, scales)
    }

    fn gather_add(
        &self,
        table: &Weight<'_>,
        rows: &[u32],
        out: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        products::gather_add(self, table, rows, out)
    }

    fn layer_norm(
        &self,
        x: &CpuTensor,
        gamma: &Weight<'_>,
        beta: &Weight<'_>,
        eps: f32,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        shapes::same("layer_norm", x.dims(), y.dims())?;
        let mut cast = self.cast.borrow_mut();
        let mut small = self.cast_small.borrow_mut();
        let gamma = vector("layer_norm weight", gamma, x.cols, &mut cast)?;
        let beta = vector("layer_norm bias", beta, x.cols, &mut small)?;
        let rows = (&x.data[..], x.cols);
        kernels::layer_norm(&self.pool, rows, (gamma, beta), eps, &mut y.data);
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &CpuTensor,
        gamma: Option<&Weight<'_>>,
        eps: f32,
        y: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        shapes::same("rms_norm", x.dims(), y.dims())?;
        let mut small = self.cast_small.borrow_mut();
        let gamma = gamma
            .map(|gamma| vector("rms_norm weight", gamma, x.cols, &mut small))
            .transpose()?;
        kernels::rms_norm(&self.pool, (&x.data, x.cols), gamma, eps, &mut y.data);
        Ok(())
    }

    fn rms_norm_heads(
        &self,
        x: &mut CpuTensor,
        heads: usize,
        gamma: &Weight<'_>,
        eps: f32,
    ) -> Result<(), ComputeError> {
        let head_dim = shapes::norm_heads(x.dims(), heads, gamma)?;
        let mut small = self.cast_small.borrow_mut();
        let gamma = as_f32(gamma, &mut small);
        heads::rms_norm_heads(&mut x.data, head_dim, gamma, eps);
        Ok(())
    }

    fn gelu_erf(&self, x: &mut CpuTensor) -> Result<(), ComputeError> {
        elementwise::gelu_erf(&self.pool, &mut x.data);
        Ok(())
    }

    fn attention(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        v: &CpuTensor,
        shape: &Attention<'_>,
        out: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        shape.check(q.dims(), k.dims(), v.dims())?;
        shapes::same("attention output", q.dims(), out.dims())?;
        attention::attention(
            &self.pool,
            &self.scratch,
            (&q.data, &k.data, &v.data),
            shape,
            &mut out.data,
        );
        Ok(())
    }

    fn silu_mul(&self, gate: &mut CpuTensor, up: &CpuTensor) -> Result<(), ComputeError> {
        shapes::same("silu_mul", gate.dims(), up.dims())?;
        elementwise::silu_mul(&self.pool, &mut gate.data, &up.data);
        Ok(())
    }

    fn rope(
        &self,
        x: &mut CpuTensor,
        heads: usize,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
    ) -> Result<(), ComputeError> {
        shapes::rope(x.dims(), heads, head_dim, positions.len(), inv_freq.len())?;
        kernels::rope(&mut x.data, heads, head_dim, positions, inv_freq);
        Ok(())
    }

    fn resize_rows(&self, tensor: &mut CpuTensor, rows: usize) -> Result<(), ComputeError> {
        let count = rows.checked_mul(tensor.cols).ok_or_else(|| {
            ComputeError::OutOfMemory(format!("{rows} rows of {} do not fit", tensor.cols))
        })?;
        if count > tensor.data.len() {
            tensor
                .data
                .try_reserve_exact(count - tensor.data.len())
                .map_err(|_| {
                    ComputeError::OutOfMemory(format!(
                        "growing a [{}, {}] tensor to {rows} rows does not fit in host memory",
                        tensor.rows, tensor.cols
                    ))
                })?;
        }
        tensor.data.resize(count, 0.0);
        tensor.rows = rows;
        Ok(())
    }

    fn slice_rows(
        &self,
        from: &CpuTensor,
        first: usize,
        to: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        shapes::slice_rows(from.dims(), first, to.dims())?;
        to.data
            .copy_from_slice(&from.data[first * from.cols..(first + to.rows) * from.cols]);
        Ok(())
    }

    fn write_rows(
        &self,
        cache: &mut CpuTensor,
        at: usize,
        rows: &CpuTensor,
    ) -> Result<(), ComputeError> {
        shapes::write_rows(cache.dims(), at, rows.dims())?;
        cache.data[at * cache.cols..(at + rows.rows) * cache.cols].copy_from_slice(&rows.data);
        Ok(())
    }

    fn attention_cached(
        &self,
        q: &CpuTensor,
        k_cache: &CpuTensor,
        v_cache: &CpuTensor,
        shape: &CachedAttention,
        out: &mut CpuTensor,
    ) -> Result<(), ComputeError> {
        shape.check(q.dims(), k_cache.dims(), v_cache.dims())?;
        shapes::same("attention output", q.dims(), out.dims())?;
        attention::attention_cached(
            &self.pool,
            &self.scratch,
            (&q.data, &k_cache.data, &v_cache.data),
            shape,
            &mut out.data,
        );
        Ok(())
    }

    fn pipeline(&self) -> Result<&dyn crate::compute::Pipeline<Tensor = CpuTensor>, ComputeError> {
        Ok(self)
    }

    fn diffusion(&self) -> Result<diffusion::Kernels<'_>, ComputeError> {
        Ok(self)
    }

    fn stackable_rows(&self) -> usize {
        self.gemv_rows()
    }

    fn flush_from_caches(&self, block: &BlockView<'_>) {
        // SAFETY: the view's contract: live host memory of this device for its lifetime.
        let bytes = unsafe {
            std::slice::from_raw_parts(block.ptr().0 as *const u8, block.bytes() as usize)
        };
        crate::os::flush_from_caches(bytes);
    }

    fn checksum(&self, block: &BlockView<'_>) -> Result<u64, ComputeError> {
        // SAFETY: the view's contract: live host memory of this device for its lifetime.
        let bytes = unsafe {
            std::slice::from_raw_parts(block.ptr().0 as *const u8, block.bytes() as usize)
        };
        Ok(checksum::checksum(&self.pool, bytes, self.cores))
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

#[cfg(test)]
mod product_tests;
#[cfg(test)]
mod tests;
