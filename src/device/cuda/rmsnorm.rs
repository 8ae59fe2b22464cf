//! The rmsnorm step of the linear-stack layer, as a small NVRTC kernel, and its CPU
//! mirror, so the device computes the CPU backend's function (`src/workload/
//! linear_stack.rs`): per row, `y / sqrt(mean(y²) + 1e-6)`, f32.
//!
//! Arithmetic matches the CPU one operation for operation (sum of squares, divide by
//! the width, add ε, square root, reciprocal, scale) except the order the squares are
//! summed in (a tree on the device) and fused multiply-adds; both move the result by a
//! few ulps, far inside the stated tolerance ([`super::tolerance`]).

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};
use stagehand_actors::DevicePtr;

use super::device::CudaDevice;
use super::error::CudaError;

/// The ε the CPU linear-stack adds to the mean square (`linear_stack::RMS_EPSILON`).
pub const RMS_EPSILON: f32 = 1e-6;

const KERNEL_NAME: &str = "stagehand_rmsnorm";

/// One thread block per row; the threads stride over the row, reduce their sums of
/// squares by warp shuffles and shared memory, then scale the row.
pub const KERNEL_SOURCE: &str = r#"
extern "C" __global__ void stagehand_rmsnorm(const float* input, float* output,
                                              unsigned int rows, unsigned int dim,
                                              float epsilon) {
    const unsigned int row = blockIdx.x;
    if (row >= rows) {
        return;
    }
    const float* in = input + (unsigned long long)row * dim;
    float* out = output + (unsigned long long)row * dim;
    float sum = 0.0f;
    for (unsigned int i = threadIdx.x; i < dim; i += blockDim.x) {
        const float value = in[i];
        sum += value * value;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    __shared__ float warp_sums[32];
    __shared__ float scale;
    const unsigned int lane = threadIdx.x & 31;
    const unsigned int warp = threadIdx.x >> 5;
    if (lane == 0) {
        warp_sums[warp] = sum;
    }
    __syncthreads();
    if (warp == 0) {
        float total = lane < (blockDim.x >> 5) ? warp_sums[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) {
            total += __shfl_down_sync(0xffffffffu, total, offset);
        }
        if (lane == 0) {
            const float mean_square = total / (float)dim;
            scale = 1.0f / sqrtf(mean_square + epsilon);
        }
    }
    __syncthreads();
    for (unsigned int i = threadIdx.x; i < dim; i += blockDim.x) {
        out[i] = in[i] * scale;
    }
}
"#;

/// Threads per row: a multiple of the warp size (the reduction assumes full warps) and
/// at most 32 warps (one shared slot per warp).
const BLOCK_THREADS: u32 = 256;

/// The CPU mirror of the kernel (and of the CPU backend's rmsnorm): `output[r] =
/// input[r] / sqrt(mean(input[r]²) + ε)` for each row `r` of `dim` values.
pub fn rmsnorm_rows(input: &[f32], dim: usize, output: &mut [f32]) -> Result<(), CudaError> {
    if dim == 0 || input.len() % dim != 0 || output.len() != input.len() {
        return Err(CudaError::InvalidArgument(format!(
            "rmsnorm of {} values into {} in rows of {dim}: lengths must match and be whole rows",
            input.len(),
            output.len()
        )));
    }
    for (row_in, row_out) in input.chunks_exact(dim).zip(output.chunks_exact_mut(dim)) {
        let mean_square = row_in.iter().map(|v| v * v).sum::<f32>() / dim as f32;
        let scale = 1.0 / (mean_square + RMS_EPSILON).sqrt();
        for (out, value) in row_out.iter_mut().zip(row_in) {
            *out = value * scale;
        }
    }
    Ok(())
}

/// The compiled rmsnorm kernel, launched on the device's compute stream.
pub struct RmsNormKernel {
    function: CudaFunction,
    stream: Arc<CudaStream>,
}

impl RmsNormKernel {
    /// Compiles the kernel with NVRTC (checked present first) and loads it.
    pub fn new(device: &CudaDevice) -> Result<Self, CudaError> {
        let function = super::kernel::compile(device, KERNEL_SOURCE, KERNEL_NAME)?;
        Ok(Self {
            function,
            stream: device.compute_stream().clone(),
        })
    }

    /// Queues `output = rmsnorm(input)` over `rows × dim` f32 values after everything
    /// already on the compute stream. `input` and `output` may be the same buffer
    /// (each row is read fully before the barrier and written after it).
    pub fn queue(
        &self,
        input: DevicePtr,
        output: DevicePtr,
        rows: usize,
        dim: usize,
    ) -> Result<(), CudaError> {
        if input.0 == 0 || output.0 == 0 {
            return Err(CudaError::InvalidArgument(
                "rmsnorm of a null device pointer".to_string(),
            ));
        }
        let rows = u32::try_from(rows).ok().filter(|rows| *rows > 0);
        let dim = u32::try_from(dim).ok().filter(|dim| *dim > 0);
        let (Some(rows), Some(dim)) = (rows, dim) else {
            return Err(CudaError::InvalidArgument(
                "rmsnorm needs 1 to 2^32 − 1 rows of 1 to 2^32 − 1 values".to_string(),
            ));
        };
        let config = LaunchConfig {
            grid_dim: (rows, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (input, output, epsilon) = (input.0, output.0, RMS_EPSILON);
        let mut launch = self.stream.launch_builder(&self.function);
        launch
            .arg(&input)
            .arg(&output)
            .arg(&rows)
            .arg(&dim)
            .arg(&epsilon);
        // SAFETY: the kernel takes (pointer, pointer, u32, u32, f32) and gets two u64
        // addresses, two u32 and an f32 in that order; the caller names device ranges of
        // rows × dim f32 it allocated and keeps alive until the compute stream passes.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_comes_out_with_unit_root_mean_square() {
        // Proves the CPU mirror normalises every row on its own to mean(y²) ≈ 1.
        let input = [3.0, 4.0, 0.0, 0.0, -1.0, -1.0, -1.0, -1.0];
        let mut output = [0.0; 8];
        rmsnorm_rows(&input, 4, &mut output).unwrap();
        for row in output.chunks_exact(4) {
            let mean_square = row.iter().map(|v| v * v).sum::<f32>() / 4.0;
            assert!((mean_square - 1.0).abs() < 1e-5, "{row:?}");
        }
        assert!((output[0] - 3.0 / 2.5).abs() < 1e-6);
        assert_eq!(output[4], output[7]);
    }

    #[test]
    fn a_zero_row_stays_finite_thanks_to_epsilon() {
        // Proves ε keeps an all-zero row at zero instead of NaN.
        let mut output = [1.0; 3];
        rmsnorm_rows(&[0.0; 3], 3, &mut output).unwrap();
        assert_eq!(output, [0.0; 3]);
    }

    #[test]
    fn ragged_input_is_refused() {
        // Proves lengths that are not whole rows are an error naming the sizes.
        let error = rmsnorm_rows(&[1.0; 5], 2, &mut [0.0; 5]).unwrap_err();
        assert!(error.to_string().contains("rows of 2"), "{error}");
        assert!(rmsnorm_rows(&[1.0; 4], 2, &mut [0.0; 3]).is_err());
        assert!(rmsnorm_rows(&[], 0, &mut []).is_err());
    }

    #[test]
    fn the_kernel_source_uses_the_same_steps() {
        // Proves the CUDA source names the kernel and divides by the width before ε.
        assert!(KERNEL_SOURCE.contains(KERNEL_NAME));
        assert!(KERNEL_SOURCE.contains("total / (float)dim"));
        assert!(KERNEL_SOURCE.contains("1.0f / sqrtf(mean_square + epsilon)"));
        const { assert!(BLOCK_THREADS % 32 == 0 && BLOCK_THREADS / 32 <= 32) };
    }
}
