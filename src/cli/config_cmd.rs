//! `stagehand config`: the effective settings and the layer that set each one.

use std::io::Write;

use serde::Serialize;

use super::{CommandResult, Failure};
use stagehand::settings::{self, display_value, Loaded, Origin, SettingsArgs};

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    /// Print JSON: {"settings": {...}, "sources": {key: {"layer", "name", "note"}}}.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    settings: &'a settings::Settings,
    sources: std::collections::BTreeMap<&'static str, &'a Origin>,
}

pub fn execute(args: ConfigArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let mut out = std::io::stdout().lock();
    let written = if args.json {
        let report = JsonReport {
            settings: &loaded.settings,
            sources: loaded.provenance.iter().collect(),
        };
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write_table(&mut out, &loaded)
    };
    match written {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(Failure::run_failed),
    }
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
    let key_width = rows.iter().map(|row| row.0.len()).max().unwrap_or(0);
    let value_width = rows.iter().map(|row| row.1.len()).max().unwrap_or(0);
    writeln!(
        out,
        "{:<key_width$}  {:<value_width$}  set by",
        "setting", "value"
    )?;
    for (key, value, source) in rows {
        writeln!(out, "{key:<key_width$}  {value:<value_width$}  {source}")?;
    }
    Ok(())
}
