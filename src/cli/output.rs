//! The CLI's output, written without ever panicking.
//!
//! std's `print!` panics when stdout is closed (`stagehand run | head -1`: EPIPE) or
//! full (`> /dev/full`: ENOSPC), and `eprint!` does the same on stderr. Inside `cli`,
//! `print!`, `println!`, `eprint!` and `eprintln!` are therefore the macros defined at
//! the top of `cli/mod.rs` (they shadow std's in every subcommand's file), which write
//! through [`stdout`] and [`stderr`] here:
//!
//! - stdout: the first failure is remembered and later output dropped. At exit, a
//!   closed pipe is quiet (the reader took what it wanted; the command's own status
//!   stands); any other failure is reported on stderr and makes the status 1, because
//!   output the user asked for was lost.
//! - stderr: failures are dropped; there is nowhere left to report them.
//!
//! SIGPIPE stays ignored (Rust's default) rather than restored to its default action:
//! a signal would kill the process wherever it happens to write — in the middle of a
//! model file or with budgets held — while an error value lets every phase end cleanly.

use std::fmt;
use std::io::{self, Write};
use std::sync::OnceLock;

/// Why stdout stopped taking output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StdoutFailure {
    /// The reader went away (EPIPE): nothing to report.
    Closed,
    /// Any other error (ENOSPC, EIO): the output was lost.
    Failed(String),
}

static STDOUT_FAILURE: OnceLock<StdoutFailure> = OnceLock::new();

/// Writes to stdout and flushes; after the first failure, drops everything.
pub fn stdout(arguments: fmt::Arguments<'_>) {
    if STDOUT_FAILURE.get().is_some() {
        return;
    }
    let mut out = io::stdout().lock();
    let written = out.write_fmt(arguments).and_then(|()| out.flush());
    if let Err(error) = written {
        let failure = match error.kind() {
            io::ErrorKind::BrokenPipe => StdoutFailure::Closed,
            _ => StdoutFailure::Failed(error.to_string()),
        };
        let _ = STDOUT_FAILURE.set(failure);
    }
}

/// Writes to stderr; failures are dropped.
pub fn stderr(arguments: fmt::Arguments<'_>) {
    let mut err = io::stderr().lock();
    let _ = err.write_fmt(arguments).and_then(|()| err.flush());
}

/// What happened to stdout, if it failed.
pub fn stdout_failure() -> Option<&'static StdoutFailure> {
    STDOUT_FAILURE.get()
}
