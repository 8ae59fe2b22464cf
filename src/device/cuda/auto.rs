//! `--device auto`: CUDA when the driver sees a device, else the CPU backend, said once
//! at the start of `run` and `bench`.

use crate::settings::DeviceKind;

use super::device::device_count;
use super::error::CudaError;

/// What `--device auto` resolved to, and the one line to print about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoChoice {
    /// `DeviceKind::Cuda` or `DeviceKind::Cpu`.
    pub device: DeviceKind,
    pub message: String,
}

/// Probes the driver (never panics, opens no context) and picks the backend.
pub fn pick_auto() -> AutoChoice {
    choose(device_count())
}

/// The decision, apart from the probe so it can be tested on any machine.
pub fn choose(count: Result<usize, CudaError>) -> AutoChoice {
    match count {
        Ok(count) if count > 0 => AutoChoice {
            device: DeviceKind::Cuda,
            message: format!(
                "device auto: {count} CUDA device(s) found, using cuda:0 (--device cpu to use the CPU backend)"
            ),
        },
        Ok(_) => AutoChoice {
            device: DeviceKind::Cpu,
            message: "device auto: the NVIDIA driver sees no GPU, using the CPU backend"
                .to_string(),
        },
        Err(error) => AutoChoice {
            device: DeviceKind::Cpu,
            message: format!("device auto: no usable CUDA ({}), using the CPU backend", {
                match error {
                    CudaError::LibraryMissing { library, .. } => format!("{library} not found"),
                    other => other.to_string(),
                }
            }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_present_device_picks_cuda_and_anything_else_the_cpu() {
        // Proves auto chooses CUDA only with at least one device, and every line says
        // which backend runs.
        let cuda = choose(Ok(2));
        assert_eq!(cuda.device, DeviceKind::Cuda);
        assert!(cuda.message.contains("2 CUDA device(s)") && cuda.message.contains("cuda:0"));
        let none = choose(Ok(0));
        assert_eq!(none.device, DeviceKind::Cpu);
        assert!(none.message.contains("CPU backend"));
        let missing = choose(Err(CudaError::LibraryMissing {
            library: "libcuda",
            what: "the driver",
            hint: "install it",
        }));
        assert_eq!(missing.device, DeviceKind::Cpu);
        assert!(
            missing.message.contains("libcuda not found"),
            "{}",
            missing.message
        );
    }

    #[test]
    fn the_probe_on_this_machine_agrees_with_the_device_count() {
        // Proves pick_auto never panics and matches device_count, whatever the machine.
        let choice = pick_auto();
        let expected = match device_count() {
            Ok(count) if count > 0 => DeviceKind::Cuda,
            _ => DeviceKind::Cpu,
        };
        assert_eq!(choice.device, expected, "{}", choice.message);
    }
}
