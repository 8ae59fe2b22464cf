//! The compute adapter's NVRTC kernels (`kernels.cu`), compiled once per adapter into
//! one module, and typed launches on the compute stream.
//!
//! Every launch takes device addresses as plain `u64`s: the adapter's own buffers and
//! weights in blocks the caller holds. Each `# Safety` below is the same promise: the
//! ranges a launch names are device memory of this context, sized as the arguments
//! say, and stay allocated until the compute stream has passed the launch.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use stagehand_actors::DevicePtr;

use super::error::CudaError;
use super::kernels_diffusion::DiffusionKernels;
use super::library::require_nvrtc;
use crate::compute::DType;

/// The kernels' source, one file so NVRTC compiles it once.
pub const SOURCE: &str = include_str!("kernels.cu");

/// Threads per block: a multiple of the warp size (the reductions assume full warps)
/// and at most 32 warps (one shared slot per warp).
pub const BLOCK_THREADS: u32 = 256;
/// Most blocks of a grid-stride launch: enough to fill any current GPU.
const GRID_BLOCKS_MAX: u64 = 4096;

/// The dtype code the kernels take. The kernels read int8 (`int8_tensorwise`) but
/// not group-quantised 4-bit weights (`awq_w4a16`), which the CPU backend computes:
/// those are refused by name.
pub fn dtype_code(dtype: DType) -> Result<i32, CudaError> {
    Ok(match dtype {
        DType::F32 => 0,
        DType::F16 => 1,
        DType::Bf16 => 2,
        DType::F8E4M3 => 3,
        DType::F8E5M2 => 4,
        DType::I8 => 5,
        DType::U4 => {
            return Err(CudaError::InvalidArgument(
                "awq_w4a16 (4-bit group-quantized) weights are computed by the CPU backend only; run with --device cpu".into(),
            ))
        }
    })
}

/// A weight's scale address for the kernels: 0 for none.
pub(super) fn scale_address(scale: Option<DevicePtr>) -> u64 {
    scale.map_or(0, |scale| scale.0)
}

/// Grid of a grid-stride launch over `count` elements.
pub fn grid_for(count: u64) -> LaunchConfig {
    let blocks = count
        .div_ceil(u64::from(BLOCK_THREADS))
        .clamp(1, GRID_BLOCKS_MAX) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row.
pub(super) fn per_row(rows: u64) -> Result<LaunchConfig, CudaError> {
    let rows = u32::try_from(rows)
        .ok()
        .filter(|rows| *rows < i32::MAX as u32)
        .ok_or_else(|| {
            CudaError::InvalidArgument(format!("{rows} rows are too many for one launch"))
        })?;
    Ok(LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (BLOCK_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

pub(super) fn narrow_u32(value: usize, what: &str) -> Result<u32, CudaError> {
    u32::try_from(value)
        .map_err(|_| CudaError::InvalidArgument(format!("{what} {value} is too large")))
}

/// Most rows a decode product (`gemv`) takes: `STAGEHAND_GEMV_ROWS` in the source.
pub const GEMV_ROWS_MAX: usize = 8;

pub struct Kernels {
    pub(super) stream: Arc<CudaStream>,
    widen: CudaFunction,
    pub(super) gemv: CudaFunction,
    narrow: CudaFunction,
    fill_rows: CudaFunction,
    add: CudaFunction,
    add_scaled_rows: CudaFunction,
    gather_add: CudaFunction,
    layer_norm: CudaFunction,
    rms_norm: CudaFunction,
    gelu_erf: CudaFunction,
    pub(super) masked_softmax: CudaFunction,
    pub(super) silu_mul: CudaFunction,
    pub(super) rope: CudaFunction,
    checksum: CudaFunction,
    pub(super) diffusion: DiffusionKernels,
}

impl Kernels {
    /// Compiles [`SOURCE`] with NVRTC (checked present first) and loads every kernel.
    pub fn compile(stream: &Arc<CudaStream>) -> Result<Self, CudaError> {
        require_nvrtc()?;
        let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(|error| CudaError::Nvrtc {
            kernel: "compute",
            log: format!("{error:?}"),
        })?;
        let module = stream
            .context()
            .load_module(ptx)
            .map_err(CudaError::driver("cuModuleLoadData"))?;
        let function = |name: &str| {
            module
                .load_function(name)
                .map_err(CudaError::driver("cuModuleGetFunction"))
        };
        Ok(Self {
            stream: stream.clone(),
            widen: function("stagehand_widen")?,
            gemv: function("stagehand_gemv")?,
            narrow: function("stagehand_narrow")?,
            fill_rows: function("stagehand_fill_rows")?,
            add: function("stagehand_add")?,
            add_scaled_rows: function("stagehand_add_scaled_rows")?,
            gather_add: function("stagehand_gather_add")?,
            layer_norm: function("stagehand_layer_norm")?,
            rms_norm: function("stagehand_rms_norm")?,
            gelu_erf: function("stagehand_gelu_erf")?,
            masked_softmax: function("stagehand_masked_softmax")?,
            silu_mul: function("stagehand_silu_mul")?,
            rope: function("stagehand_rope")?,
            checksum: function("stagehand_checksum")?,
            diffusion: DiffusionKernels::load(&module)?,
        })
    }

    /// `dst[0..count] ← src` widened from `dtype` (any byte address), times the f32
    /// at `scale` when there is one.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn widen(
        &self,
        src: DevicePtr,
        dtype: DType,
        scale: Option<DevicePtr>,
        dst: DevicePtr,
        count: u64,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let (src, dtype, scale, dst) = (src.0, dtype_code(dtype)?, scale_address(scale), dst.0);
        let mut launch = self.stream.launch_builder(&self.widen);
        launch
            .arg(&src)
            .arg(&dtype)
            .arg(&scale)
            .arg(&dst)
            .arg(&count);
        // SAFETY: (pointer, int, pointer, pointer, u64) as the kernel declares; the
        // caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `dst ← src` (divided by the f32 at `scale` when there is one) narrowed to
    /// `dtype` with round-to-nearest-even (any byte address).
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn narrow(
        &self,
        src: DevicePtr,
        dst: DevicePtr,
        dtype: DType,
        scale: Option<DevicePtr>,
        count: u64,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let (src, dst, dtype, scale) = (src.0, dst.0, dtype_code(dtype)?, scale_address(scale));
        let mut launch = self.stream.launch_builder(&self.narrow);
        launch
            .arg(&src)
            .arg(&dst)
            .arg(&dtype)
            .arg(&scale)
            .arg(&count);
        // SAFETY: (pointer, pointer, int, pointer, u64); the caller's promise covers
        // the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// Every row of `y[rows, cols]` ← `row[cols]`.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn fill_rows(
        &self,
        y: DevicePtr,
        row: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (cols as u64);
        if count == 0 {
            return Ok(());
        }
        let (y, row, rows, cols) = (y.0, row.0, rows as u64, narrow_u32(cols, "columns")?);
        let mut launch = self.stream.launch_builder(&self.fill_rows);
        launch.arg(&y).arg(&row).arg(&rows).arg(&cols);
        // SAFETY: (pointer, pointer, u64, u32); the caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `x ← x + y` over `count` f32.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn add(&self, x: DevicePtr, y: DevicePtr, count: u64) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let (x, y) = (x.0, y.0);
        let mut launch = self.stream.launch_builder(&self.add);
        launch.arg(&x).arg(&y).arg(&count);
        // SAFETY: (pointer, pointer, u64); the caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `acc[r] ← acc[r] + scales[r]·y[r]` for `rows` rows of `cols`.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn add_scaled_rows(
        &self,
        acc: DevicePtr,
        y: DevicePtr,
        scales: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (cols as u64);
        if count == 0 {
            return Ok(());
        }
        let (acc, y, scales) = (acc.0, y.0, scales.0);
        let (rows, cols) = (rows as u64, narrow_u32(cols, "columns")?);
        let mut launch = self.stream.launch_builder(&self.add_scaled_rows);
        launch.arg(&acc).arg(&y).arg(&scales).arg(&rows).arg(&cols);
        // SAFETY: (pointer ×3, u64, u32); the caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `out[r] ← out[r] + table[ids[r]]`, the table in `dtype` at any byte address
    /// (times the f32 at `scale` when there is one); the ids must lie inside the table
    /// (checked by the caller).
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_add(
        &self,
        table: DevicePtr,
        dtype: DType,
        scale: Option<DevicePtr>,
        ids: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        let count = (rows as u64) * (cols as u64);
        if count == 0 {
            return Ok(());
        }
        let (table, dtype, scale) = (table.0, dtype_code(dtype)?, scale_address(scale));
        let (ids, out) = (ids.0, out.0);
        let (rows, cols) = (rows as u64, narrow_u32(cols, "columns")?);
        let mut launch = self.stream.launch_builder(&self.gather_add);
        launch
            .arg(&table)
            .arg(&dtype)
            .arg(&scale)
            .arg(&ids)
            .arg(&out)
            .arg(&rows)
            .arg(&cols);
        // SAFETY: (pointer, int, pointer ×3, u64, u32); the caller's promise covers
        // the ranges and the ids.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// LayerNorm of each of `rows` rows of `cols` (f32 gamma and beta).
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn layer_norm(
        &self,
        x: DevicePtr,
        gamma: DevicePtr,
        beta: DevicePtr,
        eps: f32,
        y: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let config = per_row(rows as u64)?;
        let (x, gamma, beta, y, cols) = (x.0, gamma.0, beta.0, y.0, narrow_u32(cols, "columns")?);
        let mut launch = self.stream.launch_builder(&self.layer_norm);
        launch
            .arg(&x)
            .arg(&gamma)
            .arg(&beta)
            .arg(&eps)
            .arg(&y)
            .arg(&cols);
        // SAFETY: (pointer ×3, float, pointer, u32); the caller's promise covers them.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// RMSNorm of each of `rows` rows of `cols` (f32 gamma, or null for none).
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn rms_norm(
        &self,
        x: DevicePtr,
        gamma: DevicePtr,
        eps: f32,
        y: DevicePtr,
        rows: usize,
        cols: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let config = per_row(rows as u64)?;
        let (x, gamma, y, cols) = (x.0, gamma.0, y.0, narrow_u32(cols, "columns")?);
        let mut launch = self.stream.launch_builder(&self.rms_norm);
        launch.arg(&x).arg(&gamma).arg(&eps).arg(&y).arg(&cols);
        // SAFETY: (pointer, pointer, float, pointer, u32); the caller's promise covers
        // the ranges (a null gamma is read as "none" by the kernel).
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// `x ← x·Φ(x)` over `count` f32.
    ///
    /// # Safety
    /// See the module docs.
    pub unsafe fn gelu_erf(&self, x: DevicePtr, count: u64) -> Result<(), CudaError> {
        // SAFETY: the caller's contract.
        unsafe { self.in_place(&self.gelu_erf, x, count) }
    }

    /// `function` (an element-wise kernel taking `(float*, u64)`) over `count` f32 at
    /// `x`, in place.
    ///
    /// # Safety
    /// See the module docs; `function` is one of this module's element-wise kernels.
    pub(super) unsafe fn in_place(
        &self,
        function: &CudaFunction,
        x: DevicePtr,
        count: u64,
    ) -> Result<(), CudaError> {
        if count == 0 {
            return Ok(());
        }
        let x = x.0;
        let mut launch = self.stream.launch_builder(function);
        launch.arg(&x).arg(&count);
        // SAFETY: (pointer, u64); the caller's promise covers the range.
        unsafe { launch.launch(grid_for(count)) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// Adds the checksum terms of `length` bytes at `data` into the u64 at `sum`.
    ///
    /// # Safety
    /// See the module docs; `sum` is 8-byte aligned device memory.
    pub unsafe fn checksum(
        &self,
        data: DevicePtr,
        length: u64,
        sum: DevicePtr,
    ) -> Result<(), CudaError> {
        let (data, sum) = (data.0, sum.0);
        let mut launch = self.stream.launch_builder(&self.checksum);
        launch.arg(&data).arg(&length).arg(&sum);
        // SAFETY: (pointer, u64, pointer); the caller's promise covers the ranges.
        unsafe { launch.launch(grid_for(length.div_ceil(4))) }
            .map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_source_defines_every_kernel_loaded_and_the_checksum_constants() {
        // Proves each function `Kernels::compile` asks for is in the source, and that
        // the checksum kernel uses crate::compute::checksum's key constant (the
        // emulator test checks its sums against the definition).
        for name in [
            "stagehand_widen",
            "stagehand_gemv",
            "stagehand_narrow",
            "stagehand_fill_rows",
            "stagehand_add",
            "stagehand_add_scaled_rows",
            "stagehand_gather_add",
            "stagehand_layer_norm",
            "stagehand_rms_norm",
            "stagehand_gelu_erf",
            "stagehand_masked_softmax",
            "stagehand_silu_mul",
            "stagehand_rope",
            "stagehand_checksum",
        ]
        .into_iter()
        .chain(super::super::kernels_diffusion::NAMES)
        {
            assert!(
                SOURCE.contains(&format!("__global__ void {name}(")),
                "{name}"
            );
        }
        assert!(
            SOURCE.contains("0x9e3779b97f4a7c15"),
            "the checksum's index key"
        );
        assert!(SOURCE.contains(&format!("#define STAGEHAND_GEMV_ROWS {GEMV_ROWS_MAX}\n")));
        assert!(!SOURCE.contains("#include"), "NVRTC must need no header");
        assert!(!SOURCE.contains("atomicAdd(float"), "no float atomics");
        const { assert!(BLOCK_THREADS % 32 == 0 && BLOCK_THREADS / 32 <= 32) };
    }

    #[test]
    fn grids_cover_the_work_within_bounds() {
        // Proves grid-stride grids never launch 0 blocks and stay under the cap.
        assert_eq!(grid_for(0).grid_dim.0, 1);
        assert_eq!(grid_for(257).grid_dim.0, 2);
        assert_eq!(grid_for(u64::MAX / 2).grid_dim.0, GRID_BLOCKS_MAX as u32);
        assert!(per_row(u64::from(u32::MAX)).is_err());
        assert_eq!(per_row(7).unwrap().grid_dim.0, 7);
        assert_eq!(dtype_code(DType::Bf16).unwrap(), 2);
        assert_eq!(dtype_code(DType::F8E5M2).unwrap(), 4);
        assert_eq!(dtype_code(DType::I8).unwrap(), 5);
        let refused = dtype_code(DType::U4).unwrap_err().to_string();
        assert!(refused.contains("awq_w4a16"), "{refused}");
        assert_eq!(scale_address(None), 0);
    }
}
