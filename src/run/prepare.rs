//! From what the user pointed at to a workload: the registry finds the family that
//! computes a Hugging Face folder or a generated demo model, or the bare checkpoint is
//! streamed and checked (its bytes, nothing computed); the family opens it with the
//! run's inputs.

use std::path::Path;

use crate::families::bert::EmbeddingPlacement;
use crate::families::lora_set::LoraSet;
use crate::families::{Entry, Extras, Facts, FamilyError, Found, Request, WorkloadKind};
use crate::lora::LoraSpec;
use crate::model::{CheckpointPart, ModelFolder, ModelIndex};
use crate::settings::Settings;

use super::driver::{LoraPhase, Workload};
use super::RunError;

/// A model opened for a run, with its workload.
pub struct Prepared {
    pub index: ModelIndex,
    pub workload: Workload,
    pub is_demo: bool,
    pub folder: Option<ModelFolder>,
    /// The registry's line of the family that opened it.
    pub family: &'static Entry,
    /// Texts that were longer than the model takes, by position (encoders).
    pub truncated_texts: Vec<usize>,
    /// Adapters a kept-loaded model switches to per request (`serve`'s
    /// `"model": "base:adapter"`), each a whole set: the model's own LoRA, then the
    /// adapter's. Empty for one-shot runs.
    pub adapters: Vec<NamedLora>,
}

/// A LoRA set a request can choose by name.
pub struct NamedLora {
    pub name: String,
    pub set: LoraSet,
}

impl Prepared {
    /// What the run and the tools ask about the model, whatever its family.
    pub fn facts(&self) -> &dyn Facts {
        self.workload.model.facts()
    }

    /// Adds a set requests can choose as `name`: `specs` placed where the family puts
    /// each target tensor (the same checks as `--lora`).
    pub fn add_adapter(&mut self, name: &str, specs: &[LoraSpec]) -> Result<(), RunError> {
        let facts = self.facts();
        if !facts.takes_lora() {
            return Err(RunError::setting(
                "adapters",
                format!("adapter {name}: this model takes no LoRA (serve applies adapters to BERT encoders and Llama-family decoders)"),
            ));
        }
        let place = |tensor: usize| facts.place(&self.index, tensor);
        let aliases = facts.lora_aliases();
        let set = LoraSet::load(&self.index, &aliases, specs, facts.layout().len(), &place)
            .map_err(|error| RunError::BadRequest {
                field: "adapters".to_string(),
                message: format!("adapter {name}: {error}"),
                source: Some(Box::new(error)),
            })?;
        self.adapters.push(NamedLora {
            name: name.to_string(),
            set,
        });
        Ok(())
    }

    /// Every LoRA set a session of this model may attach (one at a time): its phases'
    /// and its adapters'.
    pub fn lora_sets(&self) -> impl Iterator<Item = &LoraSet> {
        let phases = self.workload.lora.iter().map(|phase| &phase.set);
        phases.chain(self.adapters.iter().map(|adapter| &adapter.set))
    }

    /// Bytes the session streams: the layout's, which may leave out tensors the
    /// forward pass never reads or keeps on the host.
    pub fn streamed_model_bytes(&self) -> u64 {
        self.facts().layout().total_bytes()
    }

    /// Device memory a run of `steps` steps reserves beside the weights: a decoder's KV
    /// cache for its prompt and tokens, in whole pages.
    pub fn activation_bytes(&self, steps: u64) -> u64 {
        self.facts().activation_bytes(steps)
    }

    /// A one-line name of what runs, for summaries.
    pub fn describe(&self) -> &'static str {
        self.facts().describe()
    }
}

pub fn prepare(
    model: &Path,
    kind: WorkloadKind,
    batch: usize,
    settings: &Settings,
    is_demo: bool,
) -> Result<Prepared, RunError> {
    prepare_with(model, kind, batch, settings, is_demo, &Extras::default())
}

/// As [`prepare`], with LoRA adapters, MoE options or an encoder's texts.
pub fn prepare_with(
    model: &Path,
    kind: WorkloadKind,
    batch: usize,
    settings: &Settings,
    is_demo: bool,
    extras: &Extras,
) -> Result<Prepared, RunError> {
    // A part of a checkpoint is read by its tensors alone: a config.json beside the
    // file is the config of something else.
    let folder = match extras.part {
        Some(_) => None,
        None => ModelFolder::find(model).map_err(folder_error)?,
    };
    let checkpoint = folder
        .as_ref()
        .map_or(model, |folder| folder.checkpoint.as_path());
    let pattern = settings.block_pattern.as_deref();
    let index = open_index(checkpoint, pattern, extras.part.as_ref(), folder.is_none())
        .map_err(RunError::from_index)?;
    if index.blocks.is_empty() {
        return Err(RunError::UnsupportedModel {
            path: model.to_path_buf(),
            found: "a checkpoint with no tensors".to_string(),
            message: format!("{}: the model has no tensors to stream", model.display()),
            source: None,
        });
    }
    super::memory::check_largest_block(&index, settings)?;
    let found = Found {
        index: &index,
        folder: folder.as_ref(),
    };
    let entry = crate::families::find(kind, &found).map_err(open_error)?;
    // The activations a batch needs, checked before they are allocated.
    if let Some(width) = entry.activation_row_values(&found) {
        super::memory::check_batch(batch, width, settings)?;
    }
    let request = Request {
        path: model,
        index: &index,
        folder: folder.as_ref(),
        batch,
        extras,
    };
    let opened = entry.open(&request).map_err(open_error)?;
    let facts = opened.facts();
    if !extras.loras.is_empty() && !facts.takes_lora() {
        return Err(RunError::setting(
            "lora",
            "--lora applies to models stagehand computes with dense layers (the demo linear stack, BERT encoders, Llama-family decoders); drop --lora for this model",
        ));
    }
    let lora = lora_phase(&index, &extras.loras, facts)?;
    let truncated_texts = facts.truncated_inputs().to_vec();
    // A generated demo model gets the demo's defaults (budgets that make both tiers
    // stream) however it was named: plainly or with --model.
    let is_demo = is_demo || facts.kind().is_generated();
    Ok(Prepared {
        index,
        workload: Workload {
            model: opened,
            lora,
        },
        is_demo,
        folder,
        family: entry,
        truncated_texts,
        adapters: Vec::new(),
    })
}

/// The index of the model a run opens: `part` of the checkpoint when one is named;
/// else the whole checkpoint — and a bare one (no folder) in names its family reads
/// otherwise (the Flux autoencoder's original ones) read as that family names them.
pub fn open_index(
    checkpoint: &Path,
    pattern: Option<&str>,
    part: Option<&CheckpointPart>,
    bare: bool,
) -> Result<ModelIndex, crate::model::IndexError> {
    if let Some(part) = part {
        return ModelIndex::open_part(checkpoint, pattern, part);
    }
    let index = ModelIndex::open(checkpoint, pattern)?;
    match CheckpointPart::implied(&index) {
        Some(implied) if bare => ModelIndex::open_part(checkpoint, pattern, &implied),
        _ => Ok(index),
    }
}

/// A family that could not open its checkpoint, by kind: the user's input (exit 2),
/// unless the files themselves could not be read (exit 1).
fn open_error(error: FamilyError) -> RunError {
    RunError::from_family(error, 0)
}

/// A model folder that cannot be read as one: its `config.json` unreadable or not a
/// JSON object is unreadable (bad input), a folder that is not there is missing.
fn folder_error(error: crate::model::FolderError) -> RunError {
    let message = error.to_string();
    if !error.path.exists() {
        return RunError::MissingFile {
            path: error.path.clone(),
            message,
            source: Some(Box::new(error)),
        };
    }
    RunError::Unreadable {
        path: error.path.clone(),
        message,
        source: Some(Box::new(error)),
    }
}

/// One LoRA phase from step 0 with `specs` placed where the family puts each target
/// tensor, or none.
fn lora_phase(
    index: &ModelIndex,
    specs: &[LoraSpec],
    facts: &dyn Facts,
) -> Result<Vec<LoraPhase>, RunError> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let place = |tensor: usize| facts.place(index, tensor);
    let aliases = facts.lora_aliases();
    let set =
        LoraSet::load(index, &aliases, specs, facts.layout().len(), &place).map_err(|error| {
            RunError::BadRequest {
                field: "lora".to_string(),
                message: error.to_string(),
                source: Some(Box::new(error)),
            }
        })?;
    Ok(vec![LoraPhase { from_step: 0, set }])
}

/// Texts read from `--file`: one per line, blank lines skipped.
pub fn texts_from_file(path: &Path) -> Result<Vec<String>, RunError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        let message = format!("{}: {error}", path.display());
        let path = path.to_path_buf();
        let source = Some(Box::new(error) as super::Cause);
        if path.exists() {
            RunError::Unreadable {
                path,
                message,
                source,
            }
        } else {
            RunError::MissingFile {
                path,
                message,
                source,
            }
        }
    })?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect())
}

/// `--token-ids 101,2023,102` (one text; repeat the flag for more).
pub fn parse_token_ids(text: &str) -> Result<Vec<u32>, String> {
    text.split(',')
        .map(|id| {
            id.trim()
                .parse::<u32>()
                .map_err(|_| format!("`{id}` is not a token id; write ids as 101,2023,102"))
        })
        .collect()
}

impl EmbeddingPlacement {
    pub fn describe(self) -> &'static str {
        match self {
            EmbeddingPlacement::Auto => "auto",
            EmbeddingPlacement::Host => "host",
            EmbeddingPlacement::Device => "device",
        }
    }
}
