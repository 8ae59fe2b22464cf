//! A model family's error as the run's kind (the table in [`RunError`]'s docs).

use std::path::PathBuf;

use super::error::{Cause, RunError};
use crate::families::FamilyError;

impl RunError {
    /// A family's error by kind. `setup`: it came while the model was opened, before
    /// the first step (bad input unless the kind says otherwise). The family's error
    /// stays the source where it says more than the message (a tensor's name, a key).
    pub(crate) fn from_family(error: FamilyError, setup: bool, vram_budget_bytes: u64) -> Self {
        let message = error.to_string();
        match error {
            FamilyError::Session(error) => RunError::from_session(error, setup, vram_budget_bytes),
            FamilyError::Unsupported { path, found, .. } => RunError::UnsupportedModel {
                path,
                found,
                message,
                source: None,
            },
            FamilyError::MissingTensor { ref path, .. }
            | FamilyError::TensorShape { ref path, .. } => RunError::CorruptCheckpoint {
                path: path.clone(),
                message,
                source: Some(Box::new(error)),
            },
            FamilyError::TensorDtype {
                ref path,
                ref dtype,
                ..
            } => RunError::UnsupportedModel {
                path: path.clone(),
                found: dtype.clone(),
                message,
                source: Some(Box::new(error)),
            },
            FamilyError::BadConfig {
                ref path, ref key, ..
            } => RunError::UnsupportedModel {
                path: path.clone(),
                found: key.clone().unwrap_or_else(|| "config.json".to_string()),
                message,
                source: Some(Box::new(error)),
            },
            FamilyError::MissingFile { path, .. } => RunError::MissingFile {
                path,
                message,
                source: None,
            },
            FamilyError::BadFile { path, .. } => RunError::Unreadable {
                path,
                message,
                source: None,
            },
            FamilyError::BadRequest { field, .. } => RunError::BadRequest {
                field,
                message,
                source: None,
            },
            FamilyError::Lora(error) => RunError::BadRequest {
                field: "lora".to_string(),
                message,
                source: Some(Box::new(error) as Cause),
            },
            FamilyError::NotEnoughMemory { needed_bytes, .. } => RunError::NotEnoughMemory {
                needed_bytes: Some(needed_bytes),
                spare_bytes: None,
                message,
            },
            FamilyError::Internal { .. } => RunError::Failed(message),
            FamilyError::Changed { ref path, .. } => RunError::CheckpointChanged {
                path: PathBuf::from(path),
                message,
                source: Some(Box::new(error)),
            },
            FamilyError::Io { ref path, .. } => RunError::Io {
                path: PathBuf::from(path),
                message,
                source: Some(Box::new(error)),
            },
            FamilyError::Compute(crate::compute::ComputeError::Device(_)) => RunError::Device {
                message,
                source: Some(Box::new(error)),
            },
            _ if setup => RunError::BadInput(message),
            _ => RunError::Failed(message),
        }
    }
}
