//! Placeholder: filled in by its owner.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {}

pub fn execute(_args: ConfigArgs) -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "`config_cmd` is not built yet"
    )))
}
