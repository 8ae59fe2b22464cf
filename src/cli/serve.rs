//! `stagehand serve`: the models of a serve config (or `--model DIR`) kept loaded
//! behind an OpenAI-compatible HTTP API until SIGINT/SIGTERM, which drains and exits 0
//! with every budget released (docs/serving.md).

use std::path::PathBuf;

use super::{CommandResult, Failure};
use stagehand::serve::{serve, ModelConfig, ServeConfig, ServeOptions};
use stagehand::settings::SettingsArgs;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The serve config (TOML: bind, api_key, [admin], settings, [limits], [[models]]).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Serve this folder too, named after it; repeatable (no config needed).
    #[arg(long, value_name = "DIR")]
    pub model: Vec<PathBuf>,
    /// Listen on HOST:PORT (default 127.0.0.1:8080; port 0 picks a free one).
    #[arg(long, value_name = "ADDR")]
    pub bind: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1 requests.
    #[arg(
        long,
        value_name = "KEY",
        env = "STAGEHAND_API_KEY",
        hide_env_values = true
    )]
    pub api_key: Option<String>,
    /// The settings file every model starts from (as `--config` of the other commands).
    #[arg(long, value_name = "FILE")]
    pub settings: Option<PathBuf>,
    /// VRAM budget of each model without its own, e.g. 2GiB.
    #[arg(long, value_name = "SIZE")]
    pub vram_budget: Option<String>,
    /// Pin ceiling of each model without its own, e.g. 4GiB.
    #[arg(long, value_name = "SIZE")]
    pub pin_ceiling: Option<String>,
    /// Requests waiting per model before 429.
    #[arg(long, value_name = "N")]
    pub queue_depth: Option<usize>,
    /// Seconds a request may take before it is cancelled (504).
    #[arg(long, value_name = "SECONDS")]
    pub request_timeout: Option<f64>,
    /// Seconds in-flight requests may still run after SIGTERM.
    #[arg(long, value_name = "SECONDS")]
    pub drain_seconds: Option<f64>,
    /// Largest max_tokens a request may ask (and the default).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// Decoders: sequences decoded together (overrides every model's max_sequences).
    #[arg(long, value_name = "N")]
    pub max_sequences: Option<usize>,
    /// Log filter, tracing env-filter syntax (info, stagehand=debug).
    #[arg(long, value_name = "FILTER", default_value = "info")]
    pub log: String,
}

pub fn execute(args: ServeArgs) -> CommandResult {
    // The other commands check `log` with their settings; serve's is its own flag.
    if !stagehand::settings::is_log_filter(&args.log) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--log {:?}: not a log filter; use e.g. info, warn, or stagehand=debug",
            args.log
        )));
    }
    super::logging::init_logging(&args.log);
    let config =
        config_of(&args).map_err(|message| Failure::bad_input(anyhow::anyhow!(message)))?;
    let settings = SettingsArgs {
        config: args.settings.clone(),
        vram_budget: args.vram_budget.clone(),
        pin_ceiling: args.pin_ceiling.clone(),
        ..SettingsArgs::default()
    };
    let report = serve(ServeOptions {
        config,
        settings,
        on_listening: Box::new(|addr| {
            println!("stagehand serve: listening on http://{addr}");
        }),
    })
    .map_err(|error| {
        // The kind decides the exit status; the user reads its one line.
        let message = anyhow::anyhow!(error.to_string());
        if error.is_bad_input() {
            Failure::bad_input(message)
        } else {
            Failure::run_failed(message)
        }
    })?;
    for (name, stats) in &report.models {
        println!(
            "stagehand serve: {name} stopped; vram {} and pinned {} still held",
            stagehand::actors::Bytes(stats.vram.used_bytes),
            stagehand::actors::Bytes(stats.pinned.used_bytes)
        );
    }
    if report.cancelled_in_flight > 0 {
        println!(
            "stagehand serve: {} request(s) were still running when the drain time ran out and were cancelled",
            report.cancelled_in_flight
        );
    }
    Ok(())
}

/// The config file (if any) with the flags over it.
fn config_of(args: &ServeArgs) -> Result<ServeConfig, String> {
    let mut config = match &args.config {
        Some(path) => ServeConfig::read(path)?,
        None => ServeConfig::default(),
    };
    config.models.extend(
        args.model
            .iter()
            .map(|folder| ModelConfig::from_folder(folder)),
    );
    if let Some(bind) = &args.bind {
        config.bind = bind.clone();
    }
    if let Some(key) = &args.api_key {
        config.api_key = Some(key.clone());
    }
    if let Some(depth) = args.queue_depth {
        config.limits.queue_depth = depth;
    }
    if let Some(seconds) = args.request_timeout {
        config.limits.request_timeout_seconds = seconds;
    }
    if let Some(seconds) = args.drain_seconds {
        config.limits.drain_seconds = seconds;
    }
    if let Some(tokens) = args.max_tokens {
        config.limits.max_tokens = tokens;
    }
    if let Some(sequences) = args.max_sequences {
        for model in &mut config.models {
            model.max_sequences = sequences;
        }
    }
    Ok(config)
}
