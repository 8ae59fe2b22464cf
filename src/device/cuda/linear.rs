//! The linear-stack forward pass on the GPU with cuBLAS, and the CPU reference it is
//! checked against.
//!
//! A layer is PyTorch's bias-free `nn.Linear`: weight `W` row-major `[out, in]`,
//! activations row-major `[batch, in]`, `y = x · Wᵀ`. f32 runs `cublasSgemm`; f16 and
//! bf16 run `cublasGemmEx` with f32 accumulation and half-precision inputs and outputs.
//!
//! **Tolerance** (max |gpu − cpu| over max |cpu|, for stacks up to 8 layers of width up
//! to 4096): f32 1e-4, f16 5e-3, bf16 3e-2. The reference accumulates in f32 and rounds
//! each layer's output to the storage type like the GPU does, so the only differences
//! are summation order (f32: ~1e-6 at k = 4096) and the occasional one-ulp flip of a
//! rounded output that the next layers carry (f16 ulp 2^-10, bf16 ulp 2^-7).

use std::ffi::c_void;

use cudarc::cublas::{result as cublas_result, sys as cublas_sys, CudaBlas};
use stagehand_actors::DevicePtr;

use super::device::CudaDevice;
use super::error::CudaError;
use super::floats::DType;
use super::library::require_cublas;

/// Largest accepted normalised error between the GPU and the CPU reference.
pub fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-4,
        DType::F16 => 5e-3,
        DType::Bf16 => 3e-2,
    }
}

/// max |actual − reference| / max |reference| (or the plain max difference when the
/// reference is all zeros). Lengths must match; a mismatch is infinitely wrong.
pub fn normalised_error(reference: &[f32], actual: &[f32]) -> f32 {
    if reference.len() != actual.len() {
        return f32::INFINITY;
    }
    let scale = reference
        .iter()
        .fold(0f32, |max, value| max.max(value.abs()));
    let difference = reference
        .iter()
        .zip(actual)
        .fold(0f32, |max, (expected, got)| {
            let delta = (expected - got).abs();
            if delta.is_nan() {
                f32::INFINITY
            } else {
                max.max(delta)
            }
        });
    if scale > 0.0 {
        difference / scale
    } else {
        difference
    }
}

/// One layer's shape, for either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerShape {
    pub in_features: usize,
    pub out_features: usize,
}

/// A layer whose weight is already in VRAM (a resident slot or a cast buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceLayer {
    pub weight: DevicePtr,
    pub shape: LayerShape,
}

fn check_chain(
    shapes: impl Iterator<Item = LayerShape>,
    input_features: usize,
) -> Result<usize, CudaError> {
    let mut features = input_features;
    for (index, shape) in shapes.enumerate() {
        if shape.in_features != features || shape.in_features == 0 || shape.out_features == 0 {
            return Err(CudaError::InvalidArgument(format!(
                "layer {index} takes {} inputs ({} outputs) but receives {features}",
                shape.in_features, shape.out_features
            )));
        }
        features = shape.out_features;
    }
    Ok(features)
}

/// The CPU reference: f32 GEMMs, each output rounded to `dtype`. `weights[i]` holds
/// `out × in` values already representable in `dtype` (i.e. passed through
/// [`DType::round`]), as are the `batch × in` inputs.
pub fn reference_forward(
    weights: &[(&[f32], LayerShape)],
    dtype: DType,
    batch: usize,
    input: &[f32],
) -> Result<Vec<f32>, CudaError> {
    let first_features = weights.first().map_or(0, |(_, shape)| shape.in_features);
    check_chain(weights.iter().map(|(_, shape)| *shape), first_features)?;
    if input.len() != batch * first_features {
        return Err(CudaError::InvalidArgument(format!(
            "input holds {} values, expected batch {batch} × {first_features}",
            input.len()
        )));
    }
    let mut activations = input.to_vec();
    for (index, (weight, shape)) in weights.iter().enumerate() {
        if weight.len() != shape.in_features * shape.out_features {
            return Err(CudaError::InvalidArgument(format!(
                "layer {index} weight holds {} values, expected {} × {}",
                weight.len(),
                shape.out_features,
                shape.in_features
            )));
        }
        let mut output = vec![0f32; batch * shape.out_features];
        let (k, n) = (shape.in_features, shape.out_features);
        // SAFETY: the strides describe `activations` as batch × k, `weight` read as its
        // transpose (k × n) and `output` as batch × n; all three lengths were checked.
        unsafe {
            matrixmultiply::sgemm(
                batch,
                k,
                n,
                1.0,
                activations.as_ptr(),
                k as isize,
                1,
                weight.as_ptr(),
                1,
                k as isize,
                0.0,
                output.as_mut_ptr(),
                n as isize,
                1,
            );
        }
        if dtype != DType::F32 {
            output
                .iter_mut()
                .for_each(|value| *value = dtype.round(*value));
        }
        activations = output;
    }
    Ok(activations)
}

/// cuBLAS bound to the device's compute stream.
pub struct CublasLinear {
    blas: CudaBlas,
}

fn to_c_int(value: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(value)
        .map_err(|_| CudaError::InvalidArgument(format!("{what} {value} is too large for cuBLAS")))
}

impl CublasLinear {
    /// Checks that cuBLAS is installed before cudarc touches it.
    pub fn new(device: &CudaDevice) -> Result<Self, CudaError> {
        require_cublas()?;
        let blas = CudaBlas::new(device.compute_stream().clone())
            .map_err(CudaError::cublas("cublasCreate"))?;
        Ok(Self { blas })
    }

    /// Queues `output[batch, out] = input[batch, in] · weightᵀ` on the compute stream.
    pub fn linear(
        &self,
        dtype: DType,
        layer: DeviceLayer,
        batch: usize,
        input: DevicePtr,
        output: DevicePtr,
    ) -> Result<(), CudaError> {
        let m = to_c_int(layer.shape.out_features, "out_features")?;
        let n = to_c_int(batch, "batch")?;
        let k = to_c_int(layer.shape.in_features, "in_features")?;
        let handle = *self.blas.handle();
        let (alpha, beta) = (1f32, 0f32);
        // Row-major y = x·Wᵀ is column-major yᵀ = W·xᵀ, where the row-major W read as
        // column-major is Wᵀ (k × m, leading dimension k): hence op(A) = T on W.
        let transpose = cublas_sys::cublasOperation_t::CUBLAS_OP_T;
        let plain = cublas_sys::cublasOperation_t::CUBLAS_OP_N;
        let weight = layer.weight.0 as *const c_void;
        let input = input.0 as *const c_void;
        let output = output.0 as *mut c_void;
        // SAFETY: the caller guarantees the three device ranges hold m×k, k×n and m×n
        // elements of `dtype` and stay allocated until the compute stream passes this
        // GEMM; alpha and beta are host scalars (the handle's default pointer mode).
        let queued = unsafe {
            match dtype {
                DType::F32 => cublas_result::sgemm(
                    handle,
                    transpose,
                    plain,
                    m,
                    n,
                    k,
                    &alpha,
                    weight as *const f32,
                    k,
                    input as *const f32,
                    k,
                    &beta,
                    output as *mut f32,
                    m,
                ),
                DType::F16 | DType::Bf16 => {
                    let data_type = if dtype == DType::F16 {
                        cublas_sys::cudaDataType::CUDA_R_16F
                    } else {
                        cublas_sys::cudaDataType::CUDA_R_16BF
                    };
                    cublas_result::gemm_ex(
                        handle,
                        transpose,
                        plain,
                        m,
                        n,
                        k,
                        &alpha as *const f32 as *const c_void,
                        weight,
                        data_type,
                        k,
                        input,
                        data_type,
                        k,
                        &beta as *const f32 as *const c_void,
                        output,
                        data_type,
                        m,
                        cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                        cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DFALT,
                    )
                }
            }
        };
        queued.map_err(CudaError::cublas(if dtype == DType::F32 {
            "cublasSgemm"
        } else {
            "cublasGemmEx"
        }))
    }

    /// Queues the whole stack. Layer `i` reads `activations[i % 2]` and writes
    /// `activations[(i + 1) % 2]`; the input must be in `activations[0]`, and both
    /// buffers must hold `batch × widest layer` elements. Returns the buffer that holds
    /// the output. Nothing waits: record compute-done to know when it is there.
    pub fn forward(
        &self,
        dtype: DType,
        layers: &[DeviceLayer],
        batch: usize,
        activations: [DevicePtr; 2],
    ) -> Result<DevicePtr, CudaError> {
        let Some(first) = layers.first() else {
            return Ok(activations[0]);
        };
        check_chain(
            layers.iter().map(|layer| layer.shape),
            first.shape.in_features,
        )?;
        if activations[0] == activations[1] {
            return Err(CudaError::InvalidArgument(
                "the two activation buffers must differ: a GEMM cannot run in place".to_string(),
            ));
        }
        for (index, layer) in layers.iter().enumerate() {
            self.linear(
                dtype,
                *layer,
                batch,
                activations[index % 2],
                activations[(index + 1) % 2],
            )?;
        }
        Ok(activations[layers.len() % 2])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reference_computes_x_times_w_transposed() {
        // Proves the CPU reference's layout: y[b][o] = Σ_i x[b][i] · W[o][i].
        let shape = LayerShape {
            in_features: 3,
            out_features: 2,
        };
        let weight = [1.0, 2.0, 3.0, 0.0, -1.0, 0.5];
        let input = [1.0, 1.0, 1.0, 2.0, 0.0, -2.0];
        let output = reference_forward(&[(&weight, shape)], DType::F32, 2, &input).unwrap();
        assert_eq!(output, vec![6.0, -0.5, -4.0, -1.0]);
    }

    #[test]
    fn the_reference_rounds_each_layer_to_the_storage_type() {
        // Proves half-precision outputs are rounded after every layer, as GemmEx stores.
        let shape = LayerShape {
            in_features: 1,
            out_features: 1,
        };
        let third = DType::Bf16.round(1.0 / 3.0);
        let output = reference_forward(
            &[(&[third], shape), (&[3.0], shape)],
            DType::Bf16,
            1,
            &[1.0],
        )
        .unwrap();
        assert_eq!(output, vec![DType::Bf16.round(third * 3.0)]);
    }

    #[test]
    fn mismatched_layers_are_refused_with_the_layer_named() {
        // Proves a stack whose widths do not chain is an error, not garbage.
        let a = LayerShape {
            in_features: 4,
            out_features: 8,
        };
        let b = LayerShape {
            in_features: 4,
            out_features: 4,
        };
        let error = reference_forward(
            &[(&[0.0; 32], a), (&[0.0; 16], b)],
            DType::F32,
            1,
            &[0.0; 4],
        )
        .unwrap_err();
        assert!(error.to_string().contains("layer 1"), "{error}");
        let error = reference_forward(&[(&[0.0; 32], a)], DType::F32, 2, &[0.0; 4]).unwrap_err();
        assert!(error.to_string().contains("batch 2"), "{error}");
    }

    #[test]
    fn the_error_measure_is_relative_to_the_largest_value() {
        // Proves normalised_error scales by the reference's magnitude and flags NaN.
        assert_eq!(normalised_error(&[2.0, -4.0], &[2.0, -4.0]), 0.0);
        assert!((normalised_error(&[2.0, -4.0], &[2.4, -4.0]) - 0.1).abs() < 1e-6);
        assert_eq!(normalised_error(&[0.0], &[0.5]), 0.5);
        assert_eq!(normalised_error(&[1.0], &[f32::NAN]), f32::INFINITY);
        assert_eq!(normalised_error(&[1.0], &[]), f32::INFINITY);
        assert!(tolerance(DType::F32) < tolerance(DType::F16));
        assert!(tolerance(DType::F16) < tolerance(DType::Bf16));
    }
}
