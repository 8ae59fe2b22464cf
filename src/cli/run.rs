//! Placeholder: `stagehand run`, filled in by the pipeline work.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct RunArgs {}

pub fn execute(_args: RunArgs) -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "`run` is not built yet"
    )))
}
