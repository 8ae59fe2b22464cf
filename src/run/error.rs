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

use stagehand_actors::{Bytes, PlanError, SessionError};

use super::refusal::{least_at_flag, vram_refusal};

/// The cause of a run error, when it is an error of its own: the model index's
/// [`crate::model::IndexError`], the actors' [`SessionError`], an [`std::io::Error`],
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
/// | [`Cancelled`](Self::Cancelled) | 1 | the owner asked the run to stop (a signal, a stop flag) |
/// | [`BadRequest`](Self::BadRequest) | 2 | the request is refused (a prompt too long, an input of the wrong size); `field` names it |
/// | [`BadInput`](Self::BadInput) | 2 | any other input the caller must change |
/// | [`Failed`](Self::Failed) | 1 | any other failure of the run, and stagehand's own bugs |
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
/// | `NotEnoughMemory` | [`NotEnoughMemory`](Self::NotEnoughMemory) |
/// | `Internal` | [`Failed`](Self::Failed) |
/// | `Io`, `Changed`, `Session`, a device's `Compute` | [`Io`](Self::Io), [`CheckpointChanged`](Self::CheckpointChanged), the session's kind, [`Device`](Self::Device) |
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
    /// more RAM than the machine can spare (`MemAvailable` less `ram_floor`); `None`
    /// for a size that overflows.
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
    /// The device failed: a copy, a driver call, a device allocation.
    #[error("{message}")]
    Device {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// Reading or writing `path` failed while the run worked.
    #[error("{message}")]
    Io {
        path: PathBuf,
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The owner asked the run to stop (a signal, the plan's stop flag) before it
    /// finished; every budget was released.
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
    /// Any other input the caller must change, in words.
    #[error("{0}")]
    BadInput(String),
    /// Any other failure of the run, in words.
    #[error("{0}")]
    Failed(String),
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
                | RunError::Failed(_)
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
            RunError::BadInput(message) | RunError::Failed(message) => message,
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
            | RunError::Cancelled { message } => message,
        }
    }

    /// A session that could not start or failed, by kind: a plan whose budgets are
    /// too small names the budget and the least that works. `setup`: refused before
    /// the first step (bad input unless the kind says otherwise); `vram_budget_bytes`:
    /// the session's VRAM budget.
    pub(crate) fn from_session(error: SessionError, setup: bool, vram_budget_bytes: u64) -> Self {
        let message = error.to_string();
        let budget = |budget, given: Bytes, least: Bytes, error| RunError::BudgetTooSmall {
            budget,
            given_bytes: given.0,
            least_bytes: least_at_flag(least),
            message: message.clone(),
            source: Some(Box::new(error) as Cause),
        };
        match error {
            SessionError::Plan(PlanError::VramBudgetTooSmall {
                budget: given,
                needed,
                fits_at_depth,
                ..
            })
            | SessionError::Plan(PlanError::VramBudgetTooSmallForLargeBlocks {
                budget: given,
                needed,
                fits_at_depth,
                ..
            }) => vram_refusal(error, given, needed, fits_at_depth, vram_budget_bytes),
            SessionError::Plan(PlanError::PinCeilingTooSmall {
                ceiling, needed, ..
            }) => budget(Budget::PinCeiling, ceiling, needed, error),
            SessionError::NoPlace { needed, .. } => {
                budget(Budget::Vram, Bytes(vram_budget_bytes), needed, error)
            }
            SessionError::LoraPinCeiling {
                requested_bytes,
                available_bytes,
                ceiling_bytes,
            } => budget(
                Budget::PinCeiling,
                Bytes(ceiling_bytes),
                Bytes(ceiling_bytes + requested_bytes.saturating_sub(available_bytes)),
                error,
            ),
            SessionError::Plan(PlanError::Zero { what }) => RunError::setting(what, message),
            SessionError::Interrupted => RunError::Cancelled { message },
            SessionError::ReadFailed {
                file: Some(ref path),
                file_changed,
                ..
            } => {
                let path = PathBuf::from(path);
                let source = Some(Box::new(error) as Cause);
                if file_changed {
                    RunError::CheckpointChanged {
                        path,
                        message,
                        source,
                    }
                } else {
                    RunError::Io {
                        path,
                        message,
                        source,
                    }
                }
            }
            SessionError::Device(_)
            | SessionError::CopyFailed { .. }
            | SessionError::PinFailed(_) => RunError::Device {
                message,
                source: Some(Box::new(error)),
            },
            _ if setup => RunError::BadInput(message),
            _ => RunError::Failed(message),
        }
    }
}

impl RunError {
    /// The model index's refusal of a checkpoint, by kind: all of them bad input but a
    /// file that changed after it was indexed.
    pub(crate) fn from_index(error: crate::model::IndexError) -> Self {
        use crate::model::IndexError;
        let message = error.to_string();
        let path = match &error {
            IndexError::Missing { path }
            | IndexError::Io { path, .. }
            | IndexError::EmptyDirectory { path }
            | IndexError::NotSafetensors { path, .. }
            | IndexError::Header { path, .. }
            | IndexError::Tensor { path, .. }
            | IndexError::Index { path, .. }
            | IndexError::Model { path, .. }
            | IndexError::Changed { path, .. }
            | IndexError::Pipeline { path, .. }
            | IndexError::ParentFolder { path, .. } => path.clone(),
            IndexError::NotOneModel { dir, .. } => dir.clone(),
            IndexError::BlockPattern { .. } => PathBuf::new(),
        };
        let found = match &error {
            IndexError::Pipeline { class, .. } => format!("diffusers pipeline ({class})"),
            IndexError::ParentFolder { .. } => "a folder of model folders".to_string(),
            _ => "a folder with no safetensors files".to_string(),
        };
        let kind = match &error {
            IndexError::Missing { .. } => IndexKind::Missing,
            IndexError::Io { .. } => IndexKind::Unreadable,
            IndexError::Changed { .. } => IndexKind::Changed,
            IndexError::EmptyDirectory { .. }
            | IndexError::Pipeline { .. }
            | IndexError::ParentFolder { .. } => IndexKind::Unsupported,
            IndexError::BlockPattern { .. } => IndexKind::Setting,
            IndexError::Model { .. } => IndexKind::Other,
            _ => IndexKind::Corrupt,
        };
        let source = Some(Box::new(error) as Cause);
        match kind {
            IndexKind::Missing => RunError::MissingFile {
                path,
                message,
                source,
            },
            IndexKind::Unreadable => RunError::Unreadable {
                path,
                message,
                source,
            },
            IndexKind::Changed => RunError::CheckpointChanged {
                path,
                message,
                source,
            },
            IndexKind::Unsupported => RunError::UnsupportedModel {
                path,
                found,
                message,
                source,
            },
            IndexKind::Setting => RunError::setting("block_pattern", message),
            IndexKind::Other => RunError::BadInput(message),
            IndexKind::Corrupt => RunError::CorruptCheckpoint {
                path,
                message,
                source,
            },
        }
    }
}

/// Which kind of [`RunError`] an index error is.
enum IndexKind {
    Missing,
    Unreadable,
    Changed,
    Unsupported,
    Setting,
    Other,
    Corrupt,
}
