//! The `stagehand` command line. Each subcommand lives in its own file with its
//! arguments and an `execute` function; this file only dispatches and maps failures
//! to exit codes (0 ok, 1 run failed, 2 bad input or config, 3 `simulate`: the model
//! does not fit the machine under these budgets, 128 + the signal number when a
//! signal stopped the command: 130 SIGINT, 143 SIGTERM).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

// Output that never panics (see `output`): these shadow std's macros in every
// subcommand's file, so no CLI path can panic on a closed or full stdout or stderr.
macro_rules! print {
    ($($arg:tt)*) => { $crate::cli::output::stdout(format_args!($($arg)*)) };
}
macro_rules! println {
    () => { $crate::cli::output::stdout(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::cli::output::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}
#[allow(unused_macros)]
macro_rules! eprint {
    ($($arg:tt)*) => { $crate::cli::output::stderr(format_args!($($arg)*)) };
}
macro_rules! eprintln {
    () => { $crate::cli::output::stderr(format_args!("\n")) };
    ($($arg:tt)*) => {
        $crate::cli::output::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub mod output;

mod bench;
#[cfg(feature = "cuda")]
mod bench_cuda;
mod bench_disk;
mod bench_lora;
mod bench_model;
mod calibrate;
mod config_cmd;
mod demo_flux;
mod demo_model;
mod embed;
mod generate;
mod hardware_arg;
mod image;
mod inspect;
mod logging;
mod machine_load;
mod progress;
mod run;
mod sample;
#[cfg(feature = "serve")]
mod serve;
mod simulate;
mod validate;
mod validate_checks;
mod video;

/// Why a command failed, which decides the exit status.
#[derive(Debug)]
pub enum Failure {
    /// Bad input or configuration: exit 2.
    BadInput(anyhow::Error),
    /// The run itself failed: exit 1.
    RunFailed(anyhow::Error),
    /// `simulate`'s verdict: the model does not fit (exit 3), after its report.
    DoesNotFit(anyhow::Error),
}

impl Failure {
    pub fn bad_input(error: impl Into<anyhow::Error>) -> Self {
        Failure::BadInput(error.into())
    }

    pub fn run_failed(error: impl Into<anyhow::Error>) -> Self {
        Failure::RunFailed(error.into())
    }

    /// A run's error at the CLI's edge: its one line, and the exit status its kind
    /// says (2 for bad input, 1 for a failed run). The line already says the cause in
    /// words, so the cause's own chain is not printed after it.
    pub fn from_run(error: stagehand::run::RunError) -> Self {
        let message = anyhow::anyhow!(error.to_string());
        if error.is_bad_input() {
            Failure::BadInput(message)
        } else {
            Failure::RunFailed(message)
        }
    }
}

pub type CommandResult = Result<(), Failure>;

/// `stagehand simulate`'s exit status when the model does not fit (docs/commands.md, "Exit codes").
pub const EXIT_DOES_NOT_FIT: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "stagehand",
    version,
    about = "Streams model weights disk → pinned RAM → VRAM just ahead of compute, inside hard memory budgets.",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,

    /// With no subcommand, `stagehand` runs the demo workload (same as `stagehand run`).
    #[command(flatten)]
    pub run: run::RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Stream a model through the budgets step after step and verify the result (the main job).
    Run(run::RunArgs),
    /// Sentence embeddings from an encoder folder, streamed under the budgets.
    Embed(embed::EmbedArgs),
    /// Text from a decoder folder (Llama family, Qwen3, Mixtral and Qwen MoEs), streamed under the budgets.
    Generate(generate::GenerateArgs),
    /// Samples a Flux diffusion transformer's denoising steps from a conditioning file.
    Sample(sample::SampleArgs),
    /// A prompt to a PNG through a Flux pipeline folder (text encoders, transformer, VAE).
    Image(image::ImageArgs),
    /// A prompt to an MP4 through a Wan pipeline folder (umT5, the transformer or two experts, the WAN VAE).
    Video(video::VideoArgs),
    /// Show a safetensors checkpoint's files, tensors and block split.
    Inspect(inspect::InspectArgs),
    /// Print the effective settings and which layer set each one.
    Config(config_cmd::ConfigArgs),
    /// Write the deterministic linear-stack demo model.
    DemoModel(demo_model::DemoModelArgs),
    /// Predict, in virtual time, whether a model runs on a box and how fast.
    Simulate(simulate::SimulateArgs),
    /// Measure this machine and write a hardware profile for `simulate --hardware FILE`.
    Calibrate(calibrate::CalibrateArgs),
    /// Simulate and really run a matrix of configurations; predicted vs measured.
    Validate(validate::ValidateArgs),
    /// Measure stagehand against its physical bound and baselines (`bench disk FILE` for storage).
    Bench(bench::BenchArgs),
    /// Keep models loaded behind an OpenAI-compatible HTTP API (embeddings, completions, chat).
    #[cfg(feature = "serve")]
    Serve(serve::ServeArgs),
}

/// The command line, with every flag that takes a value taking a negative number as
/// that value, so `--seed -3` is refused by the flag's own parser, naming the flag
/// (clap's default reads `-3` as an unknown flag and suggests `-- -3`).
pub fn command() -> clap::Command {
    fn negative_numbers(command: clap::Command) -> clap::Command {
        command
            .mut_args(|arg| {
                if arg.get_action().takes_values() {
                    arg.allow_negative_numbers(true)
                } else {
                    arg
                }
            })
            .mut_subcommands(negative_numbers)
    }
    negative_numbers(<Cli as clap::CommandFactory>::command())
}

fn parse() -> Result<Cli, clap::Error> {
    let matches = command().try_get_matches()?;
    <Cli as clap::FromArgMatches>::from_arg_matches(&matches)
}

pub fn main() -> ExitCode {
    stagehand::signals::install();
    let cli = match parse() {
        Ok(cli) => cli,
        Err(error) => {
            // Help, version and usage errors; a closed or full output is not a panic.
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    // A server stopped by SIGINT/SIGTERM drains and exits 0 (docs/serving.md).
    let drains_on_signal = is_serve(&cli.command);
    let result = match cli.command {
        None => run::execute(cli.run),
        Some(Command::Run(args)) => run::execute(args),
        Some(Command::Embed(args)) => embed::execute(args),
        Some(Command::Generate(args)) => generate::execute(args),
        Some(Command::Sample(args)) => sample::execute(args),
        Some(Command::Image(args)) => image::execute(args),
        Some(Command::Video(args)) => video::execute(args),
        Some(Command::Inspect(args)) => inspect::execute(args),
        Some(Command::Config(args)) => config_cmd::execute(args),
        Some(Command::DemoModel(args)) => demo_model::execute(args),
        Some(Command::Simulate(args)) => simulate::execute(args),
        Some(Command::Bench(args)) => bench::execute(args),
        Some(Command::Calibrate(args)) => calibrate::execute(args),
        Some(Command::Validate(args)) => validate::execute(args),
        #[cfg(feature = "serve")]
        Some(Command::Serve(args)) => serve::execute(args),
    };
    let result_ok = result.is_ok();
    let status = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::BadInput(error)) => {
            eprintln!("error: {}", one_line(&format!("{error:#}")));
            ExitCode::from(2)
        }
        Err(Failure::RunFailed(error)) => {
            eprintln!("run failed: {}", one_line(&format!("{error:#}")));
            ExitCode::from(1)
        }
        Err(Failure::DoesNotFit(error)) => {
            eprintln!("does not fit: {}", one_line(&format!("{error:#}")));
            ExitCode::from(EXIT_DOES_NOT_FIT)
        }
    };
    let drained = drains_on_signal && result_ok;
    if let Some(signal) = stagehand::signals::received().filter(|_| !drained) {
        eprintln!("stopped by {}", stagehand::signals::signal_name(signal));
        return ExitCode::from(stagehand::signals::exit_status(signal));
    }
    match output::stdout_failure() {
        Some(output::StdoutFailure::Failed(reason)) => {
            eprintln!("error: could not write the output to stdout: {reason}");
            ExitCode::from(1)
        }
        Some(output::StdoutFailure::Closed) | None => status,
    }
}

/// A failure's message as the one line the exit codes promise: a library error that
/// spans lines (a TOML parser's snippet and caret) is joined, its lines that carry no
/// words (the caret) left out.
fn one_line(message: &str) -> String {
    let lines: Vec<&str> = message
        .lines()
        .map(str::trim)
        .filter(|line| line.chars().any(char::is_alphanumeric))
        .collect();
    lines.join(" ")
}

/// Whether the command is `serve`, which exits 0 after a drained SIGINT/SIGTERM.
fn is_serve(command: &Option<Command>) -> bool {
    #[cfg(feature = "serve")]
    if matches!(command, Some(Command::Serve(_))) {
        return true;
    }
    let _ = command;
    false
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::{Cli, Command};

    #[test]
    fn the_command_line_definition_is_consistent() {
        // Proves clap's own checks of every subcommand's definition hold (names,
        // conflicts, defaults that parse).
        Cli::command().debug_assert();
        super::command().debug_assert();
    }

    #[test]
    fn a_negative_number_is_its_flags_value() {
        // Proves `--seed -3` reaches --seed's parser (refused naming it), where clap's
        // default read `-3` as an unknown flag.
        let error = super::command()
            .try_get_matches_from(["stagehand", "generate", "--model", "m", "--seed", "-3"])
            .expect_err("a seed is unsigned");
        assert!(error.to_string().contains("'--seed <SEED>'"), "{error}");
    }

    #[test]
    fn a_message_over_several_lines_is_printed_as_one() {
        // Proves a TOML parser's snippet and caret become one line.
        let toml = "bad.toml: TOML parse error at line 1, column 6\n  |\n1 | a = = b\n  |      ^\nexpected a value\n";
        assert_eq!(
            super::one_line(toml),
            "bad.toml: TOML parse error at line 1, column 6 1 | a = = b expected a value"
        );
    }

    #[test]
    fn generate_reads_token_ids_as_one_list() {
        // Proves `--token-ids 256,10,20` parses into the ids (it panicked: clap's
        // "Mismatch between definition and access of `token_ids`").
        let cli = Cli::try_parse_from([
            "stagehand",
            "generate",
            "--model",
            "m",
            "--token-ids",
            "256,10,20",
        ])
        .expect("parses");
        let Some(Command::Generate(args)) = cli.command else {
            panic!("generate");
        };
        assert_eq!(args.token_ids.map(|ids| ids.0), Some(vec![256, 10, 20]));
    }
}
