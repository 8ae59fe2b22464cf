//! Loading one model of the config: its settings (the server's settings file and
//! flags, then the model's own budgets), the folder opened by the run's own
//! [`prepare_with`], its tokenizer, chat template and end-of-text ids, and its thread
//! running [`serve_jobs`] until its queue closes.

use std::sync::Arc;
use std::thread::JoinHandle;

use serde_json::Value;
use stagehand_actors::{SharedBudget, StatsSnapshot};

use crate::families::llama::ExpertHint;
use crate::families::llama::Sampling;
use crate::families::{DecoderInput, EncoderInput, Endpoints, Extras, PromptInput, WorkloadKind};
use crate::lora::LoraSpec;
use crate::model::ModelFolder;
use crate::run::loaded::{
    serve_jobs, BatchLimits, BatchObserver, LoadedInfo, LoadedOptions, SharedMember,
};
use crate::run::{prepare_with, RunError};
use crate::settings::{self, SettingsArgs};
use crate::telemetry::serving::{ModelSeries, ServeTelemetry};

use super::chat::ChatTemplate;
use super::config::{ModelConfig, ServeConfig};
use super::residency::ResidencyProbe;
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

    fn adapter_switch(&mut self) {
        self.0.adapter_switches.increment(1);
    }
}

/// Opens `model`, starts its thread and waits until its session runs.
pub(super) fn load(
    model: &ModelConfig,
    config: &ServeConfig,
    base: &SettingsArgs,
    telemetry: &ServeTelemetry,
    shared: Option<&SharedBudget>,
) -> Result<(ServedModel, Worker), ServeError> {
    let name = &model.name;
    let bad = |problem| ServeError::model_entry(name, problem);
    let settings = model_settings(model, config, base).map_err(bad)?;
    let member = || shared.map(|pool| (pool.clone(), name.clone()));
    if crate::pipeline::WanParts::is_pipeline(&model.folder) {
        return super::video_model::load_videos(model, config, (settings, member()), telemetry);
    }
    if model.parts.is_some() || crate::pipeline::FluxParts::is_pipeline(&model.folder) {
        return super::pipeline_model::load_images(model, config, (settings, member()), telemetry);
    }
    let prepared = open(model, &settings)?;
    let kind = prepared.facts().kind();
    let endpoints = prepared.family.endpoints;
    if endpoints == Endpoints::None {
        return Err(bad(format!(
            "{} is {}; serve takes encoders (embeddings), decoders (completions, chat), Flux pipelines (images) and Wan pipelines (videos)",
            model.folder.display(),
            kind.with_article()
        )));
    }
    let TextSide {
        tokenizer,
        chat,
        stop_tokens,
    } = text_side(prepared.folder.as_ref(), endpoints).map_err(bad)?;
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
    let residency = ResidencyProbe::new();
    let observer = observer(telemetry, name, &residency)?;
    let batches = Box::new(SeriesBatches(Arc::clone(&series)));
    let shared = shared.map(|pool| SharedMember {
        pool: pool.clone(),
        name: name.clone(),
    });
    let worker = std::thread::Builder::new()
        .name(format!("serve-{name}"))
        .spawn(move || {
            let options = LoadedOptions {
                settings: &settings,
                limits,
                observer,
                batches,
                shared,
            };
            serve_jobs(prepared, options, queue, |info| {
                let _ = ready.send(info);
            })
        })
        .map_err(|error| {
            ServeError::Failed(format!("cannot start the thread of {name}: {error}"))
        })?;
    let (info, worker) = await_ready(&loaded, worker, name)?;
    residency.set_model_bytes(info.model_bytes);
    tracing::info!(
        "serve: {name} loaded ({}, {} streamed under a VRAM budget of {} and a pin ceiling of {})",
        kind.with_article(),
        stagehand_actors::Bytes(info.model_bytes),
        stagehand_actors::Bytes(info.budgets.vram_budget_bytes),
        stagehand_actors::Bytes(info.budgets.pin_ceiling_bytes)
    );
    let served = ServedModel {
        name: name.clone(),
        info,
        jobs,
        queue_depth,
        max_tokens,
        tokenizer,
        chat,
        stop_tokens,
        adapters: model.adapters.keys().cloned().collect(),
        series,
        created: now_seconds(),
        images: None,
        videos: None,
        residency,
        in_flight: Default::default(),
    };
    Ok((served, worker))
}

/// The model's pipeline observer (its Prometheus series) with its residency probe
/// beside it: the session tells both the same events.
pub(super) fn observer(
    telemetry: &ServeTelemetry,
    name: &str,
    residency: &Arc<ResidencyProbe>,
) -> Result<Arc<dyn stagehand_actors::Observer>, ServeError> {
    let series = telemetry
        .observer(name)
        .ok_or_else(|| ServeError::Failed(format!("no pipeline series for {name}")))?;
    Ok(Arc::new(stagehand_actors::Tee(
        series,
        Arc::clone(residency),
    )))
}

pub(super) fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs())
}

/// What the handlers need of a folder to turn text into tokens and back.
struct TextSide {
    tokenizer: Option<tokenizers::Tokenizer>,
    /// Decoders with a `chat_template`.
    chat: Option<ChatTemplate>,
    /// `eos_token_id` of `config.json`.
    stop_tokens: Vec<u32>,
}

fn text_side(folder: Option<&ModelFolder>, endpoints: Endpoints) -> Result<TextSide, String> {
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
        .map(|path| crate::families::tokenizer_json::read(path))
        .transpose()
        .map_err(|error| format!("tokenizer.json: {error}"))?;
    let chat = match endpoints {
        Endpoints::Completions => ChatTemplate::from_folder(&folder.dir)?,
        Endpoints::Embeddings | Endpoints::None => None,
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
    name: &str,
) -> Result<(LoadedInfo, Worker), ServeError> {
    let failed = |source| ServeError::model(name, source);
    match loaded.recv() {
        Ok(Ok(info)) => Ok((info, worker)),
        Ok(Err(error)) => {
            let _ = join(worker);
            Err(failed(error))
        }
        Err(_) => Err(match join(worker) {
            Err(ServeError::Run(error)) => failed(error),
            // The thread panicked before it said whether the model runs.
            Err(other) => failed(RunError::Internal {
                message: other.to_string(),
                source: Some(Box::new(other)),
            }),
            Ok(_) => failed(RunError::Cancelled {
                message: "stopped while loading".to_string(),
            }),
        }),
    }
}

/// Waits for a model's thread; its error (or panic) becomes the server's.
pub(super) fn join(worker: Worker) -> Result<StatsSnapshot, ServeError> {
    match worker.join() {
        Ok(Ok(stats)) => Ok(stats),
        Ok(Err(error)) => Err(ServeError::Run(error)),
        Err(_) => Err(ServeError::Failed("a model's thread panicked".into())),
    }
}

/// The budget every model shares, when the config has a `[budget]` table; its pin
/// ceiling defaults to what the host can spare under the server's settings.
pub(super) fn shared_budget(
    config: &ServeConfig,
    base: &SettingsArgs,
) -> Result<Option<SharedBudget>, ServeError> {
    let Some(budget) = &config.budget else {
        return Ok(None);
    };
    let (vram, pin) = budget
        .bytes()
        .map_err(|problem| ServeError::setting("budget", problem))?;
    let pin = match pin {
        Some(pin) => pin,
        None => {
            let mut args = base.clone();
            if args.config.is_none() {
                args.config = config.settings.clone();
            }
            let settings = settings::load(&args)
                .map_err(|error| ServeError::BadInput(error.to_string()))?
                .settings;
            let available = crate::run::available_ram_bytes().unwrap_or(0);
            crate::run::memory::pinnable_bytes(available, &settings)
        }
    };
    crate::run::loaded::open_shared_budget(vram, pin)
        .map(Some)
        .map_err(ServeError::Run)
}

/// The server's settings (file and flags) with the model's own budgets over them.
fn model_settings(
    model: &ModelConfig,
    config: &ServeConfig,
    base: &SettingsArgs,
) -> Result<settings::Settings, String> {
    let settings = configured_settings(model, config, base)?;
    Ok(share_pin_ceiling(settings, config))
}

/// Without a pin ceiling of its own (in the model, the settings file or a flag), each
/// model's automatic ceiling — what the host can spare — would be the whole spare RAM
/// once per model: the models without one split it evenly instead, so together they
/// never pin more than the host can spare.
fn share_pin_ceiling(mut settings: settings::Settings, config: &ServeConfig) -> settings::Settings {
    let sharing = config
        .models
        .iter()
        .filter(|model| model.pin_ceiling.is_none())
        .count() as u64;
    if settings.pin_ceiling.is_some() || sharing < 2 || config.budget.is_some() {
        return settings;
    }
    if let Some(available) = crate::run::available_ram_bytes() {
        let spare = crate::run::memory::pinnable_bytes(available, &settings);
        settings.pin_ceiling = Some(bytesize::ByteSize::b(spare / sharing));
    }
    settings
}

/// The settings file and flags, with the model's own budgets over them.
fn configured_settings(
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

/// The model's folder opened as `embed` and `generate` open it, with its adapters.
fn open(
    model: &ModelConfig,
    settings: &settings::Settings,
) -> Result<crate::run::Prepared, ServeError> {
    let bad = |problem| ServeError::model_entry(&model.name, problem);
    let extras = extras(model).map_err(bad)?;
    let mut prepared = prepare_with(
        &model.folder,
        WorkloadKind::Auto,
        1,
        settings,
        false,
        &extras,
    )
    .map_err(|source| ServeError::model(&model.name, source))?;
    add_adapters(&mut prepared, model, &extras.loras).map_err(bad)?;
    Ok(prepared)
}

/// The model's `adapters`, each a set of its own `lora` and the adapter's file.
fn add_adapters(
    prepared: &mut crate::run::Prepared,
    model: &ModelConfig,
    own: &[LoraSpec],
) -> Result<(), String> {
    for (name, text) in &model.adapters {
        if name.is_empty() || name.contains(':') {
            return Err(format!(
                "adapters: \"{name}\" is not an adapter name (requests ask for \"{}:NAME\"; a name is not empty and has no `:`)",
                model.name
            ));
        }
        let spec = LoraSpec::parse(text)
            .map_err(|error| format!("adapters.{name} = \"{text}\": {error}"))?;
        let specs: Vec<LoraSpec> = own.iter().cloned().chain([spec]).collect();
        prepared
            .add_adapter(name, &specs)
            .map_err(|error| error.to_string())?;
    }
    Ok(())
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
        ..Extras::default()
    }
    .with(DecoderInput {
        prompt: PromptInput::TokenIds(vec![0]),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    })
    .with(EncoderInput::TokenIds(vec![vec![0]])))
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn config(models: usize) -> ServeConfig {
        ServeConfig {
            models: (0..models)
                .map(|index| ModelConfig::from_folder(Path::new(&format!("m{index}"))))
                .collect(),
            ..ServeConfig::default()
        }
    }

    #[test]
    fn models_without_a_pin_ceiling_split_what_the_host_can_spare() {
        // Proves two automatic ceilings add up to the spare RAM once, not twice, and
        // that an explicit ceiling or a lone model is left as it is.
        let settings = settings::Settings::default();
        let shared = share_pin_ceiling(settings.clone(), &config(2)).pin_ceiling;
        let spare = crate::run::memory::pinnable_bytes(
            crate::run::available_ram_bytes().unwrap_or(0),
            &settings,
        );
        let half = shared.expect("a shared ceiling").as_u64();
        // Free RAM moves between the two reads: within a quarter of half the spare.
        assert!(half.abs_diff(spare / 2) <= spare / 8, "{half} of {spare}");
        assert_eq!(
            share_pin_ceiling(settings.clone(), &config(1)).pin_ceiling,
            None
        );
        let explicit = settings::Settings {
            pin_ceiling: Some(bytesize::ByteSize::mib(64)),
            ..settings
        };
        let kept = share_pin_ceiling(explicit, &config(2)).pin_ceiling;
        assert_eq!(kept, Some(bytesize::ByteSize::mib(64)));
    }
}
