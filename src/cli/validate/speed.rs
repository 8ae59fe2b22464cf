//! The machine's speed now against the profile it is validated with: the same product
//! timed before and after the matrix beside the profile's figure for it, so a reader
//! can tell a model's miss from a machine that moved since its calibration.

use std::io::Write;

use serde::Serialize;
use stagehand::calibrate::{speed_against, SpeedProbe};
use stagehand::sim::HardwareProfile;

use super::ValidateDevice;

/// The probes before and after the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct Speed {
    pub before: Vec<SpeedProbe>,
    pub after: Vec<SpeedProbe>,
}

/// Times the probe products on the CPU backend with the threads the profile's table
/// was timed on; `None` on CUDA, for a profile without kernel costs, or when the
/// probe fails (said on stderr: the matrix still runs).
pub fn probe(profile: &HardwareProfile, device: ValidateDevice) -> Option<Vec<SpeedProbe>> {
    if device != ValidateDevice::Cpu {
        return None;
    }
    let costs = profile.compute.as_ref()?;
    let threads = costs.threads.map_or_else(
        || stagehand::calibrate::KernelOptions::full().compute_threads,
        |scaling| scaling.timed_on as usize,
    );
    let compute = stagehand::device::CpuCompute::with_threads(threads);
    match speed_against(&compute, costs) {
        Ok(probes) => Some(probes),
        Err(reason) => {
            eprintln!("validate: the speed probe did not run: {reason}");
            None
        }
    }
}

/// The line under the table: each probe's rate now over the profile's, before and
/// after the matrix.
pub fn write_speed(out: &mut impl Write, speed: &Speed) -> std::io::Result<()> {
    let ratios = |probes: &[SpeedProbe]| {
        probes
            .iter()
            .map(|probe| format!("×{:.2} at {} row(s)", probe.ratio(), probe.rows))
            .collect::<Vec<_>>()
            .join(", ")
    };
    writeln!(
        out,
        "this machine now against the profile (an f32 1024² product, timed as the profile's table was, over the profile's rate): {} before the matrix, {} after. A row's prediction is off by as much as the machine moved since its calibration; calibrate again when these stray from ×1.00",
        ratios(&speed.before),
        ratios(&speed.after)
    )
}
