//! Placeholder: `stagehand bench disk FILE`, filled in by the fast-disk work.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct BenchDiskArgs {}

pub fn execute(_args: BenchDiskArgs) -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "`bench disk` is not built yet"
    )))
}
