//! Presence checks for the shared libraries cudarc loads at run time.
//!
//! cudarc's dynamic loader panics, on the first call and on every later one, when a
//! library is missing. A machine without a GPU is normal for stagehand (CI, laptops,
//! `--device auto`), so every entry point of the adapter calls one of these first and
//! turns absence into a [`CudaError::LibraryMissing`] the user can act on.
//!
//! The driver (`libcuda`) is all `CudaDevice` needs; cuBLAS and NVRTC ship with the CUDA
//! toolkit, not the driver, so they are checked only by the workloads that use them.

use std::sync::OnceLock;

use super::error::CudaError;

/// Which libraries this process can load. Probed once: each probe is a `dlopen`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Libraries {
    pub driver: bool,
    pub cublas: bool,
    pub nvrtc: bool,
}

/// The probe result, cached for the life of the process.
pub fn libraries() -> Libraries {
    static PROBED: OnceLock<Libraries> = OnceLock::new();
    *PROBED.get_or_init(|| {
        // SAFETY: each probe only tries `dlopen` on cudarc's candidate names and drops
        // the handle; it runs no library code beyond the loader's initialisers.
        unsafe {
            Libraries {
                driver: cudarc::driver::sys::is_culib_present(),
                cublas: cudarc::cublas::sys::is_culib_present(),
                nvrtc: cudarc::nvrtc::sys::is_culib_present(),
            }
        }
    })
}

/// Errors unless the CUDA driver library can be loaded.
pub fn require_driver() -> Result<(), CudaError> {
    if libraries().driver {
        return Ok(());
    }
    Err(CudaError::LibraryMissing {
        library: "libcuda",
        what: "the NVIDIA driver library",
        hint: "this machine has no NVIDIA driver installed or visible; install the driver, \
               or run with --device cpu (or --device auto to fall back automatically)",
    })
}

/// Errors unless cuBLAS can be loaded (needed by the linear-stack workload).
pub fn require_cublas() -> Result<(), CudaError> {
    if libraries().cublas {
        return Ok(());
    }
    Err(CudaError::LibraryMissing {
        library: "libcublas",
        what: "cuBLAS, part of the CUDA toolkit",
        hint: "install the CUDA 13 toolkit's libcublas (or add its lib directory to \
               LD_LIBRARY_PATH); the driver alone does not ship it",
    })
}

/// Errors unless NVRTC can be loaded (needed by the stream-verify checksum kernel).
pub fn require_nvrtc() -> Result<(), CudaError> {
    if libraries().nvrtc {
        return Ok(());
    }
    Err(CudaError::LibraryMissing {
        library: "libnvrtc",
        what: "NVRTC, the CUDA runtime compiler",
        hint: "install the CUDA 13 toolkit's libnvrtc (or add its lib directory to \
               LD_LIBRARY_PATH); the driver alone does not ship it",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_libraries_give_errors_that_say_what_to_do() {
        // Proves each check agrees with the probe and that a failure names the library
        // and a way out, whichever machine this runs on.
        let present = libraries();
        let checks = [
            (present.driver, require_driver(), "libcuda", "--device cpu"),
            (present.cublas, require_cublas(), "libcublas", "toolkit"),
            (present.nvrtc, require_nvrtc(), "libnvrtc", "toolkit"),
        ];
        for (is_present, result, library, hint) in checks {
            match result {
                Ok(()) => assert!(is_present, "{library} reported present but probe said no"),
                Err(error) => {
                    assert!(!is_present, "{library} probe said present but check failed");
                    let message = error.to_string();
                    assert!(message.contains(library), "{message}");
                    assert!(message.contains(hint), "{message}");
                }
            }
        }
    }
}
