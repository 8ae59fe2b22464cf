//! `stagehand config`: the effective settings and the layer that set each one; with
//! `--model M`, also what a `run` on M would use (the computed budgets, the staging
//! ring, the prefetch depth, the verification) and where each came from.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::run::{run_error, DEFAULT_BATCH, DEFAULT_STEPS};
use super::{CommandResult, Failure};
use stagehand::run::{effective_run, prepare_with, EffectiveValue, Extras, WorkloadKind};
use stagehand::settings::{self, display_value, Loaded, Origin, SettingsArgs};

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// Also show what `stagehand run --model PATH` would use: its budgets, staging
    /// ring, prefetch depth and verification, each with where it came from (the CPU
    /// backend's policy; on CUDA an unset vram_budget is the device's own).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// Print JSON: {"settings": {...}, "sources": {key: {"layer", "name", "note"}}},
    /// and with --model "run": [{"key", "value", "bytes", "from"}].
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    settings: &'a settings::Settings,
    sources: std::collections::BTreeMap<&'static str, &'a Origin>,
    #[serde(skip_serializing_if = "Option::is_none")]
    run: Option<&'a [EffectiveValue]>,
}

pub fn execute(args: ConfigArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let run = match &args.model {
        Some(model) => Some(run_on(model, &loaded)?),
        None => None,
    };
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let report = JsonReport {
            settings: &loaded.settings,
            sources: loaded.provenance.iter().collect(),
            run: run.as_deref(),
        };
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_table(&mut out, &loaded).and_then(|()| match (&run, &args.model) {
            (Some(run), Some(model)) => write_run(&mut out, model, run),
            _ => Ok(()),
        })
    };
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::run_failed),
    }
}

/// What `run --model model` would use: the model opened as `run` opens it (nothing is
/// computed), its budgets and depth from the same functions.
fn run_on(model: &std::path::Path, loaded: &Loaded) -> Result<Vec<EffectiveValue>, Failure> {
    let prepared = prepare_with(
        model,
        WorkloadKind::Auto,
        DEFAULT_BATCH,
        &loaded.settings,
        false,
        &Extras::default(),
    )
    .map_err(run_error)?;
    Ok(effective_run(&prepared, loaded, DEFAULT_STEPS))
}

fn write_table(out: &mut impl Write, loaded: &Loaded) -> std::io::Result<()> {
    let rows: Vec<(&str, String, String)> = loaded
        .provenance
        .iter()
        .map(|(key, origin)| {
            let source = match &origin.note {
                Some(note) => format!("{} ({note})", origin.source),
                None => origin.source.to_string(),
            };
            (key, display_value(&loaded.settings, key), source)
        })
        .collect();
    write_rows(out, ("setting", "value", "set by"), &rows)
}

fn write_run(
    out: &mut impl Write,
    model: &std::path::Path,
    run: &[EffectiveValue],
) -> std::io::Result<()> {
    writeln!(
        out,
        "\na run on {} (stagehand run --model …, {DEFAULT_STEPS} steps) would use:",
        model.display()
    )?;
    let rows: Vec<(&str, String, String)> = run
        .iter()
        .map(|value| (value.key, value.value.clone(), value.from.clone()))
        .collect();
    write_rows(out, ("figure", "value", "from"), &rows)
}

fn write_rows(
    out: &mut impl Write,
    (key_title, value_title, source_title): (&str, &str, &str),
    rows: &[(&str, String, String)],
) -> std::io::Result<()> {
    let key_width = rows.iter().map(|row| row.0.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|row| row.1.len()).max().unwrap_or(0);
    writeln!(
        out,
        "{key_title:<key_width$}  {value_title:<value_width$}  {source_title}"
    )?;
    for (key, value, source) in rows {
        writeln!(out, "{key:<key_width$}  {value:<value_width$}  {source}")?;
    }
    Ok(())
}
