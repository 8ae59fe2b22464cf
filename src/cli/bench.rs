//! Placeholder: `stagehand bench`, filled in by the pipeline work.

use super::{CommandResult, Failure};

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub target: Option<BenchTarget>,
}

#[derive(Debug, clap::Subcommand)]
pub enum BenchTarget {
    /// Read throughput of buffered pread, O_DIRECT through the staging ring and mmap, against dd.
    Disk(super::bench_disk::BenchDiskArgs),
}

pub fn execute(args: BenchArgs) -> CommandResult {
    match args.target {
        Some(BenchTarget::Disk(disk)) => super::bench_disk::execute(disk),
        None => Err(Failure::bad_input(anyhow::anyhow!(
            "`bench` is not built yet"
        ))),
    }
}
