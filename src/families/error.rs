//! Why a family could not open a model or compute a step, as kinds a caller matches on.

use std::path::{Path, PathBuf};

/// Why a family could not open a model or compute a step.
///
/// Match on the kind; each carries what a caller acts on (the tensor's name, the
/// `config.json` key, the request's field) and, in `message`, the sentence a user
/// reads, which [`Display`](std::fmt::Display) prints. New kinds may be added, so a
/// `match` needs a `_` arm.
///
/// | kind | what went wrong | who fixes it |
/// |---|---|---|
/// | [`MissingTensor`](Self::MissingTensor) | the checkpoint lacks a tensor the model needs | the checkpoint |
/// | [`TensorShape`](Self::TensorShape) | a tensor's shape is not the one its config implies | the checkpoint or its config |
/// | [`TensorDtype`](Self::TensorDtype) | a tensor's dtype is one the family does not compute with | the checkpoint |
/// | [`BadConfig`](Self::BadConfig) | a `config.json` value is missing or refused; `key` names it | the model's config |
/// | [`MissingFile`](Self::MissingFile) | a file the model needs beside its weights is absent (a tokenizer, `config.json`) | the model's folder |
/// | [`BadFile`](Self::BadFile) | a file of the model's folder cannot be read as what it is (a tokenizer, a module's config) | the model's folder |
/// | [`Unsupported`](Self::Unsupported) | a model type, layout or format no family computes | another model |
/// | [`BadRequest`](Self::BadRequest) | the request is refused (a prompt too long, an input of the wrong size, an option out of range); `field` names it | the caller |
/// | [`NotEnoughMemory`](Self::NotEnoughMemory) | a host buffer the model needs does not fit in memory | the machine |
/// | [`NoRoom`](Self::NoRoom) | a sequence's next KV pages found no room in the budget now | wait, or the budget |
/// | [`Io`](Self::Io), [`Changed`](Self::Changed) | reading a file failed; a file changed since it was indexed | the disk |
/// | [`Lora`](Self::Lora) | a LoRA adapter the request names cannot be applied | the caller |
/// | [`Session`](Self::Session), [`Compute`](Self::Compute) | the session's or the compute port's error, typed | — |
/// | [`Mismatch`](Self::Mismatch), [`Corrupt`](Self::Corrupt) | a check of the output or of the bytes failed | — |
/// | [`Internal`](Self::Internal) | stagehand broke one of its own rules: a bug to report | stagehand |
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum FamilyError {
    /// The checkpoint at `path` has no tensor `name`, which the model needs.
    #[error("{message}")]
    MissingTensor {
        path: PathBuf,
        name: String,
        message: String,
    },
    /// Tensor `name` of the checkpoint at `path` has shape `found` where the model
    /// (its config) implies `expected`.
    #[error("{message}")]
    TensorShape {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
        message: String,
    },
    /// Tensor `name` of the checkpoint at `path` is stored as `dtype` (as safetensors
    /// names it: `"I64"`, `"F8_E4M3"`), which the family does not compute with there.
    #[error("{message}")]
    TensorDtype {
        path: PathBuf,
        name: String,
        dtype: String,
        message: String,
    },
    /// A value of the model's configuration is missing or refused: `key` names it as
    /// `config.json` does (`num_attention_heads`, `rope_scaling`); `None` where the
    /// file as a whole is refused. `path` is the config (for a config inferred from
    /// the shapes of a bare checkpoint, the checkpoint; a bare `config.json` where the
    /// value is checked away from its file, as the WAN VAE's channels and T5's layers).
    #[error("{message}")]
    BadConfig {
        path: PathBuf,
        key: Option<String>,
        message: String,
    },
    /// A file the model needs beside its weights is absent: `path` is where it was
    /// looked for (a tokenizer, the Hugging Face folder of a bare checkpoint).
    #[error("{message}")]
    MissingFile { path: PathBuf, message: String },
    /// A file at `path` cannot be read as what it is: of the model's folder (a
    /// tokenizer, a sentence-transformers module's config, the checkpoint's
    /// quantization metadata) or one the caller gave (a file of text states).
    #[error("{message}")]
    BadFile { path: PathBuf, message: String },
    /// What is at `path` is a model type, layout or format no family computes (or not
    /// the one asked for): `found` says what it is (`"gpt2"`, `"block-wise FP8"`).
    #[error("{message}")]
    Unsupported {
        path: PathBuf,
        found: String,
        message: String,
    },
    /// The request is refused: `field` names what to change as a request spells it
    /// (`prompt`, `max_tokens`, `width`, `strength`, `latent`, `batch`).
    #[error("{message}")]
    BadRequest { field: String, message: String },
    /// A host buffer of `needed_bytes` the model needs does not fit in memory.
    #[error("{message}")]
    NotEnoughMemory { needed_bytes: u64, message: String },
    /// A sequence's activations (its next KV pages) found no room in the budget now:
    /// it took no step, its state is as it was, and it may fit once others leave.
    #[error("{0}")]
    NoRoom(String),
    /// Reading a file of the model failed.
    #[error("{path}: {reason}")]
    Io { path: String, reason: String },
    /// A file of the model changed on disk (rewritten, truncated) after it was indexed.
    #[error("{path}: {reason}")]
    Changed { path: String, reason: String },
    #[error("{0}")]
    Session(#[from] stagehand_actors::SessionError),
    #[error("{0}")]
    Compute(#[from] crate::compute::ComputeError),
    /// A LoRA adapter the request names cannot be applied (its file, its strength,
    /// its modules against the model's tensors).
    #[error("{0}")]
    Lora(#[from] crate::lora::LoraError),
    #[error("output mismatch at step {step}: element {index} is {got}, the fully-resident reference has {expected}")]
    Mismatch {
        step: u64,
        index: usize,
        got: f32,
        expected: f32,
    },
    #[error("{block}: bytes differ from the file at offset {offset} of the block")]
    Corrupt { block: String, offset: u64 },
    /// Stagehand broke one of its own rules (activations not allocated, a tensor not
    /// placed, a cache out of step): a bug, not the caller's input.
    #[error("{message}")]
    Internal { message: String },
}

impl FamilyError {
    /// The checkpoint at `path` lacks tensor `name`.
    pub(crate) fn missing_tensor(path: &Path, name: &str, message: String) -> Self {
        FamilyError::MissingTensor {
            path: path.to_path_buf(),
            name: name.to_string(),
            message,
        }
    }

    /// Tensor `name` has shape `found`, the model implies `expected`.
    pub(crate) fn tensor_shape(
        path: &Path,
        name: &str,
        (expected, found): (&[usize], &[usize]),
        message: String,
    ) -> Self {
        FamilyError::TensorShape {
            path: path.to_path_buf(),
            name: name.to_string(),
            expected: expected.to_vec(),
            found: found.to_vec(),
            message,
        }
    }

    /// Tensor `name` is stored as `dtype`, which the family does not take there.
    pub(crate) fn tensor_dtype(path: &Path, name: &str, dtype: &str, message: String) -> Self {
        FamilyError::TensorDtype {
            path: path.to_path_buf(),
            name: name.to_string(),
            dtype: dtype.to_string(),
            message,
        }
    }

    /// `tensor` of the checkpoint at `path` is not `dtype` `shape`: a dtype kind
    /// where its dtype differs, else a shape kind.
    pub(crate) fn tensor_not(
        path: &Path,
        tensor: &crate::model::TensorInfo,
        (dtype, shape): (&str, &[usize]),
        message: String,
    ) -> Self {
        match tensor.dtype == dtype {
            true => Self::tensor_shape(path, &tensor.name, (shape, &tensor.shape), message),
            false => Self::tensor_dtype(path, &tensor.name, &tensor.dtype, message),
        }
    }

    /// The config at `path` has `key` missing or refused (`None`: the whole file).
    pub(crate) fn config(path: &Path, key: Option<&str>, message: String) -> Self {
        FamilyError::BadConfig {
            path: path.to_path_buf(),
            key: key.map(str::to_string),
            message,
        }
    }

    /// The request's `field` is refused.
    pub(crate) fn request(field: &str, message: String) -> Self {
        FamilyError::BadRequest {
            field: field.to_string(),
            message,
        }
    }

    /// A file of the model's folder at `path` cannot be read as what it is.
    pub(crate) fn bad_file(path: &Path, message: String) -> Self {
        FamilyError::BadFile {
            path: path.to_path_buf(),
            message,
        }
    }

    /// A file the model needs is not at `path`.
    pub(crate) fn missing_file(path: &Path, message: String) -> Self {
        FamilyError::MissingFile {
            path: path.to_path_buf(),
            message,
        }
    }

    /// What is at `path` is `found`, which no family computes.
    pub(crate) fn unsupported(path: &Path, found: &str, message: String) -> Self {
        FamilyError::Unsupported {
            path: path.to_path_buf(),
            found: found.to_string(),
            message,
        }
    }

    /// A bug: one of stagehand's own rules broken.
    pub(crate) fn internal(message: String) -> Self {
        FamilyError::Internal { message }
    }
}

impl From<crate::model::BlockReadError> for FamilyError {
    fn from(error: crate::model::BlockReadError) -> Self {
        if error.interrupted {
            // A stop request, not a fault of the file: the run ends at a safe point.
            return FamilyError::Session(stagehand_actors::SessionError::Interrupted);
        }
        let path = error.path.display().to_string();
        if error.changed {
            return FamilyError::Changed {
                path,
                reason: error.reason,
            };
        }
        FamilyError::Io {
            path,
            reason: error.reason,
        }
    }
}
