//! The machine's speed now against a profile's kernel table: the same product the
//! table holds, timed again as it was, so `validate` can say how far the machine moved
//! since its calibration.

use serde::Serialize;

use super::kernels::{measure_linear, KernelOptions};
use crate::compute::{Compute, DType};
use crate::sim::KernelCosts;

/// One product of the machine timed now beside the profile's figure for it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SpeedProbe {
    pub rows: u64,
    /// GFLOP/s measured now.
    pub gflops: f64,
    /// GFLOP/s the profile holds for the same product.
    pub profile_gflops: f64,
}

impl SpeedProbe {
    /// The machine's speed now over the profile's (1.0: as calibrated).
    pub fn ratio(&self) -> f64 {
        self.gflops / self.profile_gflops.max(1e-12)
    }
}

/// The rows [`speed_against`] times: a decode's product and a batch's.
pub const SPEED_PROBE_ROWS: [u64; 2] = [1, 64];

/// How fast this machine runs now against `costs` (a profile's table): an f32 1024²
/// product at 1 and 64 rows (`SPEED_PROBE_ROWS`), timed as the table was (on
/// `compute`'s threads, the weights cycled through 64 MiB of plain pages, the fastest
/// of two passes). On a shared VM the same binary ran the same resident step 1.42 ms
/// and 2.12 ms half an hour apart: a prediction from a profile is off by as much as the
/// machine moved since its calibration, which this shows.
pub fn speed_against<C: Compute>(
    compute: &C,
    costs: &KernelCosts,
) -> Result<Vec<SpeedProbe>, String> {
    let options = KernelOptions {
        dtypes: vec![DType::F32],
        sides: vec![1024],
        rows: SPEED_PROBE_ROWS.to_vec(),
        linear_passes: 2,
        cold: false,
        ..KernelOptions::full()
    };
    let mut fastest = [0f64; SPEED_PROBE_ROWS.len()];
    for _ in 0..options.linear_passes {
        let rates = measure_linear(compute, &options, DType::F32, 1024)
            .map_err(|error| error.to_string())?;
        for (kept, new) in fastest.iter_mut().zip(rates.gflops) {
            *kept = kept.max(new);
        }
    }
    Ok(SPEED_PROBE_ROWS
        .iter()
        .zip(fastest)
        .map(|(&rows, gflops)| SpeedProbe {
            rows,
            gflops,
            profile_gflops: costs.linear_gflops(rows, 1024 * 1024, DType::F32),
        })
        .collect())
}
