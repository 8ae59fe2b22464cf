//! The command line as users call it: a table of rows per subcommand, each row the
//! built binary run with some flags, checking its exit status and one line of its
//! output. A table also proves it is complete: every long flag `stagehand SUB --help`
//! documents must be tried by at least one of its rows, and the failure names the flag,
//! the subcommand and the file to add the row to.
//!
//! Every row, whatever it expects, must not panic: stderr never says "panicked" and the
//! exit status is never 101 (a Rust panic's).
//!
//! To add a subcommand: write `tests/cli_SUB.rs` with a [`Table`] and list it in
//! [`TABLES`]; `tests/cli_coverage.rs` fails for a subcommand `stagehand --help`
//! lists that has no table.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

// The tables import everything from here; other test binaries use none of it.
#[allow(unused_imports)]
pub use super::cli_rows::{
    device_rows, device_rows_expecting, fixtures, settings_rows, settings_rows_expecting,
    unopened_device_rows, Fixtures,
};
use super::process::{output_within_deadline, send_signal, wait_or_kill, HANG};
use super::stagehand;

/// Every subcommand (as its words after `stagehand`) and the file whose table tries it.
/// A subcommand `stagehand --help` lists (at any depth) but this list lacks fails
/// `tests/cli_coverage.rs`; a table whose subcommand or file is not here fails itself.
pub const TABLES: &[(&str, &str)] = &[
    ("", "tests/cli_run.rs"),
    ("run", "tests/cli_run.rs"),
    ("embed", "tests/cli_embed.rs"),
    ("generate", "tests/cli_generate.rs"),
    ("sample", "tests/cli_sample.rs"),
    ("image", "tests/cli_image.rs"),
    ("video", "tests/cli_video.rs"),
    ("serve", "tests/cli_serve.rs"),
    ("inspect", "tests/cli_inspect.rs"),
    ("config", "tests/cli_config.rs"),
    ("demo-model", "tests/cli_demo_model.rs"),
    ("simulate", "tests/cli_simulate.rs"),
    ("calibrate", "tests/cli_calibrate.rs"),
    ("validate", "tests/cli_validate.rs"),
    ("bench", "tests/cli_bench.rs"),
    ("bench disk", "tests/cli_bench.rs"),
    ("bench lora", "tests/cli_bench.rs"),
    ("bench help", "tests/cli_help.rs"),
    ("help", "tests/cli_help.rs"),
];

/// Rows a table runs at once at most: each is a process that may use every core.
const MAX_ROWS_AT_ONCE: usize = 4;

/// What a row expects.
#[derive(Clone, Copy)]
pub enum Expect {
    /// Exit 0, and a line of stdout containing this.
    Ok(&'static str),
    /// Exit 0, and a line of stderr containing this: the run summary and the other
    /// diagnostics, which never share stdout with a command's results.
    Summary(&'static str),
    /// Exit 2, the first line of stderr containing this, and (unless clap's usage
    /// error, which adds its usage lines) that line alone.
    Bad(&'static str),
    /// Exit 0 with this on a line of stdout or stderr (a summary's), or exit 2 with it
    /// on stderr's one line (`--device cuda`: 0 on a GPU machine, 2 here).
    OkOrBad(&'static str),
    /// This exit status and a line of stdout or stderr containing this (`simulate`'s
    /// 3 for a model that does not fit, 1 for a run that failed).
    Exit(i32, &'static str),
    /// Exit 0, and no line of stdout or stderr containing this (`run --quiet`: no
    /// summary).
    Without(&'static str),
    /// Keeps running (a server, `run --steps 0`) until a line of stderr contains this;
    /// then SIGTERM stops it, and it exits 143 saying so, with no panic.
    Runs(&'static str),
}

/// One run of the binary: the arguments after the subcommand, and what it expects.
pub struct Row {
    pub args: Vec<String>,
    pub expect: Expect,
    /// Whether the table's defaults are added (for the flags the row does not name).
    pub defaults: bool,
}

/// A row with the table's defaults.
pub fn row(args: &[&str], expect: Expect) -> Row {
    Row {
        args: args.iter().map(|arg| arg.to_string()).collect(),
        expect,
        defaults: true,
    }
}

impl Row {
    /// The row exactly as written, without the table's defaults (e.g. to leave out a
    /// required flag).
    pub fn bare(mut self) -> Self {
        self.defaults = false;
        self
    }
}

/// The rows of one subcommand.
pub struct Table {
    /// The words after `stagehand`: `"generate"`, `"bench disk"`.
    pub subcommand: &'static str,
    /// The test file holding the table (`file!()`), named in coverage failures.
    pub file: &'static str,
    /// Flag and value pairs (`["--model", DIR]`, `["--log", "warn"]`) put before a
    /// row's own arguments when the row does not name that flag: what makes a row
    /// small and fast without saying it each time. They count as tried.
    pub defaults: Vec<Vec<String>>,
    pub rows: Vec<Row>,
    /// Whether rows run one at a time: for a table whose rows write one file or
    /// folder that another row reads or writes (demo-model's `--out`, calibrate's
    /// profile). Other tables run their rows side by side, as users run commands:
    /// each row is its own process with its own output.
    pub sequential: bool,
}

impl Table {
    pub fn new(subcommand: &'static str, file: &'static str) -> Self {
        Table {
            subcommand,
            file,
            defaults: Vec::new(),
            rows: Vec::new(),
            sequential: false,
        }
    }

    /// Runs the rows one at a time (see [`Table::sequential`]).
    pub fn sequential(mut self) -> Self {
        self.sequential = true;
        self
    }

    /// Adds `flag` (and its value, if any) to the defaults.
    pub fn default(mut self, flag_and_value: &[&str]) -> Self {
        self.defaults
            .push(flag_and_value.iter().map(|arg| arg.to_string()).collect());
        self
    }

    pub fn rows(mut self, rows: impl IntoIterator<Item = Row>) -> Self {
        self.rows.extend(rows);
        self
    }

    /// Checks the table covers every flag its `--help` documents, then runs every row
    /// and fails listing every row that did not do what it expects.
    pub fn run(&self) {
        let listed = TABLES
            .iter()
            .any(|(subcommand, file)| *subcommand == self.subcommand && *file == self.file);
        assert!(
            listed,
            "the table for `stagehand {}` in {} is not listed in TABLES (tests/common/cli.rs): add (\"{}\", \"{}\")",
            self.subcommand, self.file, self.subcommand, self.file
        );
        let untried = self.untried_flags();
        assert!(
            untried.is_empty(),
            "`stagehand {} --help` documents {}, which no row of the table tries: add a row \
             (its arguments, the exit status, a line of output) for each to the table in {}",
            self.subcommand,
            untried.join(", "),
            self.file
        );
        let failures: String = self.run_rows().concat();
        assert!(
            failures.is_empty(),
            "rows of {} that failed:\n\n{failures}",
            self.file
        );
    }

    /// Runs every row, side by side on as many threads as the machine has cores (at
    /// most [`MAX_ROWS_AT_ONCE`]) unless the table is sequential; returns each row's
    /// failure (empty when it did what it expects), in row order.
    fn run_rows(&self) -> Vec<String> {
        let workers = match self.sequential {
            true => 1,
            false => std::thread::available_parallelism()
                .map_or(1, |cores| cores.get())
                .min(MAX_ROWS_AT_ONCE),
        };
        let next = std::sync::atomic::AtomicUsize::new(0);
        let results = std::sync::Mutex::new(vec![String::new(); self.rows.len()]);
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(row) = self.rows.get(index) else {
                        break;
                    };
                    let failure = self.run_row(row);
                    results.lock().expect("no row thread panics")[index] = failure;
                });
            }
        });
        results.into_inner().expect("no row thread panics")
    }

    /// Runs one row: its failure, or an empty string when it did what it expects.
    fn run_row(&self, row: &Row) -> String {
        let shown = format!(
            "stagehand {} {}",
            self.subcommand,
            self.arguments(row).join(" ")
        );
        let started = std::time::Instant::now();
        let output = match row.expect {
            Expect::Runs(needle) => stop_once_running(&mut self.command(row), needle),
            _ => output_within_deadline(&mut self.command(row)),
        };
        // Shown when the test fails, so a slow or hanging row is named.
        eprintln!(
            "{shown}\n  exit {:?} after {:.1} s",
            output.status.code(),
            started.elapsed().as_secs_f64()
        );
        match check(row, &output) {
            Ok(()) => String::new(),
            Err(failure) => format!("{shown}\n  {failure}\n\n"),
        }
    }

    /// The documented long flags no row (nor a default) names.
    pub fn untried_flags(&self) -> Vec<String> {
        let tried: Vec<&str> = self
            .rows
            .iter()
            .flat_map(|row| row.args.iter())
            .chain(self.defaults.iter().flatten())
            .map(String::as_str)
            .collect();
        documented_flags(self.subcommand)
            .into_iter()
            .filter(|flag| {
                !tried
                    .iter()
                    .any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")))
            })
            .collect()
    }

    /// The arguments after the subcommand: the defaults the row does not override,
    /// then the row's own.
    fn arguments(&self, row: &Row) -> Vec<String> {
        let mut arguments = Vec::new();
        if row.defaults {
            for default in &self.defaults {
                let flag = &default[0];
                let named = row
                    .args
                    .iter()
                    .any(|arg| arg == flag || arg.starts_with(&format!("{flag}=")));
                if !named {
                    arguments.extend(default.iter().cloned());
                }
            }
        }
        arguments.extend(row.args.iter().cloned());
        arguments
    }

    fn command(&self, row: &Row) -> Command {
        let mut command = stagehand();
        command
            .args(self.subcommand.split_whitespace())
            .args(self.arguments(row))
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        command
    }
}

/// Whether `output` is what `row` expects; the reason when it is not.
pub fn check(row: &Row, output: &Output) -> Result<(), String> {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let code = output.status.code();
    let shown = || format!("exit {code:?}\n  stdout: {stdout}\n  stderr: {stderr}");
    if stderr.contains("panicked") || code == Some(101) {
        return Err(format!("it panicked: {}", shown()));
    }
    let bad = |needle: &str| -> Result<(), String> {
        // clap's usage errors are a paragraph, then usage and "For more information";
        // ours are one line.
        let clap_usage = stderr.contains("For more information");
        let lines: Vec<&str> = stderr
            .trim_start()
            .lines()
            .take_while(|line| !(clap_usage && line.trim().is_empty()))
            .filter(|line| !line.trim().is_empty())
            .collect();
        if code != Some(2) {
            Err(format!("expected exit 2: {}", shown()))
        } else if !lines.iter().any(|line| line.contains(needle)) {
            Err(format!(
                "expected the error to name {needle:?}: {}",
                shown()
            ))
        } else if lines.len() != 1 && !clap_usage {
            Err(format!("expected one line on stderr: {}", shown()))
        } else {
            Ok(())
        }
    };
    let ok = |needle: &str| -> Result<(), String> {
        if code != Some(0) {
            Err(format!("expected exit 0: {}", shown()))
        } else if !stdout.lines().any(|line| line.contains(needle)) {
            Err(format!(
                "expected a line of stdout with {needle:?}: {}",
                shown()
            ))
        } else {
            Ok(())
        }
    };
    let summary = |needle: &str| -> Result<(), String> {
        if code != Some(0) {
            Err(format!("expected exit 0: {}", shown()))
        } else if !stderr.lines().any(|line| line.contains(needle)) {
            Err(format!(
                "expected a line of stderr with {needle:?}: {}",
                shown()
            ))
        } else {
            Ok(())
        }
    };
    match row.expect {
        Expect::Ok(needle) => ok(needle),
        Expect::Summary(needle) => summary(needle),
        Expect::Without(needle) => {
            let mut lines = stdout.lines().chain(stderr.lines());
            if code != Some(0) {
                Err(format!("expected exit 0: {}", shown()))
            } else if lines.any(|line| line.contains(needle)) {
                Err(format!("expected no line with {needle:?}: {}", shown()))
            } else {
                Ok(())
            }
        }
        Expect::Bad(needle) => bad(needle),
        Expect::OkOrBad(needle) if code == Some(2) => bad(needle),
        Expect::OkOrBad(needle) => ok(needle).or_else(|_| summary(needle)),
        Expect::Runs(needle) => {
            let drained = code == Some(0);
            let stopped = code == Some(143) && stderr.contains("stopped by SIGTERM");
            if !(drained || stopped) {
                Err(format!(
                    "expected SIGTERM to stop it (exit 143, or 0 after a drain): {}",
                    shown()
                ))
            } else if !stderr.contains(needle) {
                Err(format!(
                    "expected a line of stderr with {needle:?}: {}",
                    shown()
                ))
            } else {
                Ok(())
            }
        }
        Expect::Exit(expected, needle) => {
            let any_line = stdout.lines().chain(stderr.lines());
            if code != Some(expected) {
                Err(format!("expected exit {expected}: {}", shown()))
            } else if !any_line.into_iter().any(|line| line.contains(needle)) {
                Err(format!("expected a line with {needle:?}: {}", shown()))
            } else {
                Ok(())
            }
        }
    }
}

/// Runs `command` until a line of its stderr contains `needle` (or it exits, or
/// [`HANG`] passes), then sends it SIGTERM and waits for it to exit.
fn stop_once_running(command: &mut Command, needle: &'static str) -> Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary starts");
    let mut stdout_pipe = child.stdout.take().expect("stdout piped");
    let stdout = std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = stdout_pipe.read_to_end(&mut bytes);
        bytes
    });
    let stderr_pipe = child.stderr.take().expect("stderr piped");
    let (lines_sender, lines) = std::sync::mpsc::channel::<bool>();
    let stderr = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr_pipe).lines().map_while(Result::ok) {
            let _ = lines_sender.send(line.contains(needle));
            text.push_str(&line);
            text.push('\n');
        }
        text
    });
    let deadline = Instant::now() + HANG;
    while let Ok(found) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        if found {
            break;
        }
    }
    if child.try_wait().expect("wait").is_none() {
        send_signal(&child, libc::SIGTERM);
    }
    let status = wait_or_kill(&mut child, HANG);
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader").into_bytes(),
    }
}

/// `stagehand SUB --help`'s text (`subcommand` empty: `stagehand --help`).
pub fn help_text(subcommand: &str) -> String {
    let output = stagehand()
        .args(subcommand.split_whitespace())
        .arg("--help")
        .output()
        .expect("the binary starts");
    assert!(
        output.status.success(),
        "`stagehand {subcommand} --help` exits 0: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The long flags `stagehand SUB --help` documents, sorted.
/// clap's `help` subcommands take subcommand names only (`help --help` is refused).
pub fn documented_flags(subcommand: &str) -> Vec<String> {
    if subcommand.split_whitespace().last() == Some("help") {
        return Vec::new();
    }
    option_flags(&help_text(subcommand))
}

/// The long flags `help` defines: its option lines (`  -h, --help`, `      --model
/// <DIR>`), not the flags its descriptions mention.
pub fn option_flags(help: &str) -> Vec<String> {
    let definitions: Vec<&str> = help
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with('-'))
        .filter_map(|line| line.split_whitespace().find(|word| word.starts_with("--")))
        .collect();
    flags_in(&definitions.join(" "))
}

/// Every `--flag` in `text`, sorted and without repeats.
pub fn flags_in(text: &str) -> Vec<String> {
    let mut flags: Vec<String> = text
        .split(|c: char| c.is_whitespace() || "`([{\"'|,".contains(c))
        .filter_map(|word| word.strip_prefix("--"))
        .map(|flag| {
            let end = flag.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
            format!("--{}", &flag[..end.unwrap_or(flag.len())])
        })
        .filter(|flag| flag.len() > 3 && !flag.ends_with('-'))
        .collect();
    flags.sort();
    flags.dedup();
    flags
}

/// The subcommands `stagehand SUB --help` lists under "Commands:", as `SUB NAME`.
pub fn subcommands_of(subcommand: &str) -> Vec<String> {
    let help = help_text(subcommand);
    help.lines()
        .skip_while(|line| line.trim() != "Commands:")
        .skip(1)
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .map(|name| format!("{subcommand} {name}").trim().to_string())
        .collect()
}
