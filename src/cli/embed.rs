//! `stagehand embed`: sentence embeddings from an encoder folder, streamed under the
//! same budgets, flags, metrics, trace and summary as `run`. Each batch of texts is one
//! step, verified bit for bit against the fully-resident pass; with two or more texts
//! it prints their cosine similarities.
//!
//! The results (the embeddings and the similarity table, or `--json`) go to stdout;
//! the run summary goes to stderr, and `--quiet` leaves it out.

use std::path::PathBuf;

use serde::Serialize;

use super::run::{run_error, run_prepared, use_cuda, Launch, PolicyArg};
use super::{CommandResult, Failure};
use stagehand::families::bert::{embeddings_in_input_order, similarity_table, EmbeddingPlacement};
use stagehand::lora::LoraSpec;
use stagehand::run::summary::Summary;
use stagehand::run::{
    parse_token_ids, prepare_with, texts_from_file, EncoderInput, Extras, Outcome, Prepared,
    WorkloadKind,
};
use stagehand::settings::{self, SettingsArgs};

#[derive(Debug, clap::Args)]
pub struct EmbedArgs {
    /// A Hugging Face encoder folder (config.json, model.safetensors, tokenizer.json;
    /// sentence-transformers modules.json for pooling).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Texts to embed.
    #[arg(value_name = "TEXT")]
    pub texts: Vec<String>,
    /// Read texts from a file, one per line (blank lines skipped).
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
    /// Token ids of one text, comma-separated, instead of text (for folders without
    /// tokenizer.json); repeat for more texts.
    #[arg(long, value_name = "IDS", value_parser = parse_token_ids)]
    pub token_ids: Vec<Vec<u32>>,
    /// Texts per step.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Attach a LoRA adapter with an optional strength; repeatable. A PEFT adapter
    /// folder (adapter_config.json + adapter_model.safetensors), or a PEFT or kohya
    /// safetensors file.
    #[arg(long, value_name = "DIR|FILE[:STRENGTH]", value_parser = super::run::parse_lora_arg)]
    pub lora: Vec<LoraSpec>,
    /// Where the word-embedding table lives (see `stagehand run --help`).
    #[arg(long, value_enum, default_value = "auto")]
    pub embeddings: EmbeddingPlacement,
    /// Print embeddings, similarities and the run summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress bar and no run summary (the results are still printed).
    #[arg(long)]
    pub quiet: bool,
    #[command(flatten)]
    pub settings: SettingsArgs,
}

#[derive(Debug, Serialize)]
struct Embedded {
    text: String,
    truncated: bool,
    embedding: Vec<f32>,
}

#[derive(Debug, Serialize)]
struct EmbedOutput<'a> {
    texts: Vec<Embedded>,
    /// `similarity[i][j]`: cosine similarity of texts i and j.
    similarity: Vec<Vec<f32>>,
    summary: &'a Summary,
}

pub fn execute(args: EmbedArgs) -> CommandResult {
    let loaded = settings::load(&args.settings).map_err(Failure::bad_input)?;
    let settings = loaded.settings;
    super::run::init_logging(&settings.log);
    super::logging::log_setting_notes(&loaded.provenance);
    let use_cuda = use_cuda(settings.device)?;
    if args.batch == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--batch must be at least 1 text per step"
        )));
    }
    let (input, labels) = input(&args)?;
    let extras = Extras {
        loras: args.lora.clone(),
        ..Extras::default()
    }
    .with(input)
    .with(args.embeddings);
    let prepared = prepare_with(
        &args.model,
        WorkloadKind::Encoder,
        args.batch,
        &settings,
        false,
        &extras,
    )
    .map_err(run_error)?;
    let batches = labels.len().div_ceil(args.batch) as u64;
    let outcome = run_prepared(
        &prepared,
        &settings,
        Launch {
            steps: batches,
            policy: PolicyArg::Planned,
            quiet: args.quiet || args.json,
            keep_outputs: true,
            use_cuda,
            on_token: None,
            verify: stagehand::settings::Verify::First,
        },
    )?;
    let embeddings = embeddings(&outcome, &prepared, labels.len())?;
    let similarity = similarity_table(&embeddings);
    let summary = Summary::new(&outcome);
    let texts: Vec<Embedded> = labels
        .into_iter()
        .zip(embeddings)
        .enumerate()
        .map(|(position, (text, embedding))| Embedded {
            text,
            truncated: prepared.truncated_texts.contains(&position),
            embedding,
        })
        .collect();
    if args.json {
        let output = EmbedOutput {
            texts,
            similarity,
            summary: &summary,
        };
        let text = serde_json::to_string_pretty(&output).map_err(Failure::run_failed)?;
        println!("{text}");
        return Ok(());
    }
    print!("{}", render(&texts, &similarity));
    if !args.quiet {
        eprint!("{}", summary.render("embed"));
    }
    Ok(())
}

/// The texts (or token-id lists) to embed, and a label for each.
fn input(args: &EmbedArgs) -> Result<(EncoderInput, Vec<String>), Failure> {
    if !args.token_ids.is_empty() {
        if !args.texts.is_empty() || args.file.is_some() {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "give texts or --token-ids, not both"
            )));
        }
        let labels = args
            .token_ids
            .iter()
            .map(|ids| format!("ids {ids:?}"))
            .collect();
        return Ok((EncoderInput::TokenIds(args.token_ids.clone()), labels));
    }
    let mut texts = args.texts.clone();
    if let Some(file) = &args.file {
        texts.extend(texts_from_file(file).map_err(run_error)?);
    }
    if texts.is_empty() {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "no text to embed: give texts as arguments, --file FILE, or --token-ids"
        )));
    }
    Ok((EncoderInput::Texts(texts.clone()), texts))
}

/// One embedding per text, in input order.
fn embeddings(
    outcome: &Outcome,
    prepared: &Prepared,
    texts: usize,
) -> Result<Vec<Vec<f32>>, Failure> {
    let order = prepared.facts().output_order();
    embeddings_in_input_order(&outcome.report.outputs, texts, order).ok_or_else(|| {
        Failure::run_failed(anyhow::anyhow!(
            "the run produced {} values for {texts} texts (was it interrupted?)",
            outcome.report.outputs.values().map(Vec::len).sum::<usize>()
        ))
    })
}

/// The embeddings (their first values and norm) and the similarity table.
fn render(texts: &[Embedded], similarity: &[Vec<f32>]) -> String {
    let mut out = String::new();
    for (number, text) in texts.iter().enumerate() {
        let norm = text.embedding.iter().map(|v| v * v).sum::<f32>().sqrt();
        let head: Vec<String> = text
            .embedding
            .iter()
            .take(4)
            .map(|value| format!("{value:+.4}"))
            .collect();
        out.push_str(&format!(
            "[{}] {}{}\n    {} values, norm {norm:.4}: [{}, …]\n",
            number + 1,
            text.text,
            if text.truncated { " (truncated)" } else { "" },
            text.embedding.len(),
            head.join(", ")
        ));
    }
    if texts.len() >= 2 {
        out.push_str("cosine similarity:\n     ");
        for column in 1..=texts.len() {
            out.push_str(&format!("{column:>8}"));
        }
        out.push('\n');
        for (row, values) in similarity.iter().enumerate() {
            out.push_str(&format!("{:>5}", format!("[{}]", row + 1)));
            for value in values {
                out.push_str(&format!("{value:>8.4}"));
            }
            out.push('\n');
        }
    }
    out
}
