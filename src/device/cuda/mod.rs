//! The CUDA device adapter (DESIGN §4): the `Device` port (`cuMemHostRegister` pins, a
//! copy stream and a compute stream with completion events, VRAM from `cuMemAlloc`,
//! growable cast buffers on virtual memory management) and the `Compute` port
//! ([`CudaCompute`]: cuBLAS and NVRTC kernels on the compute stream).
//!
//! Compiled with the `cuda` feature: cudarc loads the CUDA libraries at run time, and
//! every entry point checks they are present first ([`libraries`], [`require_driver`]),
//! so a machine without a GPU gets a [`CudaError`] saying what to do, never a panic.
//! An adapter implements ports only: it never imports a model family or the run loop
//! (the run layer, `crate::run`, wires it to them).
//!
//! How the pieces fit:
//! - [`CudaDevice::open`]`(ordinal)` → the `Device` port (`allocate_arena` = `cuMemAlloc`,
//!   `allocate_pinned` = page-aligned `HostBuffer` + `cuMemHostRegister`,
//!   `copy_to_device` = async copy on the copy stream, resolved from its event).
//!   [`device_count`] answers `--device auto` without opening anything.
//! - [`CudaCompute::new`]`(&device)` → the `Compute` port on the same context and its
//!   compute stream; `memory_space()` of both is the context, so the session lets the
//!   compute read the blocks it holds.
//! - [`CudaDevice::vram_budget`] / [`vram_budget`]: total − reserve_vram − vram_headroom,
//!   capped by the driver's free − vram_headroom.
//! - [`CudaDevice::cast_buffer`] → [`CastBuffer`] (`grow_to`, `shrink_to`, `mapped_bytes`).
//! - [`bench::link_figures`]: pinned and pageable H2D, registration cost.
//! - [`pick_auto`]: what `--device auto` resolves to, with the line to print.

mod attention;
mod auto;
pub mod bench;
mod blas;
mod budget;
mod cast;
mod cast_buffer;
mod chunk_plan;
mod compute;
mod decoder;
mod device;
mod diffusion;
mod error;
mod events;
mod gemv;
mod kernels;
mod kernels_attention;
mod kernels_diffusion;
mod library;
mod memory;
pub mod nvrtc_check;
mod pinned;
mod products;
mod rows;
mod tensor;
mod timing;
mod warm_up;

pub use auto::{choose as choose_auto, pick_auto, AutoChoice};
pub use budget::{vram_budget, BudgetError, BudgetInputs, BudgetLimit, VramBudget};
pub use cast_buffer::CastBuffer;
pub use chunk_plan::{ChunkChange, ChunkPlan, ChunkPlanError};
pub use compute::CudaCompute;
pub use device::{device_count, memory_space_of, CudaDevice};
pub use error::CudaError;
pub use events::Event;
pub use library::{libraries, require_cublas, require_driver, require_nvrtc, Libraries};
pub use memory::Footprint;

/// The NVRTC source of every kernel the compute adapter launches.
pub fn kernel_source() -> &'static str {
    kernels::SOURCE
}
pub use pinned::{allocate_registered, register_buffer, HostRegistration};
pub use tensor::{CudaBlock, CudaTensor};
pub use timing::{CudaFence, DeviceTime};
