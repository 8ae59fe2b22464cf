//! `stagehand bench --device cuda`: the GPU link figures.

use super::{CommandResult, Failure};
use crate::device::cuda::{bench::link_figures, CudaDevice};
use crate::settings::Settings;

/// Bytes each link loop moves.
const LINK_BYTES: u64 = 1 << 30;

pub fn execute(_settings: &Settings, json: bool) -> CommandResult {
    let device = CudaDevice::open(0).map_err(Failure::bad_input)?;
    let figures = link_figures(&device, LINK_BYTES).map_err(Failure::run_failed)?;
    if json {
        let text = serde_json::to_string_pretty(&figures).map_err(Failure::run_failed)?;
        println!("{text}");
    } else {
        println!("{}", figures.to_markdown());
    }
    Ok(())
}
