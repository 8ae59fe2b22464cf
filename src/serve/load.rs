//! Loading one model of the config: its settings (the server's settings file and
//! flags, then the model's own budgets), the folder opened by the run's own
//! [`prepare_with`], its tokenizer, chat template and end-of-text ids, and its thread
//! running [`serve_jobs`] until its queue closes.

use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::Value;
use stagehand_actors::StatsSnapshot;

use crate::families::llama::ExpertHint;
use crate::families::llama::Sampling;
use crate::families::{DecoderInput, EncoderInput, Extras, PromptInput, WorkloadKind};
use crate::lora::LoraSpec;
use crate::model::ModelFolder;
use crate::run::loaded::{serve_jobs, BatchLimits, BatchObserver, LoadedInfo, LoadedOptions};
use crate::run::{prepare_with, RunError};
use crate::settings::{self, SettingsArgs};
use crate::telemetry::serving::{ModelSeries, ServeTelemetry};

use super::chat::ChatTemplate;
use super::config::{ModelConfig, ServeConfig};
use super::state::ServedModel;
use super::ServeError;

/// A model's thread; it returns the session's final counters.
pub(super) type Worker = JoinHandle<Result<StatsSnapshot, RunError>>;

/// Records each step's batch size on the model's series.
struct SeriesBatches(Arc<ModelSeries>);

impl BatchObserver for SeriesBatches {
    fn batch(&mut self, sequences: usize) {
        self.0.batch_size.record(sequences as f64);
    }
}

/// Opens `model`, starts its thread and waits until its session runs.
pub(super) fn load(
    model: &ModelConfig,
    config: &ServeConfig,
    base: &SettingsArgs,
    telemetry: &ServeTelemetry,
) -> Result<(ServedModel, Worker), ServeError> {
    let name = &model.name;
    let bad = |problem: String| ServeError::BadInput(format!("models.{name}: {problem}"));
    let settings = model_settings(model, config, base).map_err(bad)?;
    let extras = extras(model).map_err(bad)?;
    let prepared = prepare_with(
        &model.folder,
        WorkloadKind::Auto,
        1,
        &settings,
        false,
        &extras,
    )
    .map_err(|error| bad(error.to_string()))?;
    let kind = prepared.facts().kind();
    if kind != WorkloadKind::Encoder && kind != WorkloadKind::Decoder {
        return Err(bad(format!(
            "{} is {}; serve takes encoders (embeddings) and decoders (completions, chat)",
            model.folder.display(),
            kind.with_article()
        )));
    }
    let TextSide {
        tokenizer,
        chat,
        stop_tokens,
    } = text_side(prepared.folder.as_ref(), kind).map_err(bad)?;
    let series = telemetry
        .model(name)
        .ok_or_else(|| ServeError::Failed(format!("no series for {name}")))?;
    let queue_depth = model.queue_depth.unwrap_or(config.limits.queue_depth);
    let max_tokens = model
        .max_tokens
        .unwrap_or(config.limits.max_tokens)
        .min(config.limits.max_tokens);
    let limits = BatchLimits {
        max_sequences: model.max_sequences,
        max_batch_tokens: model.max_batch_tokens,
        max_sequence_tokens: config.limits.max_prompt_tokens as u64 + max_tokens,
    };
    let (jobs, queue) = flume::bounded(queue_depth);
    let (ready, loaded) = flume::bounded(1);
    let observer = Arc::clone(&telemetry.observer) as Arc<dyn stagehand_actors::Observer>;
    let batches = Box::new(SeriesBatches(Arc::clone(&series)));
    let worker = std::thread::Builder::new()
        .name(format!("serve-{name}"))
        .spawn(move || {
            let options = LoadedOptions {
                settings: &settings,
                limits,
                observer,
                batches,
            };
            serve_jobs(prepared, options, queue, |info| {
                let _ = ready.send(info);
            })
        })
        .map_err(|error| {
            ServeError::Failed(format!("cannot start the thread of {name}: {error}"))
        })?;
    let (info, worker) = await_ready(&loaded, worker).map_err(bad)?;
    tracing::info!(
        "serve: {name} loaded ({}, {} streamed under a VRAM budget of {} and a pin ceiling of {})",
        kind.with_article(),
        stagehand_actors::Bytes(info.model_bytes),
        stagehand_actors::Bytes(info.budgets.vram_budget_bytes),
        stagehand_actors::Bytes(info.budgets.pin_ceiling_bytes)
    );
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let served = ServedModel {
        name: name.clone(),
        info,
        jobs,
        queue_depth,
        max_tokens,
        tokenizer,
        chat,
        stop_tokens,
        series,
        created,
    };
    Ok((served, worker))
}

/// What the handlers need of a folder to turn text into tokens and back.
struct TextSide {
    tokenizer: Option<tokenizers::Tokenizer>,
    /// Decoders with a `chat_template`.
    chat: Option<ChatTemplate>,
    /// `eos_token_id` of `config.json`.
    stop_tokens: Vec<u32>,
}

fn text_side(folder: Option<&ModelFolder>, kind: WorkloadKind) -> Result<TextSide, String> {
    let Some(folder) = folder else {
        return Ok(TextSide {
            tokenizer: None,
            chat: None,
            stop_tokens: Vec::new(),
        });
    };
    let tokenizer = folder
        .tokenizer
        .as_ref()
        .map(tokenizers::Tokenizer::from_file)
        .transpose()
        .map_err(|error| format!("tokenizer.json: {error}"))?;
    let chat = match kind {
        WorkloadKind::Decoder => ChatTemplate::from_folder(&folder.dir)?,
        _ => None,
    };
    Ok(TextSide {
        tokenizer,
        chat,
        stop_tokens: eos_ids(&folder.config),
    })
}

/// Waits until the model's thread says its session runs; on failure the thread is
/// joined (its budgets are back) and the reason returned.
fn await_ready(
    loaded: &flume::Receiver<Result<LoadedInfo, RunError>>,
    worker: Worker,
) -> Result<(LoadedInfo, Worker), String> {
    match loaded.recv() {
        Ok(Ok(info)) => Ok((info, worker)),
        Ok(Err(error)) => {
            let _ = join(worker);
            Err(error.to_string())
        }
        Err(_) => Err(join(worker)
            .err()
            .map_or("stopped while loading".to_string(), |error| {
                error.to_string()
            })),
    }
}

/// Waits for a model's thread; its error (or panic) becomes the server's.
pub(super) fn join(worker: Worker) -> Result<StatsSnapshot, ServeError> {
    match worker.join() {
        Ok(Ok(stats)) => Ok(stats),
        Ok(Err(RunError::BadInput(message))) => Err(ServeError::BadInput(message)),
        Ok(Err(RunError::Failed(message))) => Err(ServeError::Failed(message)),
        Err(_) => Err(ServeError::Failed("a model's thread panicked".into())),
    }
}

/// The server's settings (file and flags) with the model's own budgets over them.
fn model_settings(
    model: &ModelConfig,
    config: &ServeConfig,
    base: &SettingsArgs,
) -> Result<settings::Settings, String> {
    let mut args = base.clone();
    if args.config.is_none() {
        args.config = config.settings.clone();
    }
    if let Some(budget) = &model.vram_budget {
        args.vram_budget = Some(budget.clone());
    }
    if let Some(ceiling) = &model.pin_ceiling {
        args.pin_ceiling = Some(ceiling.clone());
    }
    settings::load(&args)
        .map(|loaded| loaded.settings)
        .map_err(|error| error.to_string())
}

/// The adapters, and a one-token input the family opens with (requests bring their own).
fn extras(model: &ModelConfig) -> Result<Extras, String> {
    let loras = model
        .lora
        .iter()
        .map(|text| LoraSpec::parse(text).map_err(|error| format!("lora \"{text}\": {error}")))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Extras {
        loras,
        decoder: Some(DecoderInput {
            prompt: PromptInput::TokenIds(vec![0]),
            sampling: Sampling::default(),
            hint: ExpertHint::NextLayer,
        }),
        encoder: Some(EncoderInput::TokenIds(vec![vec![0]])),
        ..Extras::default()
    })
}

/// `eos_token_id` of `config.json`: one id or a list.
fn eos_ids(config: &Value) -> Vec<u32> {
    match config.get("eos_token_id") {
        Some(Value::Number(id)) => id.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Value::Array(ids)) => ids
            .iter()
            .filter_map(Value::as_u64)
            .map(|id| id as u32)
            .collect(),
        _ => Vec::new(),
    }
}
