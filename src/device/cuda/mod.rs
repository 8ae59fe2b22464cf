//! The CUDA device adapter (DESIGN §4): `cuMemHostRegister` pins, a copy stream and a
//! compute stream with completion events, VRAM from `cuMemAlloc` and growable cast
//! buffers on virtual memory management, and the device-side workloads.
//!
//! Compiled everywhere: cudarc loads the CUDA libraries at run time, and every entry
//! point checks they are present first ([`library`]), so a machine without a GPU gets
//! a `CudaError` saying what to do, never a panic.

mod budget;
mod cast_buffer;
mod chunk_plan;
mod device;
mod error;
mod events;
mod library;
mod pinned;

pub use budget::{vram_budget, BudgetError, BudgetInputs, BudgetLimit, VramBudget};
pub use cast_buffer::CastBuffer;
pub use chunk_plan::{ChunkChange, ChunkPlan, ChunkPlanError};
pub use device::{device_count, CudaDevice};
pub use error::CudaError;
pub use events::Event;
pub use library::{libraries, require_cublas, require_driver, require_nvrtc, Libraries};
pub use pinned::{allocate_registered, register_buffer, HostRegistration};
