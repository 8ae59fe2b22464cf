//! The kernels' source compiled by NVRTC alone, without a GPU: what CI checks on every
//! change (`tests/nvrtc.rs`), for every architecture the adapter targets. NVRTC needs
//! only libnvrtc (the PyPI wheel `nvidia-cuda-nvrtc` ships it), not a driver.

use std::ffi::CString;

use super::error::CudaError;
use super::kernels::SOURCE;
use super::library::require_nvrtc;

/// The virtual architectures the adapter targets: Turing through Hopper (and, by the
/// driver's JIT from the newest of them, what comes after). The adapter loads PTX,
/// which the driver compiles for the GPU it runs on.
pub const TARGET_ARCHITECTURES: &[&str] = &[
    "compute_75",
    "compute_80",
    "compute_86",
    "compute_89",
    "compute_90",
];

/// What NVRTC said compiling the kernels for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub architecture: &'static str,
    /// The PTX produced.
    pub ptx: String,
    /// The compile log: warnings (empty when there are none).
    pub log: String,
}

/// Compiles the kernels' source (`kernels.cu`) for `architecture` with every warning on; an error carries the
/// log of what failed.
pub fn compile_for(architecture: &'static str) -> Result<Compiled, CudaError> {
    require_nvrtc()?;
    let nvrtc_error = |what: &str, error: cudarc::nvrtc::result::NvrtcError| CudaError::Nvrtc {
        kernel: "compute",
        log: format!("{what}: {error:?}"),
    };
    let source = CString::new(SOURCE).map_err(|_| CudaError::Nvrtc {
        kernel: "compute",
        log: "the kernel source holds a NUL byte".to_string(),
    })?;
    let program = cudarc::nvrtc::result::create_program(&source, None)
        .map_err(|error| nvrtc_error("nvrtcCreateProgram", error))?;
    let options = [format!("--gpu-architecture={architecture}")];
    // SAFETY: `program` was just created and is destroyed once below, after the log
    // and the PTX have been copied out of it.
    let compiled = unsafe { cudarc::nvrtc::result::compile_program(program, &options) };
    // SAFETY: as above; the log exists whether or not the compile succeeded.
    let log = unsafe { cudarc::nvrtc::result::get_program_log(program) }
        .map(|chars| text_of(&chars))
        .unwrap_or_default();
    // SAFETY: as above.
    let ptx = compiled.and_then(|()| unsafe { cudarc::nvrtc::result::get_ptx(program) });
    // SAFETY: `program` is not used after this.
    let _ = unsafe { cudarc::nvrtc::result::destroy_program(program) };
    let ptx = ptx.map_err(|error| CudaError::Nvrtc {
        kernel: "compute",
        log: format!("{architecture}: {error:?}\n{log}"),
    })?;
    Ok(Compiled {
        architecture,
        ptx: text_of(&ptx),
        log,
    })
}

/// NVRTC's NUL-terminated characters as text, trimmed.
fn text_of(chars: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = chars
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).trim().to_string()
}
