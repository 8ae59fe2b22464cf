//! The CUDA adapter's errors. Every variant's message says what went wrong and what
//! to do about it, because these reach users who only asked for `--device cuda`.

use cudarc::cublas::result::CublasError;
use cudarc::driver::sys::cudaError_enum;
use cudarc::driver::DriverError;
use stagehand_actors::{DeviceError, HostAllocError};

use super::budget::BudgetError;
use super::chunk_plan::ChunkPlanError;

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A shared library cudarc would load is not on this machine. cudarc panics in this
    /// case, so we check first and report it here instead.
    #[error("{library} not found ({what}): {hint}")]
    LibraryMissing {
        library: &'static str,
        what: &'static str,
        hint: &'static str,
    },
    /// The driver is there but has no device for us.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    #[error("CUDA driver call {call} failed: {source}")]
    Driver {
        call: &'static str,
        source: DriverError,
    },
    #[error("cuBLAS call {call} failed: {source}")]
    Cublas {
        call: &'static str,
        source: CublasError,
    },
    #[error("NVRTC could not compile the {kernel} kernel: {log}")]
    Nvrtc { kernel: &'static str, log: String },
    #[error(transparent)]
    Budget(#[from] BudgetError),
    #[error("cast buffer: {0}")]
    CastBuffer(#[from] ChunkPlanError),
    #[error(transparent)]
    HostAlloc(#[from] HostAllocError),
    /// The caller passed something the device cannot work with (sizes, pointers).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl CudaError {
    /// Wraps a driver error with the name of the call that returned it.
    pub fn driver(call: &'static str) -> impl FnOnce(DriverError) -> CudaError {
        move |source| CudaError::Driver { call, source }
    }

    pub fn cublas(call: &'static str) -> impl FnOnce(CublasError) -> CudaError {
        move |source| CudaError::Cublas { call, source }
    }

    /// True when the driver said it ran out of device memory.
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            CudaError::Driver {
                source: DriverError(cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY),
                ..
            }
        )
    }
}

impl From<CudaError> for DeviceError {
    fn from(error: CudaError) -> Self {
        match error {
            CudaError::LibraryMissing { .. } | CudaError::NoDevice(_) => {
                DeviceError::Unavailable(error.to_string())
            }
            other => DeviceError::Other(other.to_string()),
        }
    }
}
