//! The model index's refusal of a checkpoint as the run's kind.

use std::path::PathBuf;

use super::error::{Cause, RunError};

impl RunError {
    /// The model index's refusal of a checkpoint, by kind: all of them bad input but a
    /// file that changed after it was indexed. A checkpoint that is not one model
    /// stagehand reads (`IndexError::Model`: more shards than supported, several
    /// index files, no tensors under the part asked for) is unsupported, `found`
    /// saying what it is.
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
            IndexError::Model { problem, .. } => problem.clone(),
            _ => "a folder with no safetensors files".to_string(),
        };
        let kind = match &error {
            IndexError::Missing { .. } => IndexKind::Missing,
            IndexError::Io { .. } => IndexKind::Unreadable,
            IndexError::Changed { .. } => IndexKind::Changed,
            IndexError::EmptyDirectory { .. }
            | IndexError::Pipeline { .. }
            | IndexError::ParentFolder { .. }
            | IndexError::Model { .. } => IndexKind::Unsupported,
            IndexError::BlockPattern { .. } => IndexKind::Setting,
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
    Corrupt,
}
