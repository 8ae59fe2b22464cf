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

    /// A diffusers pipeline folder (`model_index.json`) where one model was expected:
    /// its parts are the models.
    #[error("{}", pipeline_message(path, class, parts))]
    Pipeline {
        path: PathBuf,
        /// `model_index.json`'s `_class_name` ("FluxPipeline").
        class: String,
        /// Its sub-folders that hold a model, with their classes.
        parts: Vec<FolderPart>,
    },

    /// A folder with no checkpoint of its own that holds model folders.
    #[error("{}", parent_message(path, models))]
    ParentFolder {
        path: PathBuf,
        models: Vec<FolderPart>,
    },

    /// Two `.safetensors` files of one folder, read as the shards of one model, hold
    /// the same tensor: one of them is not part of the model.
    #[error("{}: tensor `{}` is in both {} and {}: a folder's .safetensors files are read as the shards of one model, and these two are not; move the file that is not the model's out of the folder, or pass the model's own file (e.g. {})", dir.display(), tensor.escape_debug(), first.display(), second.display(), first.display())]
    NotOneModel {
        dir: PathBuf,
        tensor: String,
        first: PathBuf,
        second: PathBuf,
    },
}

/// A model folder inside another folder: its name and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FolderPart {
    /// The sub-folder's name ("transformer").
    pub name: String,
    /// Its class or model type ("FluxTransformer2DModel", "bert").
    pub kind: String,
}

/// "transformer/ (FluxTransformer2DModel), vae/ (AutoencoderKL)".
fn listed(parts: &[FolderPart]) -> String {
    parts
        .iter()
        .map(|part| format!("{}/ ({})", part.name, part.kind))
        .collect::<Vec<_>>()
        .join(", ")
}

fn pipeline_message(path: &std::path::Path, class: &str, parts: &[FolderPart]) -> String {
    let example = ["transformer", "unet"]
        .iter()
        .find(|name| parts.iter().any(|part| part.name == **name))
        .copied()
        .or_else(|| parts.first().map(|part| part.name.as_str()));
    let pass = match example {
        Some(name) => format!(
            "pass one part's folder to use that model alone (e.g. {}), or the whole folder to `stagehand image`",
            path.join(name).display()
        ),
        None => "its model_index.json names no part folder that holds weights; give the whole folder to `stagehand image` once its parts are downloaded".to_string(),
    };
    format!(
        "{}: a diffusers pipeline ({class}), not one model; its parts: {}; {pass}",
        path.display(),
        if parts.is_empty() {
            "none found".to_string()
        } else {
            listed(parts)
        },
    )
}

fn parent_message(path: &std::path::Path, models: &[FolderPart]) -> String {
    let example = models.first().map_or_else(String::new, |model| {
        format!(", e.g. {}", path.join(&model.name).display())
    });
    let count = if models.len() == 1 {
        "one model folder".to_string()
    } else {
        format!("{} model folders", models.len())
    };
    format!(
        "{}: holds no model of its own but {count}: {}; pass one of them{example}",
        path.display(),
        listed(models)
    )
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
