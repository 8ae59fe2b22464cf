//! `CudaCompute`: the compute port (`crate::compute::Compute`) on a GPU — cuBLAS for
//! the products, the NVRTC kernels of `kernels.cu` for the rest, all queued in order on
//! the device's compute stream.
//!
//! Weights are read in the session's VRAM slots (or in blocks this adapter loaded for
//! the reference) in their storage dtype and cast to f32 in the cast buffer just
//! before use (`cast.rs`). Tensors are f32 device buffers. `write`, `read` and
//! `load_block` copy on the compute stream and wait, so they are ordered with every
//! operation queued before them and the host memory they borrow is free on return.
//! Fences are events on the compute stream; their segments give the device time of a
//! step (`timing.rs`).
//!
//! Not `Sync`: it belongs to the run's compute thread, like `CpuCompute`.

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use stagehand_actors::{DevicePtr, MemorySpace};

use super::blas::Blas;
use super::cast::CastArena;
use super::device::{memory_space_of, CudaDevice};
use super::error::CudaError;
use super::events::make_current;
use super::kernels::Kernels;
use super::memory::{
    copy_on_device, download, upload_and_wait, upload_pageable, DeviceBuffer, Footprint, Scratch,
};
use super::tensor::{same_shape, shape_error, tensor_bytes, CudaBlock, CudaTensor};
use super::timing::{CudaFence, DeviceTime};
use crate::compute::{
    Attention, BlockView, CachedAttention, Compute, ComputeError, LowRank, Weight,
};

/// Address space the cast buffer reserves beyond the device's memory, at least: the
/// reservation costs no memory, only what is mapped does.
const CAST_RESERVATION_BYTES_MIN: u64 = 1 << 30;
/// Cast buffer chunks (DESIGN §4: mapped in 16 MiB chunks as it grows).
const CAST_CHUNK_BYTES: u64 = 16 << 20;

pub struct CudaCompute {
    // Declared first so they drop first, while the stream and context still exist.
    blas: Blas,
    pub(super) kernels: Kernels,
    pub(super) cast: RefCell<CastArena>,
    /// Per-call uploads: token ids, row scales, sequence lengths.
    pub(super) uploads: RefCell<Scratch>,
    /// Attention scores of every head and sequence of one call.
    pub(super) scores: RefCell<Scratch>,
    /// The checksum's device sum.
    sum: RefCell<Scratch>,
    time: DeviceTime,
    pub(super) footprint: Arc<Footprint>,
    pub(super) stream: Arc<CudaStream>,
    context: Arc<CudaContext>,
    name: String,
}

/// What a failed device call means to a family: out of memory, or a device failure.
pub(super) fn compute_error(error: CudaError) -> ComputeError {
    if error.is_out_of_memory() {
        ComputeError::OutOfMemory(format!(
            "{error}: the activations do not fit beside the weights; lower --batch or --vram-budget"
        ))
    } else {
        ComputeError::Device(error.to_string())
    }
}

/// The bytes of f32 values, as the device reads them (little-endian host).
fn as_bytes(values: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialised bytes and u8 has no alignment requirement; the
    // view borrows `values`.
    unsafe {
        std::slice::from_raw_parts(values.as_ptr() as *const u8, std::mem::size_of_val(values))
    }
}

fn as_bytes_mut(values: &mut [f32]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every byte pattern written back is a valid f32.
    unsafe {
        std::slice::from_raw_parts_mut(
            values.as_mut_ptr() as *mut u8,
            std::mem::size_of_val(values),
        )
    }
}

impl CudaCompute {
    /// The compute port on `device`'s context and compute stream: compiles the
    /// kernels, creates the cuBLAS handle and reserves the cast buffer. Errors cleanly
    /// when cuBLAS or NVRTC are not installed.
    pub fn new(device: &CudaDevice) -> Result<Self, CudaError> {
        let stream = device.compute_stream().clone();
        let context = device.context().clone();
        make_current(&context)?;
        let kernels = Kernels::compile(&stream)?;
        let blas = Blas::new(&stream)?;
        let total_bytes = device.memory()?.total_bytes;
        let footprint = Arc::new(Footprint::default());
        let buffer = device.cast_buffer(
            total_bytes.max(CAST_RESERVATION_BYTES_MIN),
            CAST_CHUNK_BYTES,
        )?;
        Ok(Self {
            blas,
            kernels,
            cast: RefCell::new(CastArena::new(buffer, footprint.clone())),
            uploads: RefCell::new(Scratch::new()),
            scores: RefCell::new(Scratch::new()),
            sum: RefCell::new(Scratch::new()),
            time: DeviceTime::default(),
            footprint,
            stream,
            context,
            name: format!("cuda:{}", device.ordinal()),
        })
    }

    /// The device time of the work between fences (shared: a step callback reads it).
    pub fn device_time(&self) -> DeviceTime {
        self.time.clone()
    }

    /// Device bytes this adapter holds beside the session's weights (tensors, loaded
    /// reference blocks, scratch, the mapped cast buffer).
    pub fn footprint(&self) -> Arc<Footprint> {
        self.footprint.clone()
    }

    /// VRAM the cast buffer has mapped (it grows to the most one operation casts).
    pub fn cast_buffer_bytes(&self) -> u64 {
        self.cast.borrow().mapped_bytes()
    }

    /// Runs `body`, which queues work, with the context current and the stream's
    /// device-time segment open.
    pub(super) fn queue<T>(
        &self,
        body: impl FnOnce() -> Result<T, CudaError>,
    ) -> Result<T, ComputeError> {
        make_current(&self.context).map_err(compute_error)?;
        self.time.busy(&self.stream).map_err(compute_error)?;
        body().map_err(compute_error)
    }

    pub(super) fn blas(&self) -> &Blas {
        &self.blas
    }

    /// Uploads `bytes` into the upload scratch, ordered on the stream.
    pub(super) fn upload(&self, bytes: &[u8]) -> Result<DevicePtr, CudaError> {
        let target = self.uploads.borrow_mut().at_least(
            &self.stream,
            &self.footprint,
            bytes.len() as u64,
        )?;
        // SAFETY: `bytes` is a Vec this adapter built (pageable), so the driver has
        // staged it when the call returns; the scratch holds `bytes.len()` and is
        // reused only by later operations on the same stream.
        unsafe { upload_pageable(&self.stream, target, bytes) }?;
        Ok(target)
    }
}

impl Compute for CudaCompute {
    type Tensor = CudaTensor;
    type Fence = CudaFence;
    type Block = CudaBlock;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn memory_space(&self) -> MemorySpace {
        memory_space_of(&self.context)
    }

    fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor, ComputeError> {
        let bytes = tensor_bytes(rows, cols)?;
        make_current(&self.context).map_err(compute_error)?;
        let buffer =
            DeviceBuffer::zeroed(&self.stream, &self.footprint, bytes).map_err(|error| {
                if error.is_out_of_memory() {
                    ComputeError::OutOfMemory(format!(
                        "an activation of {rows} × {cols} f32 does not fit in VRAM; lower --batch"
                    ))
                } else {
                    compute_error(error)
                }
            })?;
        Ok(CudaTensor { buffer, rows, cols })
    }

    fn dims(&self, tensor: &CudaTensor) -> (usize, usize) {
        (tensor.rows, tensor.cols)
    }

    fn write(&self, tensor: &mut CudaTensor, values: &[f32]) -> Result<(), ComputeError> {
        if values.len() != tensor.elements() {
            return Err(shape_error(
                "write",
                format!(
                    "{} values into [{}, {}]",
                    values.len(),
                    tensor.rows,
                    tensor.cols
                ),
            ));
        }
        // SAFETY: the tensor holds exactly these bytes; the copy is waited for, so
        // the borrowed values may be any host memory.
        unsafe { upload_and_wait(&self.stream, tensor.ptr(), as_bytes(values)) }
            .map_err(compute_error)
    }

    fn read(&self, tensor: &CudaTensor) -> Result<Vec<f32>, ComputeError> {
        let mut values = vec![0f32; tensor.elements()];
        // SAFETY: the tensor holds exactly these bytes.
        unsafe { download(&self.stream, tensor.ptr(), as_bytes_mut(&mut values)) }
            .map_err(compute_error)?;
        Ok(values)
    }

    fn copy(&self, from: &CudaTensor, to: &mut CudaTensor) -> Result<(), ComputeError> {
        same_shape("copy", from, to)?;
        // SAFETY: two distinct tensors (one borrowed mutably) of the same size, alive
        // until a drop that waits for the stream.
        unsafe { copy_on_device(&self.stream, from.ptr(), to.ptr(), from.value_bytes()) }
            .map_err(compute_error)
    }

    fn load_block(&self, bytes: &[u8]) -> Result<CudaBlock, ComputeError> {
        make_current(&self.context).map_err(compute_error)?;
        let buffer = DeviceBuffer::allocate(&self.stream, &self.footprint, bytes.len() as u64)
            .map_err(|error| {
                if error.is_out_of_memory() {
                    ComputeError::OutOfMemory(format!(
                        "loading a block of {} bytes for the reference: {error}",
                        bytes.len()
                    ))
                } else {
                    compute_error(error)
                }
            })?;
        // SAFETY: the buffer was just allocated for these bytes; the copy is waited for.
        unsafe { upload_and_wait(&self.stream, buffer.ptr(), bytes) }.map_err(compute_error)?;
        Ok(CudaBlock { buffer })
    }

    fn block_view<'a>(&self, block: &'a CudaBlock) -> BlockView<'a> {
        // SAFETY: the buffer is VRAM of this adapter's context, owned by the block the
        // view borrows, so it stays allocated and unchanged for the view's lifetime.
        unsafe { BlockView::new(block.buffer.ptr(), block.buffer.bytes()) }
    }

    fn linear(
        &self,
        x: &CudaTensor,
        weight: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        y: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::products::linear(self, x, weight, bias, y)
    }

    fn low_rank_add(
        &self,
        x: &CudaTensor,
        factors: &LowRank<'_>,
        scale: f32,
        scratch: &mut CudaTensor,
        y: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::products::low_rank_add(self, x, factors, scale, scratch, y)
    }

    fn merge_low_rank(
        &self,
        weight: &Weight<'_>,
        factors: &LowRank<'_>,
        scale: f32,
    ) -> Result<(), ComputeError> {
        super::products::merge_low_rank(self, weight, factors, scale)
    }

    fn add(&self, x: &mut CudaTensor, y: &CudaTensor) -> Result<(), ComputeError> {
        super::rows::add(self, x, y)
    }

    fn add_scaled_rows(
        &self,
        acc: &mut CudaTensor,
        y: &CudaTensor,
        scales: &[f32],
    ) -> Result<(), ComputeError> {
        super::rows::add_scaled_rows(self, acc, y, scales)
    }

    fn gather_add(
        &self,
        table: &Weight<'_>,
        rows: &[u32],
        out: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::rows::gather_add(self, table, rows, out)
    }

    fn layer_norm(
        &self,
        x: &CudaTensor,
        gamma: &Weight<'_>,
        beta: &Weight<'_>,
        eps: f32,
        y: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::rows::layer_norm(self, x, gamma, beta, eps, y)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        gamma: Option<&Weight<'_>>,
        eps: f32,
        y: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::rows::rms_norm(self, x, gamma, eps, y)
    }

    fn rms_norm_heads(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        gamma: &Weight<'_>,
        eps: f32,
    ) -> Result<(), ComputeError> {
        super::rows::rms_norm_heads(self, x, heads, gamma, eps)
    }

    fn gelu_erf(&self, x: &mut CudaTensor) -> Result<(), ComputeError> {
        super::rows::gelu_erf(self, x)
    }

    fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        shape: &Attention<'_>,
        out: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::attention::attention(self, q, k, v, shape, out)
    }

    fn silu_mul(&self, gate: &mut CudaTensor, up: &CudaTensor) -> Result<(), ComputeError> {
        super::decoder::silu_mul(self, gate, up)
    }

    fn rope(
        &self,
        x: &mut CudaTensor,
        heads: usize,
        head_dim: usize,
        positions: &[u32],
        inv_freq: &[f32],
    ) -> Result<(), ComputeError> {
        super::decoder::rope(self, x, heads, head_dim, positions, inv_freq)
    }

    fn resize_rows(&self, tensor: &mut CudaTensor, rows: usize) -> Result<(), ComputeError> {
        super::decoder::resize_rows(self, tensor, rows)
    }

    fn slice_rows(
        &self,
        from: &CudaTensor,
        first: usize,
        to: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::decoder::slice_rows(self, from, first, to)
    }

    fn write_rows(
        &self,
        cache: &mut CudaTensor,
        at: usize,
        rows: &CudaTensor,
    ) -> Result<(), ComputeError> {
        super::decoder::write_rows(self, cache, at, rows)
    }

    fn attention_cached(
        &self,
        q: &CudaTensor,
        k_cache: &CudaTensor,
        v_cache: &CudaTensor,
        shape: &CachedAttention,
        out: &mut CudaTensor,
    ) -> Result<(), ComputeError> {
        super::decoder::attention_cached(self, q, k_cache, v_cache, shape, out)
    }

    fn stackable_rows(&self) -> usize {
        // The gemv kernel computes each of its rows in one fixed order, but only for
        // weights it does not read in place: f32 weights take cuBLAS at any row count,
        // and cuBLAS may pick another kernel (another order) for another row count.
        1
    }

    fn checksum(&self, block: &BlockView<'_>) -> Result<u64, ComputeError> {
        let sum = self.queue(|| {
            let sum = self
                .sum
                .borrow_mut()
                .at_least(&self.stream, &self.footprint, 8)?;
            // SAFETY: the scratch holds at least 8 bytes, 256-byte aligned; the block
            // is held by the caller for the view's lifetime.
            unsafe {
                cudarc::driver::sys::cuMemsetD8Async(sum.0, 0, 8, self.stream.cu_stream())
                    .result()
                    .map_err(CudaError::driver("cuMemsetD8Async"))?;
                self.kernels.checksum(block.ptr(), block.bytes(), sum)?;
            }
            let mut bytes = [0u8; 8];
            // SAFETY: the 8 bytes of the sum, read after the kernel.
            unsafe { download(&self.stream, sum, &mut bytes) }?;
            Ok(u64::from_le_bytes(bytes))
        })?;
        Ok(crate::compute::checksum::finish(sum, block.bytes()))
    }

    fn diffusion(
        &self,
    ) -> Result<&dyn crate::compute::Diffusion<Tensor = CudaTensor>, ComputeError> {
        Ok(self)
    }

    fn fence(&self) -> Result<CudaFence, ComputeError> {
        make_current(&self.context).map_err(compute_error)?;
        self.time.fence(&self.stream).map_err(compute_error)
    }

    fn is_done(&self, fence: &CudaFence) -> Result<bool, ComputeError> {
        fence.is_done().map_err(compute_error)
    }

    fn wait(&self, fence: CudaFence) -> Result<(), ComputeError> {
        fence.wait().map_err(compute_error)
    }
}
