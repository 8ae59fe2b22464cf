//! The simulated device: the `Device` and `Storage` ports and the compute of a block on
//! virtual time, built from hardware profiles. The simulator that runs models on it
//! (`stagehand simulate`) is [`crate::simulate`].
//!
//! Everything timed runs on a current-thread tokio runtime started paused
//! ([`virtual_time_runtime`], [`virtual_time_system`]): a read takes
//! `bytes / disk bandwidth`, a copy `bytes / link bandwidth`, a block's compute a
//! modelled duration, and no bytes move. Hours of virtual time pass in milliseconds,
//! deterministically; jitter and faults come from a seeded [`FaultPlan`].
//!
//! All timed parts share one [`SimClock`], which keeps the exact timeline (tokio's
//! timers have millisecond ticks, and its paused clock runs [`TOKIO_SLOWDOWN`] times
//! slower than virtual time; see `clock.rs`). Read times from it, not from `Instant`,
//! and wait on tokio's clock only through [`tokio_duration`].

mod chaos;
mod clock;
mod compute;
mod device;
mod faults;
mod first_touch;
mod hardware;
mod kernel_costs;
mod machine;
mod shared;
mod storage;

pub use chaos::{ChaosCounts, ChaosDevice, ChaosPlan, ChaosStorage};
pub use clock::{tokio_duration, transfer_duration, SerialLane, SimClock, TOKIO_SLOWDOWN};
pub use compute::{ComputeRates, SimCompute};
pub use device::{CopyLabeler, CopyStats, LinkRates, SimDevice, SimDeviceSpec};
pub use faults::{FaultPlan, SplitMix64};
pub use first_touch::{FirstTouch, TouchedRanges};
pub use hardware::{
    CalibrationStamp, DiskSpec, GpuSpec, HardwareProfile, LinkSpec, ReadPath, UncachedRange,
    CALIBRATION_METHOD,
};
pub use kernel_costs::{dtype_of, KernelCosts, LinearRates, ThreadScaling};
pub use machine::SimMachine;
pub use shared::{Demand, SharedBus, SharedSpec};
pub use storage::{DiskRates, ReadCost, ReadStats, SimStorage};

/// A description file to parse: a shipped one by name (embedded in the binary), or a
/// user's file by path. Returns (name, source for errors, TOML text).
pub(crate) fn shipped_or_file(
    kind: &'static str,
    name_or_path: &str,
    shipped: &[(&'static str, &'static str)],
) -> Result<(String, String, String), SimError> {
    if let Some((name, text)) = shipped.iter().find(|(name, _)| *name == name_or_path) {
        return Ok((name.to_string(), "built-in".to_string(), text.to_string()));
    }
    let path = std::path::Path::new(name_or_path);
    if !path.is_file() {
        let known: Vec<&str> = shipped.iter().map(|(name, _)| *name).collect();
        return Err(SimError::UnknownProfile {
            kind,
            name: name_or_path.to_string(),
            known: known.join(", "),
        });
    }
    let source = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| SimError::Profile {
        file: source.clone(),
        message: error.to_string(),
    })?;
    let name = path.file_stem().map_or_else(
        || name_or_path.to_string(),
        |stem| stem.to_string_lossy().into_owned(),
    );
    Ok((name, source, text))
}

/// What can go wrong setting up a simulation.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the simulator must run inside its virtual-time runtime (sim::virtual_time_runtime)")]
    NoRuntime,
    #[error("could not build the virtual-time runtime: {0}")]
    Runtime(String),
    #[error("fault plan: `{key}`: {message}")]
    InvalidFaults { key: String, message: String },
    #[error("unknown {kind} `{name}`: not a shipped one ({known}) and not a file")]
    UnknownProfile {
        kind: &'static str,
        name: String,
        known: String,
    },
    #[error("{file}: {message}")]
    Profile { file: String, message: String },
}

/// A current-thread tokio runtime whose clock starts paused: time advances only when
/// every task waits, straight to the next timer.
pub fn virtual_time_runtime() -> Result<tokio::runtime::Runtime, SimError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|error| SimError::Runtime(error.to_string()))
}

/// An actix system on [`virtual_time_runtime`], for running the actors in virtual time.
pub fn virtual_time_system() -> Result<actix_rt::SystemRunner, SimError> {
    let runtime = virtual_time_runtime()?;
    Ok(actix_rt::System::with_tokio_rt(move || runtime))
}
