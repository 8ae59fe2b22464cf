//! The CUDA device adapter (DESIGN §4): `cuMemHostRegister` pins, a copy stream and a
//! compute stream with completion events, VRAM from `cuMemAlloc` and growable cast
//! buffers on virtual memory management, and the device-side workloads.
//!
//! Compiled everywhere: cudarc loads the CUDA libraries at run time, and every entry
//! point checks they are present first ([`library`]), so a machine without a GPU gets
//! a `CudaError` saying what to do, never a panic.

pub mod bench;
mod budget;
mod cast_buffer;
mod checksum;
mod chunk_plan;
mod device;
mod error;
mod events;
mod floats;
mod library;
mod linear;
mod pinned;

pub use budget::{vram_budget, BudgetError, BudgetInputs, BudgetLimit, VramBudget};
pub use cast_buffer::CastBuffer;
pub use checksum::{
    checksum_cpu, finish as finish_checksum, partial_sum as checksum_partial_sum, ChecksumKernel,
};
pub use chunk_plan::{ChunkChange, ChunkPlan, ChunkPlanError};
pub use device::{device_count, CudaDevice};
pub use error::CudaError;
pub use events::Event;
pub use floats::DType;
pub use library::{libraries, require_cublas, require_driver, require_nvrtc, Libraries};
pub use linear::{
    normalised_error, reference_forward, tolerance, CublasLinear, DeviceLayer, LayerShape,
};
pub use pinned::{allocate_registered, register_buffer, HostRegistration};
