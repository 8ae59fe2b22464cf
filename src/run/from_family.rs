//! A model family's error as the run's kind (the table in [`RunError`]'s docs).

use std::path::PathBuf;

use super::error::{Cause, RunError};
use crate::compute::ComputeError;
use crate::families::FamilyError;

impl RunError {
    /// A family's error by kind, whether it came while the model was opened or while
    /// it ran. The family's error stays the source where it says more than the
    /// message (a tensor's name, a key). `vram_budget_bytes`: the session's VRAM
    /// budget, for a session's refusal.
    pub(crate) fn from_family(error: FamilyError, vram_budget_bytes: u64) -> Self {
        let message = error.to_string();
        match error {
            FamilyError::Session(error) => RunError::from_session(error, vram_budget_bytes),
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
            FamilyError::NoRoom(_) => RunError::NoRoom {
                message,
                source: Some(Box::new(error)),
            },
            FamilyError::Compute(ComputeError::OutOfMemory(_)) => RunError::NotEnoughMemory {
                needed_bytes: None,
                spare_bytes: None,
                message,
            },
            // The bytes a block landed with are not the file's, though the file has
            // not changed (that is `Changed`): the copy to the device spoiled them.
            FamilyError::Corrupt { .. } => RunError::Device {
                message,
                source: Some(Box::new(error)),
            },
            // Shapes stagehand's parts disagree on (a malformed model is refused by
            // shape when it is opened), a streamed result that is not the resident
            // reference's, a rule of its own broken: bugs to report.
            FamilyError::Internal { .. }
            | FamilyError::Mismatch { .. }
            | FamilyError::Compute(ComputeError::Shape(_)) => RunError::Internal {
                message,
                source: Some(Box::new(error)),
            },
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
            FamilyError::Compute(ComputeError::Device(_)) => RunError::Device {
                message,
                source: Some(Box::new(error)),
            },
        }
    }
}
