//! Log lines and progress on stderr, dressed for where stderr goes.
//!
//! Colour codes help a person at a terminal and garble everything else (a CI log, a
//! file, a pipe): log lines are coloured only when stderr is a terminal and
//! `NO_COLOR` is unset or empty (<https://no-color.org>). Progress follows the same
//! rule: a live bar or status line on a terminal, a plain log line otherwise.

use std::io::IsTerminal;

/// Whether stderr is a terminal a person is watching.
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// Colour on stderr: a terminal, and no `NO_COLOR`.
pub fn colour_on_stderr() -> bool {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|value| !value.is_empty());
    stderr_is_terminal() && !no_color
}

pub fn init_logging(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        // A full or closed stderr drops log lines; reporting that would panic.
        .log_internal_errors(false)
        .with_target(false)
        .try_init();
}

/// Logs, once at `info`, what loading did to the settings the user wrote: a decimal
/// size shown in binary units ("vram_budget: 2GB = 1.86 GiB"), a value raised to its
/// minimum. Called right after [`init_logging`].
pub fn log_setting_notes(provenance: &stagehand::settings::Provenance) {
    for (key, note) in provenance.notes() {
        tracing::info!("{key}: {note}");
    }
}
