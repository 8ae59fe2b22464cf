//! The CUDA device adapter (DESIGN §4): `cuMemHostRegister` pins, a copy stream and a
//! compute stream with completion events, VRAM from `cuMemAlloc` and growable cast
//! buffers on virtual memory management, and the device-side workloads.
//!
//! Compiled everywhere: cudarc loads the CUDA libraries at run time, and every entry
//! point checks they are present first ([`libraries`], [`require_driver`]), so a
//! machine without a GPU gets a [`CudaError`] saying what to do, never a panic.
//!
//! How the pieces fit (the session and the bench call these):
//! - [`CudaDevice::open`]`(ordinal)` → the `Device` port (`allocate_arena` = `cuMemAlloc`,
//!   `allocate_pinned` = page-aligned `HostBuffer` + `cuMemHostRegister`,
//!   `copy_to_device` = async copy on the copy stream, resolved from its event).
//!   [`device_count`] answers `--device auto` without opening anything.
//! - [`CudaDevice::vram_budget`] / [`vram_budget`]: total − reserve_vram − vram_headroom,
//!   capped by the driver's free − vram_headroom.
//! - [`CudaDevice::cast_buffer`] → [`CastBuffer`] (`grow_to`, `shrink_to`, `mapped_bytes`).
//! - Stream order: [`CudaDevice::record_compute_done`] + [`CudaDevice::copies_wait_for`]
//!   before overwriting a slot the compute may still read;
//!   [`CudaDevice::compute_waits_for_copies`]; [`CudaDevice::compute_done`] as a future.
//! - Workloads: [`CublasLinear::forward`] (checked against [`reference_forward`] within
//!   [`tolerance`]) and [`ChecksumKernel::checksum`] (equal to [`checksum_cpu`]).
//! - [`bench::link_figures`]: pinned and pageable H2D, registration cost.
//! - [`run::execute_cuda`]: `stagehand run --device cuda` (the session with this device,
//!   the CUDA driver loop, the linear stack as cuBLAS + [`RmsNormKernel`] checked against
//!   the CPU reference, stream-verify against [`expected_checksums_cuda`]).
//! - [`pick_auto`]: what `--device auto` resolves to, with the line to print.

mod auto;
pub mod bench;
mod budget;
mod cast_buffer;
mod checksum;
mod chunk_plan;
mod device;
mod error;
mod events;
mod floats;
mod kernel;
mod library;
mod linear;
mod pinned;
mod rmsnorm;

pub use auto::{choose as choose_auto, pick_auto, AutoChoice};
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
pub use rmsnorm::{rmsnorm_rows, RmsNormKernel, RMS_EPSILON};
