//! The decode product's launch (`stagehand_gemv` in `kernels.cu`).

use cudarc::driver::{LaunchConfig, PushKernelArg};
use stagehand_actors::DevicePtr;

use super::error::CudaError;
use super::kernels::{
    dtype_code, narrow_u32, scale_address, Kernels, BLOCK_THREADS, GEMV_ROWS_MAX,
};
use crate::compute::DType;

impl Kernels {
    /// `y[rows, out] ← x[rows, in] · Wᵀ (· the f32 at `scale`) + bias` for at most
    /// [`GEMV_ROWS_MAX`] rows, `W[out, in]` read in its storage `dtype` (any byte
    /// address) and never widened into a copy; `bias` (f32, `out`) may be absent.
    ///
    /// # Safety
    /// See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemv(
        &self,
        x: DevicePtr,
        rows: usize,
        weight: DevicePtr,
        dtype: DType,
        scale: Option<DevicePtr>,
        bias: Option<DevicePtr>,
        y: DevicePtr,
        out: usize,
        input: usize,
    ) -> Result<(), CudaError> {
        if rows == 0 || out == 0 {
            return Ok(());
        }
        if rows > GEMV_ROWS_MAX {
            return Err(CudaError::InvalidArgument(format!(
                "gemv of {rows} rows: at most {GEMV_ROWS_MAX}"
            )));
        }
        let warps_per_block = u64::from(BLOCK_THREADS / 32);
        let blocks = narrow_u32(
            (out as u64).div_ceil(warps_per_block) as usize,
            "output features",
        )?;
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (x, rows, weight, dtype) =
            (x.0, narrow_u32(rows, "rows")?, weight.0, dtype_code(dtype)?);
        let (scale, bias, y) = (scale_address(scale), scale_address(bias), y.0);
        let (out, input) = (
            narrow_u32(out, "output features")?,
            narrow_u32(input, "input features")?,
        );
        let mut launch = self.stream.launch_builder(&self.gemv);
        launch
            .arg(&x)
            .arg(&rows)
            .arg(&weight)
            .arg(&dtype)
            .arg(&scale)
            .arg(&bias)
            .arg(&y)
            .arg(&out)
            .arg(&input);
        // SAFETY: (pointer, u32, pointer, int, pointer, pointer, pointer, u32, u32) as
        // the kernel declares; the caller's promise covers the ranges.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }
}
