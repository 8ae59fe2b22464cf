//! `stagehand inspect PATH [--json]`: a checkpoint's files, tensors and block split.
//!
//! The `--json` output is a stable interface for scripts (documented in docs/models.md):
//! fields may be added, never renamed or removed, without bumping `schema`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::{CommandResult, Failure};
use stagehand::model::ModelIndex;
use stagehand::settings::{self, SettingsArgs};

/// Version of the `--json` layout.
const JSON_SCHEMA: u32 = 1;

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// A .safetensors file, a folder of shards, or a *.safetensors.index.json.
    #[arg(value_name = "PATH")]
    pub path: PathBuf,
    /// Print machine-readable JSON (schema in docs/models.md) instead of tables.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Serialize)]
struct Report<'a> {
    schema: u32,
    path: &'a std::path::Path,
    files: Vec<FileReport<'a>>,
    tensor_count: usize,
    dtypes: Vec<DtypeReport>,
    total_bytes: u64,
    largest_block: Option<BlockSummary<'a>>,
    metadata: &'a BTreeMap<String, String>,
    blocks: Vec<BlockReport<'a>>,
    tensors: &'a [stagehand::model::TensorInfo],
}

#[derive(Serialize)]
struct FileReport<'a> {
    path: &'a std::path::Path,
    bytes: u64,
    header_bytes: u64,
    tensors: usize,
}

#[derive(Serialize)]
struct DtypeReport {
    dtype: String,
    tensors: usize,
    bytes: u64,
}

#[derive(Serialize)]
struct BlockSummary<'a> {
    name: &'a str,
    bytes: u64,
}

#[derive(Serialize)]
struct BlockReport<'a> {
    name: &'a str,
    index: Option<u64>,
    bytes: u64,
    tensors: usize,
    experts: usize,
    extents: &'a [stagehand_actors::Extent],
}

pub fn execute(args: InspectArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let pattern = loaded.settings.block_pattern.as_deref();
    let index = ModelIndex::open(&args.path, pattern).map_err(Failure::bad_input)?;
    let report = build_report(&index);
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_tables(&mut out, &report)
    };
    match written {
        // `inspect | head` closing the pipe early is not a failure.
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::run_failed),
    }
}

fn build_report(index: &ModelIndex) -> Report<'_> {
    let mut tensors_per_file = vec![0usize; index.files.len()];
    let mut dtypes: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for tensor in &index.tensors {
        if let Some(count) = tensors_per_file.get_mut(tensor.file) {
            *count += 1;
        }
        let entry = dtypes.entry(tensor.dtype.as_str()).or_default();
        entry.0 += 1;
        entry.1 += tensor.bytes;
    }
    let blocks = index
        .blocks
        .iter()
        .map(|block| {
            let mut experts: Vec<u32> = block
                .tensors
                .iter()
                .filter_map(|&tensor| index.tensors.get(tensor)?.expert)
                .collect();
            experts.sort_unstable();
            experts.dedup();
            BlockReport {
                name: &block.name,
                index: block.index,
                bytes: block.bytes,
                tensors: block.tensors.len(),
                experts: experts.len(),
                extents: &block.extents,
            }
        })
        .collect();
    Report {
        schema: JSON_SCHEMA,
        path: &index.path,
        files: index
            .files
            .iter()
            .zip(tensors_per_file)
            .map(|(file, tensors)| FileReport {
                path: &file.path,
                bytes: file.bytes,
                header_bytes: file.header_bytes,
                tensors,
            })
            .collect(),
        tensor_count: index.tensors.len(),
        dtypes: dtypes
            .into_iter()
            .map(|(dtype, (tensors, bytes))| DtypeReport {
                dtype: dtype.to_string(),
                tensors,
                bytes,
            })
            .collect(),
        total_bytes: index.total_bytes(),
        largest_block: index.largest_block().map(|block| BlockSummary {
            name: &block.name,
            bytes: block.bytes,
        }),
        metadata: &index.metadata,
        blocks,
        tensors: &index.tensors,
    }
}

fn size(bytes: u64) -> String {
    stagehand_actors::Bytes(bytes).to_string()
}

fn write_tables(out: &mut impl Write, report: &Report<'_>) -> std::io::Result<()> {
    writeln!(out, "model    {}", report.path.display())?;
    writeln!(out, "files    {}", report.files.len())?;
    for (position, file) in report.files.iter().enumerate() {
        writeln!(
            out,
            "  [{position}] {}  {} ({} tensors, header {} bytes)",
            file.path.display(),
            size(file.bytes),
            file.tensors,
            file.header_bytes
        )?;
    }
    writeln!(out, "tensors  {}", report.tensor_count)?;
    let dtypes: Vec<String> = report
        .dtypes
        .iter()
        .map(|dtype| format!("{} x{} ({})", dtype.dtype, dtype.tensors, size(dtype.bytes)))
        .collect();
    writeln!(out, "dtypes   {}", dtypes.join(", "))?;
    writeln!(
        out,
        "total    {} ({} bytes) in {} blocks",
        size(report.total_bytes),
        report.total_bytes,
        report.blocks.len()
    )?;
    if let Some(largest) = &report.largest_block {
        writeln!(
            out,
            "largest  {} ({}, {} bytes)",
            largest.name,
            size(largest.bytes),
            largest.bytes
        )?;
    }
    if !report.metadata.is_empty() {
        let pairs: Vec<String> = report
            .metadata
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        writeln!(out, "metadata {}", pairs.join(" "))?;
    }
    let name_width = report
        .blocks
        .iter()
        .map(|block| block.name.len())
        .max()
        .unwrap_or(0)
        .max("block".len());
    writeln!(out)?;
    writeln!(
        out,
        "{:>5}  {:<name_width$}  {:>7}  {:>7}  {:>12}  {:>14}",
        "#", "block", "tensors", "extents", "size", "bytes"
    )?;
    for (position, block) in report.blocks.iter().enumerate() {
        let experts = match block.experts {
            0 => String::new(),
            count => format!("  ({count} experts)"),
        };
        writeln!(
            out,
            "{position:>5}  {:<name_width$}  {:>7}  {:>7}  {:>12}  {:>14}{experts}",
            block.name,
            block.tensors,
            block.extents.len(),
            size(block.bytes),
            block.bytes
        )?;
    }
    Ok(())
}
