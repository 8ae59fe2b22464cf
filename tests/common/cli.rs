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

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use stagehand::compute::DType;
use stagehand::lora::{write_demo_lora, DemoLora};
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::model::generated::{write_bert_lora, BertDemo, BertPreset, DecoderArch};

use super::decoder::tiny_decoder;
use super::encoder::tiny_bert;
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

/// What a row expects.
pub enum Expect {
    /// Exit 0, and a line of stdout containing this.
    Ok(&'static str),
    /// Exit 2, the first line of stderr containing this, and (unless clap's usage
    /// error, which adds its usage lines) that line alone.
    Bad(&'static str),
    /// Exit 0 with this on a line of stdout, or exit 2 with it on stderr's one line
    /// (`--device cuda`: 0 on a GPU machine, 2 here).
    OkOrBad(&'static str),
    /// This exit status and a line of stdout or stderr containing this (`simulate`'s
    /// 3 for a model that does not fit, 1 for a run that failed).
    Exit(i32, &'static str),
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
}

impl Table {
    pub fn new(subcommand: &'static str, file: &'static str) -> Self {
        Table {
            subcommand,
            file,
            defaults: Vec::new(),
            rows: Vec::new(),
        }
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
        let mut failures = String::new();
        for row in &self.rows {
            // Shown when the test fails, so a row that hangs is named.
            eprintln!(
                "stagehand {} {}",
                self.subcommand,
                self.arguments(row).join(" ")
            );
            let started = std::time::Instant::now();
            let output = match row.expect {
                Expect::Runs(needle) => stop_once_running(&mut self.command(row), needle),
                _ => output_within_deadline(&mut self.command(row)),
            };
            eprintln!(
                "  exit {:?} after {:.1} s",
                output.status.code(),
                started.elapsed().as_secs_f64()
            );
            if let Err(failure) = check(row, &output) {
                let _ = writeln!(
                    failures,
                    "stagehand {} {}\n  {failure}\n",
                    self.subcommand,
                    self.arguments(row).join(" ")
                );
            }
        }
        assert!(
            failures.is_empty(),
            "rows of {} that failed:\n\n{failures}",
            self.file
        );
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
    match row.expect {
        Expect::Ok(needle) => ok(needle),
        Expect::Bad(needle) => bad(needle),
        Expect::OkOrBad(needle) if code == Some(2) => bad(needle),
        Expect::OkOrBad(needle) => ok(needle),
        Expect::Runs(needle) => {
            if code != Some(143) || !stderr.contains("stopped by SIGTERM") {
                Err(format!(
                    "expected SIGTERM to stop it (exit 143): {}",
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

const LINEAR_STACK: DemoSpec = DemoSpec {
    blocks: 4,
    layers_per_block: 1,
    dim: 64,
    seed: 7,
};

/// Small models and files, written once per test binary under cargo's target tmp dir.
pub struct Fixtures {
    dir: PathBuf,
    linear_stack: OnceLock<String>,
    linear_lora: OnceLock<String>,
    bert: OnceLock<String>,
    bert_lora: OnceLock<String>,
    llama: OnceLock<String>,
    moe: OnceLock<String>,
}

/// This test binary's fixtures.
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let binary = std::env::current_exe().expect("the test binary's path");
        let name = binary
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-table-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the fixture folder is made");
        Fixtures {
            dir,
            linear_stack: OnceLock::new(),
            linear_lora: OnceLock::new(),
            bert: OnceLock::new(),
            bert_lora: OnceLock::new(),
            llama: OnceLock::new(),
            moe: OnceLock::new(),
        }
    })
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

impl Fixtures {
    /// A path in the fixture folder, not created.
    pub fn path(&self, name: &str) -> String {
        shown(&self.dir.join(name))
    }

    /// A file in the fixture folder holding `contents`.
    pub fn file(&self, name: &str, contents: &str) -> String {
        let path = self.dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("the folder is made");
        }
        std::fs::write(&path, contents).expect("the fixture file is written");
        shown(&path)
    }

    /// An empty folder in the fixture folder.
    pub fn folder(&self, name: &str) -> String {
        let path = self.dir.join(name);
        std::fs::create_dir_all(&path).expect("the folder is made");
        shown(&path)
    }

    /// A linear-stack demo model of 4 blocks × 1 layer × 64×64 f32 (64 KiB): the file.
    pub fn linear_stack(&self) -> String {
        self.linear_stack
            .get_or_init(|| {
                let model = write_linear_stack(&self.dir.join("linear"), &LINEAR_STACK);
                shown(&model.expect("demo model"))
            })
            .clone()
    }

    /// The demo PEFT adapter (rank 8) of [`Fixtures::linear_stack`]'s model.
    pub fn linear_lora(&self) -> String {
        self.linear_lora
            .get_or_init(|| {
                let path = self.dir.join("linear-lora.safetensors");
                write_demo_lora(&path, &LINEAR_STACK, &DemoLora::default()).expect("adapter");
                shown(&path)
            })
            .clone()
    }

    /// The tiny BERT folder (4 layers of 128, f32).
    pub fn bert(&self) -> String {
        self.bert
            .get_or_init(|| shown(&tiny_bert(&self.dir.join("bert"), DType::F32)))
            .clone()
    }

    /// A rank-4 PEFT adapter on query/value of [`Fixtures::bert`]'s model: the file.
    pub fn bert_lora(&self) -> String {
        self.bert_lora
            .get_or_init(|| {
                let demo = BertDemo {
                    preset: BertPreset::Tiny,
                    dtype: DType::F32,
                    ..BertDemo::default()
                };
                let dir = self.dir.join("bert-lora");
                shown(&write_bert_lora(&dir, &demo, 4, 11).expect("adapter"))
            })
            .clone()
    }

    /// The tiny Llama folder (4 layers of 128, f32).
    pub fn llama(&self) -> String {
        self.llama
            .get_or_init(|| {
                let dir = self.dir.join("llama");
                shown(&tiny_decoder(&dir, DecoderArch::Llama, DType::F32, 5))
            })
            .clone()
    }

    /// The tiny Qwen3-MoE folder (16 experts, top-4, f32).
    pub fn moe(&self) -> String {
        self.moe
            .get_or_init(|| {
                let dir = self.dir.join("moe");
                shown(&tiny_decoder(&dir, DecoderArch::Qwen3Moe, DType::F32, 5))
            })
            .clone()
    }
}

/// Rows for the deployment settings every run-like subcommand flattens in (`--config`
/// to `--verify`, less `--device`, whose rows each table writes for its own outcomes),
/// good values expecting `ok` on stdout and bad ones exit 2 naming the key.
pub fn settings_rows(ok: &'static str) -> Vec<Row> {
    let fixtures = fixtures();
    let config = fixtures.file("settings/c.toml", "prefetch_depth = 1\n");
    let unknown_key = fixtures.file("settings/unknown.toml", "vram_budgte = \"1GiB\"\n");
    let trace = fixtures.path("settings/trace.json");
    let missing = fixtures.path("settings/none.toml");
    let folder = fixtures.folder("settings/folder");
    vec![
        row(&["--config", &config], Expect::Ok(ok)),
        row(&["--config", &missing], Expect::Bad("none.toml")),
        row(&["--config", &folder], Expect::Bad("folder")),
        row(&["--config", &unknown_key], Expect::Bad("vram_budgte")),
        row(&["--vram-budget", "64MiB"], Expect::Ok(ok)),
        row(&["--vram-budget", "lots"], Expect::Bad("vram_budget")),
        row(&["--reserve-vram", "0MiB"], Expect::Ok(ok)),
        row(&["--reserve-vram", "-1"], Expect::Bad("reserve_vram")),
        row(&["--vram-headroom", "1GiB"], Expect::Ok(ok)),
        row(&["--vram-headroom", "x"], Expect::Bad("vram_headroom")),
        row(&["--pin-ceiling", "64MiB"], Expect::Ok(ok)),
        row(&["--pin-ceiling", "0"], Expect::Bad("pin_ceiling")),
        row(&["--ram-floor", "2GiB"], Expect::Ok(ok)),
        row(&["--ram-floor", "lots"], Expect::Bad("ram_floor")),
        row(&["--fast-disk"], Expect::Ok(ok)),
        row(&["--fast-disk", "false"], Expect::Ok(ok)),
        row(&["--fast-disk", "maybe"], Expect::Bad("'maybe'")),
        row(&["--prefetch-depth", "1"], Expect::Ok(ok)),
        row(&["--prefetch-depth", "65"], Expect::Bad("prefetch_depth")),
        row(&["--prefetch-depth", "-1"], Expect::Bad("prefetch_depth")),
        row(&["--metrics-addr", "127.0.0.1:0"], Expect::Ok(ok)),
        row(&["--metrics-addr", "nowhere:x"], Expect::Bad("metrics")),
        row(&["--trace", &trace], Expect::Ok(ok)),
        row(&["--trace", &folder], Expect::Bad("is a folder")),
        row(
            &["--trace", &format!("{missing}/t.json")],
            Expect::Bad("does not exist"),
        ),
        row(&["--log", "warn"], Expect::Ok(ok)),
        row(&["--log", "[[["], Expect::Bad("not a log filter")),
        // The number after `layer.`, `layers.` or `blocks.`: every fixture's layers.
        row(
            &["--block-pattern", r"(?:layers?|blocks)\.(\d+)\."],
            Expect::Ok(ok),
        ),
        row(&["--block-pattern", "("], Expect::Bad("not a valid regex")),
        row(&["--staging-buffers", "2"], Expect::Ok(ok)),
        row(&["--staging-buffers", "1"], Expect::Bad("staging_buffers")),
        row(&["--staging-buffer-size", "4MiB"], Expect::Ok(ok)),
        row(
            &["--staging-buffer-size", "1000"],
            Expect::Bad("multiple of 4 KiB"),
        ),
        row(&["--read-request-size", "1MiB"], Expect::Ok(ok)),
        row(
            &["--read-request-size", "3KiB"],
            Expect::Bad("read_request_size"),
        ),
        row(&["--reader-threads", "2"], Expect::Ok(ok)),
        row(&["--reader-threads", "0"], Expect::Bad("reader_threads")),
        row(&["--compute-threads", "1"], Expect::Ok(ok)),
        row(&["--compute-threads", "0"], Expect::Bad("compute_threads")),
        row(&["--verify", "full"], Expect::Ok(ok)),
        row(&["--verify", "first"], Expect::Ok(ok)),
        row(&["--verify", "weights"], Expect::Ok(ok)),
        row(&["--verify", "off"], Expect::Ok(ok)),
        row(
            &["--verify", "sometimes"],
            Expect::Bad("full, first, weights, off"),
        ),
    ]
}

/// Rows for `--device`: `cpu` and `auto` run (`ok` on stdout), `sim` points at
/// `simulate`, `cuda` runs on a GPU machine and exits 2 naming CUDA elsewhere, and an
/// unknown kind is refused.
pub fn device_rows(ok: &'static str) -> Vec<Row> {
    vec![
        row(&["--device", "cpu"], Expect::Ok(ok)),
        row(&["--device", "auto"], Expect::Ok(ok)),
        row(&["--device", "sim"], Expect::Bad("simulate")),
        row(&["--device", "cuda"], Expect::OkOrBad("cuda")),
        row(&["--device", "tpu"], Expect::Bad("tpu")),
    ]
}

/// Rows for `--device` of a subcommand that opens no device (`config`, `inspect`,
/// `simulate`): every kind is accepted (`ok` on stdout), an unknown one refused.
pub fn unopened_device_rows(ok: &'static str) -> Vec<Row> {
    let mut rows: Vec<Row> = ["cpu", "auto", "sim", "cuda"]
        .into_iter()
        .map(|device| row(&["--device", device], Expect::Ok(ok)))
        .collect();
    rows.push(row(&["--device", "tpu"], Expect::Bad("tpu")));
    rows
}
