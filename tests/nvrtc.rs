//! Every CUDA kernel source compiles with NVRTC, for every architecture the CUDA
//! adapter targets, without an error or a warning. No GPU or driver is needed: NVRTC
//! comes from the PyPI wheel `nvidia-cuda-nvrtc`, which `scripts/test.sh` installs
//! (`scripts/install-nvrtc.sh`) and puts on `LD_LIBRARY_PATH`.
#![cfg(feature = "cuda")]

use stagehand::device::cuda::kernel_source;
use stagehand::device::cuda::libraries;
use stagehand::device::cuda::nvrtc_check::{compile_for, TARGET_ARCHITECTURES};

#[test]
fn every_kernel_compiles_for_every_target_architecture_without_a_warning() {
    assert!(
        libraries().nvrtc,
        "libnvrtc (CUDA 13) is not found: run the tests with scripts/test.sh, which installs the \
         nvidia-cuda-nvrtc wheel, or put its lib directory on LD_LIBRARY_PATH \
         (scripts/install-nvrtc.sh prints it)"
    );
    for &architecture in TARGET_ARCHITECTURES {
        let compiled =
            compile_for(architecture).unwrap_or_else(|error| panic!("{architecture}: {error}"));
        // Every kernel of the source is an entry of the module the adapter loads.
        let kernels = kernel_source().matches("__global__").count();
        assert!(kernels > 0);
        assert_eq!(
            compiled.ptx.matches(".entry ").count(),
            kernels,
            "{architecture}: the PTX lacks kernels"
        );
        assert!(
            compiled.log.is_empty(),
            "{architecture}: NVRTC warned:\n{}",
            compiled.log
        );
    }
}
