//! Placeholder: filled in by its owner.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct DemoModelArgs {}

pub fn execute(_args: DemoModelArgs) -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "`demo_model` is not built yet"
    )))
}
