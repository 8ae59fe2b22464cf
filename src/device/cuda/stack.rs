//! The linear-stack workload on the GPU: the CPU backend's layer `x ← rmsnorm(x · Wᵀ)`
//! (bias-free, f32) as a cuBLAS sgemm followed by the rmsnorm kernel, on the compute
//! stream, with weights read in place from wherever the session put the block.
//!
//! Checked against `LinearStack::reference` (the CPU backend's fully-resident result)
//! within [`super::tolerance`]`(DType::F32)`: the GPU sums in another order, so equal
//! bits are not expected, but the rmsnorm after every layer keeps values O(1) and the
//! differences do not grow with depth (see the CPU-side test below, which puts a
//! different summation order through the 64-layer demo shape).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use stagehand_actors::{Device, DeviceArena, DevicePtr};

use super::device::CudaDevice;
use super::error::CudaError;
use super::floats::DType;
use super::linear::{reference_forward, CublasLinear, DeviceLayer, LayerShape};
use super::rmsnorm::{rmsnorm_rows, RmsNormKernel};
use crate::model::demo::DemoSpec;
use crate::model::ModelIndex;
use crate::workload::linear_stack::LinearStack;

/// Where each layer's weight starts inside its block, per block: read from the index,
/// the same tensors `LinearStack::from_index` checked.
pub fn layer_offsets(index: &ModelIndex, spec: &DemoSpec) -> Result<Vec<Vec<u64>>, CudaError> {
    (0..spec.blocks)
        .map(|block| {
            (0..spec.layers_per_block)
                .map(|layer| {
                    let name = DemoSpec::tensor_name(block, layer);
                    index
                        .tensor(&name)
                        .map(|tensor| tensor.block_offset)
                        .ok_or_else(|| {
                            CudaError::InvalidArgument(format!(
                                "{}: tensor {name} is missing",
                                index.path.display()
                            ))
                        })
                })
                .collect()
        })
        .collect()
}

/// The CPU mirror of what [`LinearStackGpu`] computes for one layer: `x ← rmsnorm(x ·
/// Wᵀ)` with `weight` row-major `[dim, dim]`.
pub fn layer_cpu(weight: &[f32], dim: usize, batch: usize, x: &mut [f32]) -> Result<(), CudaError> {
    let shape = LayerShape {
        in_features: dim,
        out_features: dim,
    };
    let y = reference_forward(&[(weight, shape)], DType::F32, batch, x)?;
    rmsnorm_rows(&y, dim, x)
}

/// The linear stack's activations on the device and the kernels that run its layers.
pub struct LinearStackGpu {
    device: Arc<CudaDevice>,
    blas: CublasLinear,
    rmsnorm: RmsNormKernel,
    dim: usize,
    batch: usize,
    layer_offsets: Vec<Vec<u64>>,
    /// [input, x, y]: the step's fixed input, the running activations, the GEMM output.
    buffers: Vec<DeviceArena>,
}

impl LinearStackGpu {
    /// Compiles the kernels, creates the cuBLAS handle and uploads the model's input.
    pub fn new(
        device: Arc<CudaDevice>,
        model: &LinearStack,
        index: &ModelIndex,
    ) -> Result<Self, CudaError> {
        let blas = CublasLinear::new(&device)?;
        let rmsnorm = RmsNormKernel::new(&device)?;
        let layer_offsets = layer_offsets(index, &model.spec)?;
        let input = model.activations().x;
        let bytes = (input.len() * std::mem::size_of::<f32>()) as u64;
        let mut buffers = Vec::with_capacity(3);
        for _ in 0..3 {
            match device.allocate_arena(bytes) {
                Ok(arena) => buffers.push(arena),
                Err(error) => {
                    for arena in buffers {
                        device.free_arena(arena);
                    }
                    return Err(CudaError::InvalidArgument(format!(
                        "activations of {bytes} bytes (batch {} × dim {}): {error}; lower --batch",
                        model.batch,
                        model.dim()
                    )));
                }
            }
        }
        let stack = Self {
            device,
            blas,
            rmsnorm,
            dim: model.dim(),
            batch: model.batch,
            layer_offsets,
            buffers,
        };
        stack.device.bind()?;
        // SAFETY: the input slice is live for the call, which is synchronous, and the
        // destination arena holds exactly its bytes.
        unsafe {
            sys::cuMemcpyHtoD_v2(
                stack.buffers[0].base.0,
                input.as_ptr() as *const c_void,
                bytes as usize,
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyHtoD"))?;
        Ok(stack)
    }

    /// Device bytes the activations take (input, running x, GEMM output).
    pub fn activation_bytes(&self) -> u64 {
        self.buffers.iter().map(|arena| arena.bytes).sum()
    }

    pub fn blocks(&self) -> usize {
        self.layer_offsets.len()
    }

    /// Queues `x ← input` on the compute stream: every step starts from the same input,
    /// as on the CPU.
    pub fn reset(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: both arenas are live and of equal size; the copy is ordered on the
        // compute stream before the step's layers.
        unsafe {
            sys::cuMemcpyDtoDAsync_v2(
                self.buffers[1].base.0,
                self.buffers[0].base.0,
                self.buffers[0].bytes as usize,
                self.device.compute_stream().cu_stream(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyDtoDAsync"))
    }

    /// Queues block `block`'s layers, reading weights at `weights` (the block's start).
    pub fn forward_block(&self, block: usize, weights: DevicePtr) -> Result<(), CudaError> {
        let offsets = self.layer_offsets.get(block).ok_or_else(|| {
            CudaError::InvalidArgument(format!(
                "block {block} is not in the {}-block linear stack",
                self.layer_offsets.len()
            ))
        })?;
        for offset in offsets {
            self.layer(weights.offset(*offset))?;
        }
        Ok(())
    }

    fn layer(&self, weight: DevicePtr) -> Result<(), CudaError> {
        let (x, y) = (self.buffers[1].base, self.buffers[2].base);
        let shape = LayerShape {
            in_features: self.dim,
            out_features: self.dim,
        };
        self.blas
            .linear(DType::F32, DeviceLayer { weight, shape }, self.batch, x, y)?;
        self.rmsnorm.queue(y, x, self.batch, self.dim)
    }

    /// Runs one layer over a zeroed scratch weight and waits, so cuBLAS has allocated
    /// its workspace and loaded its kernels before the run measures memory or time.
    pub fn warm_up(&self) -> Result<(), CudaError> {
        let bytes = (self.dim * self.dim * std::mem::size_of::<f32>()) as u64;
        let scratch = self
            .device
            .allocate_arena(bytes)
            .map_err(|error| CudaError::InvalidArgument(format!("warm-up weight: {error}")))?;
        let result = self.warm_up_with(scratch.base, bytes);
        self.device.free_arena(scratch);
        result
    }

    fn warm_up_with(&self, weight: DevicePtr, bytes: u64) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: `weight` is a live arena of `bytes` bytes.
        unsafe { sys::cuMemsetD8_v2(weight.0, 0, bytes as usize) }
            .result()
            .map_err(CudaError::driver("cuMemsetD8"))?;
        self.reset()?;
        self.layer(weight)?;
        self.reset()?;
        self.device
            .compute_stream()
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))
    }

    /// Waits for the compute stream and copies the running activations back.
    pub fn read_output(&self) -> Result<Vec<f32>, CudaError> {
        let mut output = vec![0f32; self.batch * self.dim];
        let bytes = output.len() * std::mem::size_of::<f32>();
        self.device.bind()?;
        let stream = self.device.compute_stream();
        // SAFETY: `output` holds exactly `bytes` bytes and outlives the copy, which the
        // synchronize below completes before it is read or dropped. Ordered on the
        // compute stream, so it sees the step's last layer and does not wait for
        // prefetch copies on the copy stream.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                output.as_mut_ptr() as *mut c_void,
                self.buffers[1].base.0,
                bytes,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        Ok(output)
    }
}

impl Drop for LinearStackGpu {
    fn drop(&mut self) {
        for arena in self.buffers.drain(..) {
            self.device.free_arena(arena);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::{normalised_error, tolerance};
    use crate::model::demo::write_linear_stack;

    fn small_spec(blocks: u32, layers_per_block: u32, dim: u32) -> DemoSpec {
        DemoSpec {
            blocks,
            layers_per_block,
            dim,
            seed: 7,
        }
    }

    /// The whole stack through the per-layer CPU mirror, weights regenerated.
    fn mirror(spec: &DemoSpec, batch: usize, input: &[f32]) -> Vec<f32> {
        let dim = spec.dim as usize;
        let mut x = input.to_vec();
        let mut weight = vec![0f32; dim * dim];
        for block in 0..spec.blocks {
            for layer in 0..spec.layers_per_block {
                spec.fill_weight(block, layer, &mut weight);
                layer_cpu(&weight, dim, batch, &mut x).unwrap();
            }
        }
        x
    }

    #[test]
    fn the_mirror_of_the_gpu_layer_is_the_cpu_backends_function_bit_for_bit() {
        // Proves GEMM-then-rmsnorm, layer by layer in block order, is exactly what the
        // CPU backend's LinearStack::reference computes, with the same layer offsets.
        let dir = tempfile::tempdir().unwrap();
        let spec = small_spec(3, 2, 16);
        let path = write_linear_stack(dir.path(), &spec).unwrap();
        let index = ModelIndex::open(&path, None).unwrap();
        let batch = 5;
        let model = LinearStack::from_index(&index, batch).unwrap();
        let reference = model.reference(&index).unwrap();
        let input = model.activations().x;
        let ours = mirror(&spec, batch, &input);
        assert_eq!(ours.len(), reference.len());
        assert!(
            ours.iter()
                .zip(&reference)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "the mirror differs from LinearStack::reference"
        );
        let offsets = layer_offsets(&index, &spec).unwrap();
        let layer_bytes = spec.layer_bytes();
        assert_eq!(offsets.len(), 3);
        for block in &offsets {
            assert_eq!(block.len(), 2);
            assert_eq!(block[1] - block[0], layer_bytes);
        }
    }

    #[test]
    fn another_summation_order_stays_inside_the_tolerance_over_a_deep_stack() {
        // Proves the f32 tolerance holds with margin for a GPU-like difference (each
        // dot product summed in f64 and rounded, not in matrixmultiply's order) through
        // 64 layers, the demo's depth: rmsnorm keeps the differences from growing.
        let spec = small_spec(16, 4, 128);
        let (dim, batch) = (spec.dim as usize, 4);
        let input: Vec<f32> = (0..batch * dim)
            .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
            .collect();
        let reference = mirror(&spec, batch, &input);
        let mut x = input.clone();
        let mut weight = vec![0f32; dim * dim];
        let mut y = vec![0f32; batch * dim];
        for block in 0..spec.blocks {
            for layer in 0..spec.layers_per_block {
                spec.fill_weight(block, layer, &mut weight);
                for (row, out) in y.chunks_exact_mut(dim).enumerate() {
                    for (o, value) in out.iter_mut().enumerate() {
                        let dot: f64 = (0..dim)
                            .map(|i| f64::from(x[row * dim + i]) * f64::from(weight[o * dim + i]))
                            .sum();
                        *value = dot as f32;
                    }
                }
                rmsnorm_rows(&y, dim, &mut x).unwrap();
            }
        }
        let error = normalised_error(&reference, &x);
        println!("64 layers, other summation order: normalised error {error:.3e}");
        assert!(error > 0.0, "the orders should differ somewhere");
        assert!(error * 10.0 <= tolerance(DType::F32), "error {error}");
    }
}
