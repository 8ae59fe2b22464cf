//! Placeholder: filled in by its owner.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct InspectArgs {}

pub fn execute(_args: InspectArgs) -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "`inspect` is not built yet"
    )))
}
