//! The `stagehand` command line (see `cli`): a thin program over the library.

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
