//! Placeholder: filled in by its owner.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct SimulateArgs {}

pub fn execute(_args: SimulateArgs) -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "`simulate` is not built yet"
    )))
}
