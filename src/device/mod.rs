//! Device adapters behind `stagehand_actors::Device`: `cpu` (the default), `sim`
//! (virtual time, in `crate::sim`) and `cuda`.

pub mod cpu;
pub mod cpu_compute;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod host_memory;

pub use cpu::CpuDevice;
pub use cpu_compute::CpuCompute;
