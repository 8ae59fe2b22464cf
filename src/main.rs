fn main() -> std::process::ExitCode {
    stagehand::cli::main()
}
