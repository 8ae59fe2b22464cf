//! Why a model could not be indexed. Every variant names the file it is about, so the
//! one line the user sees says which file is wrong and what is wrong with it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("{}: no such file or directory", path.display())]
    Missing { path: PathBuf },

    #[error("{}: cannot read: {reason}", path.display())]
    Io { path: PathBuf, reason: String },

    #[error("{}: directory holds no .safetensors files and no *.safetensors.index.json; point at a checkpoint file, its folder, or its index", path.display())]
    EmptyDirectory { path: PathBuf },

    #[error("{}: not a safetensors file: {reason}", path.display())]
    NotSafetensors { path: PathBuf, reason: String },

    /// The header parsed as JSON but describes an impossible file.
    #[error("{}: bad safetensors header: {problem}", path.display())]
    Header { path: PathBuf, problem: String },

    #[error("{}: tensor `{}`: {problem}", path.display(), tensor.escape_debug())]
    Tensor {
        path: PathBuf,
        tensor: String,
        problem: String,
    },

    /// A Hugging Face `*.safetensors.index.json` that cannot be followed.
    #[error("{}: {problem}", path.display())]
    Index { path: PathBuf, problem: String },

    #[error("{}: {problem}", path.display())]
    Model { path: PathBuf, problem: String },

    /// The file is no longer the one that was indexed.
    #[error("{}: the file changed while it was in use ({difference}); run again once nothing writes to it", path.display())]
    Changed { path: PathBuf, difference: String },

    #[error("block pattern `{pattern}`: {problem}")]
    BlockPattern { pattern: String, problem: String },
}

impl IndexError {
    pub(crate) fn io(path: impl Into<PathBuf>, error: &std::io::Error) -> Self {
        let path = path.into();
        if error.kind() == std::io::ErrorKind::NotFound {
            return IndexError::Missing { path };
        }
        IndexError::Io {
            path,
            reason: error.to_string(),
        }
    }
}
