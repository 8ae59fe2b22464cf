//! `stagehand generate`: text from a decoder folder (Llama family, Qwen3, the MoEs), streamed
//! under the same budgets, flags, metrics, trace and summary as `run`. The prompt is
//! prefilled as one step, then each step decodes one token, printed as it comes; after
//! the last token every step's logits are checked bit for bit against the
//! fully-resident run.
//!
//! The text (the prompt, then each token as it comes; or `--json`) goes to stdout; the
//! rates and the run summary go to stderr, and `--quiet` leaves them and the prompt's
//! echo out, so stdout holds the generated text alone.

use std::io::Write;
use std::path::PathBuf;

use serde::Serialize;

use super::run::{run_error, run_prepared, use_cuda, ExpertPolicyArg, Launch, PolicyArg};
use super::{CommandResult, Failure};
use stagehand::families::llama::{ExpertHint, Sampling};
use stagehand::families::moe::HintMode;
use stagehand::lora::LoraSpec;
use stagehand::run::summary::Summary;
use stagehand::run::text::TextPrinter;
use stagehand::run::{
    parse_token_ids, prepare_with, DecoderInput, Extras, MoeOptions, Outcome, PromptInput,
    WorkloadKind,
};
use stagehand::settings::{self, SettingsArgs};

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// A Hugging Face decoder folder (config.json of model_type llama, mistral, qwen2,
    /// qwen3, mixtral, qwen2_moe or qwen3_moe; safetensors; tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// The prompt.
    #[arg(long, default_value = "hello")]
    pub prompt: String,
    /// The prompt as token ids instead of text (for folders without tokenizer.json).
    #[arg(long, value_name = "IDS", value_parser = token_ids)]
    pub token_ids: Option<TokenIds>,
    /// Tokens to generate (the first comes from the prompt's prefill).
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u64,
    /// 0: greedy (the default); above 0: sample with this temperature.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// MoE models: speculative expert prefetch from the next MoE layer's router.
    #[arg(long, value_enum, default_value = "next-layer")]
    pub moe_hint: HintMode,
    /// MoE models: which experts the expert cache keeps.
    #[arg(long, value_enum, default_value = "lfu-aging")]
    pub expert_policy: ExpertPolicyArg,
    /// MoE models: expert cache slots (default: what the VRAM budget leaves).
    #[arg(long)]
    pub expert_slots: Option<u32>,
    /// Attach a LoRA adapter with an optional strength; repeatable. A PEFT adapter
    /// folder (adapter_config.json + adapter_model.safetensors), or a PEFT or kohya
    /// safetensors file.
    #[arg(long, value_name = "DIR|FILE[:STRENGTH]", value_parser = super::run::parse_lora_arg)]
    pub lora: Vec<LoraSpec>,
    /// Print the tokens, text and run summary as JSON at the end.
    #[arg(long)]
    pub json: bool,
    /// No prompt echo, rates or run summary: stdout holds the generated text alone.
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

/// `--token-ids 256,10,20`: one value holding every id. (A bare `Option<Vec<u32>>`
/// would tell clap to expect one id per occurrence, and the parsed list would not be
/// what clap then reads back: it panicked.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenIds(pub Vec<u32>);

fn token_ids(text: &str) -> Result<TokenIds, String> {
    parse_token_ids(text).map(TokenIds)
}

#[derive(Debug, Serialize)]
struct Generated<'a> {
    prompt_tokens: usize,
    tokens: &'a [u32],
    text: String,
    prefill_tokens_per_second: f64,
    /// The time to first token, split: the cold reads waited for, the prefill computed.
    time_to_first_token_seconds: f64,
    cold_read_seconds: f64,
    prefill_compute_seconds: f64,
    decode_tokens_per_second: f64,
    summary: &'a Summary,
}

pub fn execute(args: GenerateArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    super::run::init_logging(&settings.log);
    super::logging::log_setting_notes(&loaded.provenance);
    let use_cuda = use_cuda(settings.device)?;
    let extras = extras_of(&args)?;
    let prepared = prepare_with(
        &args.model,
        WorkloadKind::Decoder,
        1,
        &settings,
        false,
        &extras,
    )
    .map_err(run_error)?;
    let Some(kv) = prepared.facts().kv_cache() else {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "{} is not a decoder folder",
            args.model.display()
        )));
    };
    let prompt_tokens = kv.prompt_tokens as usize;
    let tokenizer = prepared
        .folder
        .as_ref()
        .and_then(|folder| folder.tokenizer.as_ref())
        .and_then(|path| stagehand::families::tokenizer_json::read(path).ok());
    let streaming = !args.json;
    if streaming && !args.quiet {
        // The prompt as given: its text, or the text of its ids.
        match &args.token_ids {
            Some(TokenIds(ids)) => print_flush(&TextPrinter::new(tokenizer.clone()).text(ids)),
            None => print_flush(&args.prompt),
        }
    }
    let mut printer = TextPrinter::new(tokenizer.clone());
    let outcome = run_prepared(
        &prepared,
        &settings,
        Launch {
            steps: args.max_tokens,
            policy: PolicyArg::Planned,
            quiet: true,
            keep_outputs: false,
            use_cuda,
            on_token: streaming.then(|| {
                Box::new(move |token| print_flush(&printer.push(token)))
                    as Box<dyn FnMut(u32) + Send>
            }),
            verify: stagehand::settings::Verify::First,
        },
    )?;
    if streaming {
        println!();
    }
    if args.json {
        return print_json(&outcome, prompt_tokens, tokenizer);
    }
    if !args.quiet {
        eprint!("{}", diagnostics(&outcome, prompt_tokens));
    }
    Ok(())
}

/// The tokens, text, rates and summary as JSON on stdout.
fn print_json(
    outcome: &Outcome,
    prompt_tokens: usize,
    tokenizer: Option<tokenizers::Tokenizer>,
) -> CommandResult {
    let summary = Summary::new(outcome);
    let (prefill, decode) = token_rates(outcome, prompt_tokens);
    let text = TextPrinter::new(tokenizer).text(&outcome.report.tokens);
    let generated = Generated {
        prompt_tokens,
        tokens: &outcome.report.tokens,
        text,
        prefill_tokens_per_second: prefill,
        time_to_first_token_seconds: summary.first_step_seconds,
        cold_read_seconds: summary.first_step_wait_seconds,
        prefill_compute_seconds: summary.first_step_compute_seconds,
        decode_tokens_per_second: decode,
        summary: &summary,
    };
    let json = serde_json::to_string_pretty(&generated).map_err(Failure::run_failed)?;
    println!("{json}");
    Ok(())
}

/// The rates, the time to first token and the run summary, for stderr. The decode
/// rate is a median only over two decode steps or more.
fn diagnostics(outcome: &Outcome, prompt_tokens: usize) -> String {
    let summary = Summary::new(outcome);
    let (prefill, decode) = token_rates(outcome, prompt_tokens);
    let decoded = outcome.report.tokens.len().saturating_sub(1);
    let decode_steps = outcome.report.steps.saturating_sub(1);
    let decoding = match decode_steps {
        0 => "no token decoded (the prefill gave the only one)".to_string(),
        1 => format!("{decoded} tokens decoded at {decode:.2} tokens/s (one decode step)"),
        steps => format!(
            "{decoded} tokens decoded at {decode:.2} tokens/s (steady: median of {steps} decode steps)"
        ),
    };
    let mut out = format!(
        "generate: {prompt_tokens} prompt tokens prefilled at {prefill:.1} tokens/s (compute alone), {decoding}\n"
    );
    out.push_str(&format!(
        "  first token after {:.1} ms: {:.1} ms waiting for the cold reads, {:.1} ms of prefill compute\n",
        summary.first_step_seconds * 1e3,
        summary.first_step_wait_seconds * 1e3,
        summary.first_step_compute_seconds * 1e3
    ));
    if summary.device.starts_with("cpu") && summary.first_step_read_bytes > 0 {
        // The CPU backend's loads run on the cores the prefill computes on.
        out.push_str(&format!(
            "  (the prefill shared this machine's cores with the cold reads of {}: a loaded model's prefill — `stagehand serve` — computes alone)\n",
            bytesize::ByteSize::b(summary.first_step_read_bytes).display().iec()
        ));
    }
    out.push_str(&summary.render("generate"));
    out
}

/// What the run computes from: the prompt (text or ids), sampling, the MoE knobs and
/// LoRA adapters, checked.
fn extras_of(args: &GenerateArgs) -> Result<Extras, Failure> {
    if args.max_tokens == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--max-tokens 0 generates nothing; give at least 1"
        )));
    }
    let sampling = Sampling {
        temperature: args.temperature,
        top_p: args.top_p,
        seed: args.seed,
    };
    sampling
        .validate()
        .map_err(|message| Failure::bad_input(anyhow::anyhow!(message)))?;
    let prompt = match &args.token_ids {
        Some(TokenIds(ids)) => PromptInput::TokenIds(ids.clone()),
        None => PromptInput::Text(args.prompt.clone()),
    };
    Ok(Extras {
        loras: args.lora.clone(),
        moe: MoeOptions {
            policy: args.expert_policy.policy(),
            hint: args.moe_hint,
            slots: args.expert_slots,
        },
        ..Extras::default()
    }
    .with(DecoderInput {
        prompt,
        sampling,
        hint: match args.moe_hint {
            HintMode::None => ExpertHint::None,
            HintMode::NextLayer => ExpertHint::NextLayer,
        },
    }))
}

/// Prefill rate (prompt tokens over the first step's compute: the cold reads it waited
/// for are the disk's, not the prefill's) and steady decode rate.
fn token_rates(outcome: &Outcome, prompt_tokens: usize) -> (f64, f64) {
    let report = &outcome.report;
    let prefill = report
        .compute_seconds
        .first()
        .map_or(0.0, |seconds| prompt_tokens as f64 / seconds.max(1e-9));
    let steady = report.steady_step_seconds();
    let decode = if report.steps > 1 && steady > 0.0 {
        1.0 / steady
    } else {
        0.0
    };
    (prefill, decode)
}

fn print_flush(text: &str) {
    let mut stdout = std::io::stdout();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
}
