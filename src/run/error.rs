//! Why a run could not be set up or failed, as kinds an embedder can match on.
//!
//! Every kind carries the figures a caller acts on (which budget, the value given,
//! the least that works; which file; which setting) and, in `message`, the one line
//! the CLI prints. Where the cause is an error of its own (the model index's, the
//! session's, the operating system's) it is kept as [`std::error::Error::source`], so
//! a caller can walk the chain and downcast; the message already says it in words, so
//! a reporter prints the message alone, not the message and then the chain.
//!
//! The CLI's exit status comes from the kind ([`RunError::exit_code`]): 2 for what
//! the caller can fix by changing what it gave (bad input), 1 for a run that failed.

use std::path::PathBuf;

/// The cause of a run error, when it is an error of its own: the model index's
/// [`crate::model::IndexError`], the actors' [`SessionError`](stagehand_actors::SessionError), an [`std::io::Error`],
/// a CUDA error. Downcast it to look inside.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Which memory budget a [`RunError::BudgetTooSmall`] is about.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// The VRAM budget: `vram_budget`, `--vram-budget` ([`crate::run::Budgets`]'s
    /// `vram_budget_bytes`).
    Vram,
    /// The pinned-RAM ceiling: `pin_ceiling`, `--pin-ceiling`
    /// ([`crate::run::Budgets`]'s `pin_ceiling_bytes`).
    PinCeiling,
}

impl Budget {
    /// The setting's key in a config file (`vram_budget`, `pin_ceiling`).
    pub fn key(self) -> &'static str {
        match self {
            Budget::Vram => "vram_budget",
            Budget::PinCeiling => "pin_ceiling",
        }
    }

    /// The command-line flag (`--vram-budget`, `--pin-ceiling`).
    pub fn flag(self) -> &'static str {
        match self {
            Budget::Vram => "--vram-budget",
            Budget::PinCeiling => "--pin-ceiling",
        }
    }
}

/// Why a run could not be set up (exit 2) or failed (exit 1).
///
/// Match on the kind; the `message` of each is the sentence a user reads (what was
/// wrong and what to do), and [`Display`](std::fmt::Display) prints it. New kinds may
/// be added, so a `match` needs a `_` arm.
///
/// | kind | exit | what went wrong |
/// |---|---|---|
/// | [`BudgetTooSmall`](Self::BudgetTooSmall) | 2 | a budget below what the plan needs; `least_bytes` works |
/// | [`NotEnoughMemory`](Self::NotEnoughMemory) | 2 | a buffer a setting sizes does not fit in the RAM the machine can spare |
/// | [`CorruptCheckpoint`](Self::CorruptCheckpoint) | 2 | the checkpoint is not a valid safetensors file, or lacks a tensor its model needs, or holds one of another shape |
/// | [`CheckpointChanged`](Self::CheckpointChanged) | 1 | a file changed on disk (rewritten, truncated) after it was indexed |
/// | [`UnsupportedModel`](Self::UnsupportedModel) | 2 | a layout, model type, dtype or `config.json` value stagehand does not compute |
/// | [`MissingFile`](Self::MissingFile) | 2 | a file or folder the caller named (or the model needs beside it, a tokenizer) does not exist |
/// | [`Unreadable`](Self::Unreadable) | 2 | a file the caller named (or the model's tokenizer) exists but cannot be read as what it is |
/// | [`BadSetting`](Self::BadSetting) | 2 | a setting's value is refused; `key` names it |
/// | [`MissingCapability`](Self::MissingCapability) | 2 | the CPU, GPU or build cannot do what was asked |
/// | [`Device`](Self::Device) | 1 | the device failed (a copy, a driver call, an allocation) |
/// | [`Io`](Self::Io) | 1 | reading or writing failed while the run worked |
/// | [`Cancelled`](Self::Cancelled) | 1 | the owner asked the run to stop (a signal, a stop flag), or a loaded model stopped before a queued job ran |
/// | [`BadRequest`](Self::BadRequest) | 2 | the request is refused (a prompt too long, an input of the wrong size, a model asked for what it does not do); `field` names it |
/// | [`NoRoom`](Self::NoRoom) | 1 | the budget had no room now for a step's activations (KV pages, an adapter's regions) beside what others hold: a retry may fit |
/// | [`Internal`](Self::Internal) | 1 | stagehand's own bug or an invariant that broke: report it |
///
/// A model family's error ([`FamilyError`](crate::families::FamilyError)) becomes
/// the kind of what it says, and stays the [`source`](std::error::Error::source) to
/// downcast for its details (the tensor's name, the shapes):
///
/// | family kind | run kind |
/// |---|---|
/// | `MissingTensor`, `TensorShape` | [`CorruptCheckpoint`](Self::CorruptCheckpoint) with the checkpoint's path: the file is not the whole model its config describes |
/// | `TensorDtype` | [`UnsupportedModel`](Self::UnsupportedModel), `found` the dtype |
/// | `BadConfig` | [`UnsupportedModel`](Self::UnsupportedModel), `found` the `config.json` key (`"config.json"` for the whole file) |
/// | `Unsupported` | [`UnsupportedModel`](Self::UnsupportedModel) |
/// | `MissingFile` | [`MissingFile`](Self::MissingFile) |
/// | `BadFile` | [`Unreadable`](Self::Unreadable) |
/// | `BadRequest`, `Lora` | [`BadRequest`](Self::BadRequest) (`field` `"lora"` for a LoRA) |
/// | `NotEnoughMemory`, a `Compute` out of memory | [`NotEnoughMemory`](Self::NotEnoughMemory) |
/// | `NoRoom` | [`NoRoom`](Self::NoRoom) |
/// | `Corrupt` (a block landed with other bytes than the file's) | [`Device`](Self::Device) |
/// | `Internal`, `Mismatch`, a `Compute` shape error | [`Internal`](Self::Internal) |
/// | `Io`, `Changed`, `Session`, a device's `Compute` | [`Io`](Self::Io), [`CheckpointChanged`](Self::CheckpointChanged), the session's kind, [`Device`](Self::Device) |
///
/// A [`SessionError`](stagehand_actors::SessionError) becomes: a plan's budget refusal, `NoPlace` and
/// `LoraPinCeiling` [`BudgetTooSmall`](Self::BudgetTooSmall); `Activations` and
/// `Starved` [`NoRoom`](Self::NoRoom); `TooManyAdapters` [`BadRequest`](Self::BadRequest)
/// (`lora`); `Plan`'s `Zero` [`BadSetting`](Self::BadSetting); `Interrupted`
/// [`Cancelled`](Self::Cancelled); `ReadFailed` [`CheckpointChanged`](Self::CheckpointChanged)
/// or [`Io`](Self::Io); `Device`, `CopyFailed`, `PinFailed` [`Device`](Self::Device); the
/// rest (an unknown block, a stopped session, a LoRA protocol error, an empty order)
/// [`Internal`](Self::Internal).
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A budget is below what this model's plan needs. Retrying with `budget` at
    /// `least_bytes` (and everything else as it was) gets past this refusal.
    #[error("{message}")]
    BudgetTooSmall {
        /// Which budget.
        budget: Budget,
        /// The value given (for a budget cut to whole driver pages, the value asked).
        given_bytes: u64,
        /// The least value that works, rounded up to what the flag can state.
        least_bytes: u64,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// A buffer a setting sizes (`--batch`, the LoRA rank, the staging ring) needs
    /// more RAM than the machine can spare (`MemAvailable` less `ram_floor`), or an
    /// activation did not fit in the memory it is computed in (the family's
    /// `Compute` out of memory: lower `--batch`); `None` for a size that overflows or
    /// was not told.
    #[error("{message}")]
    NotEnoughMemory {
        needed_bytes: Option<u64>,
        /// What the machine can spare (`None`: the size overflowed, nothing to compare).
        spare_bytes: Option<u64>,
        message: String,
    },
    /// The checkpoint at `path` is not a valid safetensors file (a truncated or
    /// unparsable header, tensors past the end of the file, shards that disagree), or
    /// is valid but not the whole model its config describes: a tensor missing or of
    /// another shape (the source is the family's `MissingTensor` or `TensorShape`,
    /// with the tensor's name). A missing tensor is taken for a damaged or partial
    /// checkpoint, not for another model: a layout no family reads is refused by name
    /// before its tensors are looked up ([`UnsupportedModel`](Self::UnsupportedModel)).
    #[error("{message}")]
    CorruptCheckpoint {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// A file of the model changed on disk (rewritten, truncated, replaced) after it
    /// was indexed: its bytes can no longer be trusted.
    #[error("{message}")]
    CheckpointChanged {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// What is at `path` is a layout, model type or format stagehand does not
    /// compute: `found` says what it is (a `model_type`, a dtype, "diffusers pipeline",
    /// or the `config.json` key whose value is refused, the family's `BadConfig`).
    #[error("{message}")]
    UnsupportedModel {
        path: PathBuf,
        found: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// A file or folder the caller named does not exist, or one the model needs
    /// beside its weights (a tokenizer, the Hugging Face folder of a bare checkpoint).
    #[error("{message}")]
    MissingFile {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// A file the caller named exists but cannot be read (permissions, a folder where
    /// a file was expected), or a file of the model's folder is not what it is named
    /// (a tokenizer its library cannot read, a module config that is not JSON).
    #[error("{message}")]
    Unreadable {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// A setting's value is refused: `key` names it as a config file does
    /// (`prefetch_depth`, `block_pattern`, `budget.vram_budget`).
    #[error("{message}")]
    BadSetting { key: String, message: String },
    /// The machine or the build cannot do what was asked: `capability` names it
    /// (`cuda`, `compute_dtype`, `cpu device`), e.g. `compute_dtype = "bf16"` on
    /// CUDA, or `--device cuda` on a machine with no CUDA device.
    #[error("{message}")]
    MissingCapability {
        capability: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The device failed: a copy, a driver call, a device allocation, a block whose
    /// bytes landed other than the file's (the landing check), the calibration of the
    /// copy and read rates.
    #[error("{message}")]
    Device {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// Reading or writing `path` failed while the run worked (`path` is empty where
    /// the storage adapter did not name the file, as an injected fault).
    #[error("{message}")]
    Io {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The owner asked the run to stop (a signal, the plan's stop flag) before it
    /// finished; every budget was released. A kept-loaded model that stopped (its
    /// queue closed, or it failed) cancels the jobs still queued, saying why.
    #[error("{message}")]
    Cancelled { message: String },
    /// The request is refused: `field` names what to change as a request spells it
    /// (`prompt`, `max_tokens`, `width`, `strength`, `lora`), e.g. a prompt longer
    /// than the model's context, an input of the wrong size, a value out of range.
    #[error("{message}")]
    BadRequest {
        field: String,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The budget had no room now for what a step needs beside what is held: a
    /// sequence's activations (its KV pages), an adapter's VRAM regions, a block that
    /// kept being evicted before it could be used. The step gave back what it held;
    /// a retry may fit once other work (another sequence, another model of a shared
    /// budget) has left, and a larger budget does (the source, the session's
    /// `Activations` error where there is one, says how much). serve answers 503
    /// with `Retry-After`.
    #[error("{message}")]
    NoRoom {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// Stagehand's own bug, or one of its invariants that broke (a shape two of its
    /// parts disagree on, a thread that panicked, a session asked out of order, a
    /// result that differs from its reference): nothing the caller gave can fix it.
    /// Report it, with the message.
    #[error("{message}")]
    Internal {
        message: String,
        #[source]
        source: Option<Cause>,
    },
}

impl RunError {
    /// Whether the caller can fix this by changing what it gave (a budget, a file, a
    /// setting, the device asked for): the CLI's exit 2.
    pub fn is_bad_input(&self) -> bool {
        !matches!(
            self,
            RunError::CheckpointChanged { .. }
                | RunError::Device { .. }
                | RunError::Io { .. }
                | RunError::Cancelled { .. }
                | RunError::NoRoom { .. }
                | RunError::Internal { .. }
        )
    }

    /// The CLI's exit status for this error: 2 for bad input, 1 for a failed run.
    pub fn exit_code(&self) -> u8 {
        if self.is_bad_input() {
            2
        } else {
            1
        }
    }

    /// A copy of the kind, its figures and its message, without the source chain (a
    /// source is not copyable): what each job of a batch gets of the batch's one
    /// error, so that every caller can still match on what went wrong.
    pub fn detached(&self) -> RunError {
        let message = self.to_string();
        match self {
            RunError::BudgetTooSmall {
                budget,
                given_bytes,
                least_bytes,
                ..
            } => RunError::budget(*budget, *given_bytes, *least_bytes, message),
            RunError::NotEnoughMemory {
                needed_bytes,
                spare_bytes,
                ..
            } => RunError::NotEnoughMemory {
                needed_bytes: *needed_bytes,
                spare_bytes: *spare_bytes,
                message,
            },
            RunError::CorruptCheckpoint { path, .. } => RunError::CorruptCheckpoint {
                path: path.clone(),
                message,
                source: None,
            },
            RunError::CheckpointChanged { path, .. } => RunError::CheckpointChanged {
                path: path.clone(),
                message,
                source: None,
            },
            RunError::UnsupportedModel { path, found, .. } => RunError::UnsupportedModel {
                path: path.clone(),
                found: found.clone(),
                message,
                source: None,
            },
            RunError::MissingFile { path, .. } => RunError::MissingFile {
                path: path.clone(),
                message,
                source: None,
            },
            RunError::Unreadable { path, .. } => RunError::Unreadable {
                path: path.clone(),
                message,
                source: None,
            },
            RunError::BadSetting { key, .. } => RunError::setting(key.clone(), message),
            RunError::MissingCapability { capability, .. } => {
                RunError::capability(capability, message)
            }
            RunError::Device { .. } => RunError::Device {
                message,
                source: None,
            },
            RunError::Io { path, .. } => RunError::Io {
                path: path.clone(),
                message,
                source: None,
            },
            RunError::Cancelled { .. } => RunError::Cancelled { message },
            RunError::BadRequest { field, .. } => RunError::request(field, message),
            RunError::NoRoom { .. } => RunError::NoRoom {
                message,
                source: None,
            },
            RunError::Internal { .. } => RunError::internal(message),
        }
    }

    /// A budget refusal of `budget`, `given_bytes` asked and `least_bytes` needed.
    pub(crate) fn budget(
        budget: Budget,
        given_bytes: u64,
        least_bytes: u64,
        message: String,
    ) -> Self {
        RunError::BudgetTooSmall {
            budget,
            given_bytes,
            least_bytes,
            message,
            source: None,
        }
    }

    /// A refused setting `key`.
    pub(crate) fn setting(key: impl Into<String>, message: impl Into<String>) -> Self {
        RunError::BadSetting {
            key: key.into(),
            message: message.into(),
        }
    }

    /// A refused request `field`.
    pub(crate) fn request(field: &str, message: impl Into<String>) -> Self {
        RunError::BadRequest {
            field: field.to_string(),
            message: message.into(),
            source: None,
        }
    }

    /// Stagehand's own bug: `message` says which rule broke.
    pub(crate) fn internal(message: impl Into<String>) -> Self {
        RunError::Internal {
            message: message.into(),
            source: None,
        }
    }

    /// Something the machine or build lacks.
    pub(crate) fn capability(capability: &str, message: impl Into<String>) -> Self {
        RunError::MissingCapability {
            capability: capability.to_string(),
            message: message.into(),
            source: None,
        }
    }

    /// The same kind with `suffix` added to its message (a failed run says whether
    /// every budget came back).
    pub(crate) fn with_suffix(mut self, suffix: &str) -> Self {
        self.message_mut().push_str(suffix);
        self
    }

    /// The same kind saying `message` (a pipeline's line, naming the stage).
    pub(crate) fn with_message(mut self, message: String) -> Self {
        *self.message_mut() = message;
        self
    }

    fn message_mut(&mut self) -> &mut String {
        match self {
            RunError::BudgetTooSmall { message, .. }
            | RunError::NotEnoughMemory { message, .. }
            | RunError::CorruptCheckpoint { message, .. }
            | RunError::CheckpointChanged { message, .. }
            | RunError::UnsupportedModel { message, .. }
            | RunError::MissingFile { message, .. }
            | RunError::Unreadable { message, .. }
            | RunError::BadSetting { message, .. }
            | RunError::MissingCapability { message, .. }
            | RunError::Device { message, .. }
            | RunError::Io { message, .. }
            | RunError::BadRequest { message, .. }
            | RunError::NoRoom { message, .. }
            | RunError::Internal { message, .. }
            | RunError::Cancelled { message } => message,
        }
    }
}
