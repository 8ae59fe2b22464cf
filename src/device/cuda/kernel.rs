//! Compiling a small CUDA C kernel with NVRTC and loading it on a device.

use cudarc::driver::CudaFunction;

use super::device::CudaDevice;
use super::error::CudaError;
use super::library::require_nvrtc;

/// Compiles `source` (checking NVRTC is present first), loads it and returns `name`.
pub(super) fn compile(
    device: &CudaDevice,
    source: &str,
    name: &'static str,
) -> Result<CudaFunction, CudaError> {
    require_nvrtc()?;
    let ptx = cudarc::nvrtc::compile_ptx(source).map_err(|error| CudaError::Nvrtc {
        kernel: name,
        log: format!("{error:?}"),
    })?;
    let module = device
        .context()
        .load_module(ptx)
        .map_err(CudaError::driver("cuModuleLoadData"))?;
    module
        .load_function(name)
        .map_err(CudaError::driver("cuModuleGetFunction"))
}
