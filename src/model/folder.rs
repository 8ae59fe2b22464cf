//! Hugging Face model folders: `config.json` (which architecture), the weights
//! (`model.safetensors`, or shards with a `*.safetensors.index.json`), `tokenizer.json`,
//! and for sentence-transformers folders `modules.json` (which the encoder family
//! reads: `families/bert/sentence.rs`).
//!
//! A path is a folder's model when it is the folder, or a `.safetensors` file or index
//! inside a folder that has a `config.json`. A checkpoint with no `config.json` beside
//! it is a bare checkpoint: its bytes can be streamed and checked, not computed on.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Largest `config.json`/`modules.json` we read (real ones are a few KiB).
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// A model folder that was found and read.
#[derive(Debug, Clone)]
pub struct ModelFolder {
    pub dir: PathBuf,
    /// `config.json`, parsed.
    pub config: Value,
    /// What to index: the given file, or the folder's index/weights.
    pub checkpoint: PathBuf,
    /// `tokenizer.json`, if the folder has one.
    pub tokenizer: Option<PathBuf>,
}

/// What was wrong with a folder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct FolderError {
    pub path: PathBuf,
    pub problem: String,
}

fn error(path: &Path, problem: impl Into<String>) -> FolderError {
    FolderError {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

impl ModelFolder {
    /// The folder `path` is or lies in, when it has a `config.json`; `Ok(None)` for a
    /// bare checkpoint.
    pub fn find(path: &Path) -> Result<Option<Self>, FolderError> {
        let (dir, given) = if path.is_dir() {
            (path.to_path_buf(), None)
        } else {
            let dir = path
                .parent()
                .map(Path::to_path_buf)
                .filter(|dir| !dir.as_os_str().is_empty())
                .unwrap_or_else(|| PathBuf::from("."));
            (dir, Some(path.to_path_buf()))
        };
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Ok(None);
        }
        let config = read_json(&config_path)?;
        if !config.is_object() {
            return Err(error(
                &config_path,
                "is not a JSON object; is this a Hugging Face config.json?",
            ));
        }
        let checkpoint = match given {
            Some(file) => file,
            None => weights_in(&dir)?,
        };
        let tokenizer = Some(dir.join("tokenizer.json")).filter(|path| path.is_file());
        Ok(Some(Self {
            dir,
            config,
            checkpoint,
            tokenizer,
        }))
    }

    /// `model_type` from `config.json`.
    pub fn model_type(&self) -> Option<String> {
        let kind = self.config.get("model_type")?.as_str()?;
        Some(kind.to_string())
    }

    /// The first of `config.json` `architectures` (`BertModel`), which old configs
    /// carry instead of a `model_type`.
    pub fn architecture(&self) -> Option<String> {
        let first = self.config.get("architectures")?.as_array()?.first()?;
        Some(first.as_str()?.to_string())
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.json")
    }
}

/// A small JSON file (a config), read and parsed; the error names the file.
pub fn read_json(path: &Path) -> Result<Value, FolderError> {
    let length = std::fs::metadata(path)
        .map_err(|failure| error(path, failure.to_string()))?
        .len();
    if length > MAX_CONFIG_BYTES {
        return Err(error(
            path,
            format!("{length} bytes is too large for a JSON config"),
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|failure| error(path, failure.to_string()))?;
    serde_json::from_str(&text).map_err(|failure| {
        error(
            path,
            format!("is not valid JSON ({failure}); fix or replace the file"),
        )
    })
}

/// The weights of a folder: a sharded index if there is one, else `model.safetensors`,
/// else the folder itself (its `.safetensors` files as shards).
fn weights_in(dir: &Path) -> Result<PathBuf, FolderError> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        return Ok(index);
    }
    let single = dir.join("model.safetensors");
    if single.is_file() {
        return Ok(single);
    }
    let entries = std::fs::read_dir(dir).map_err(|failure| error(dir, failure.to_string()))?;
    let mut indexes: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.ends_with(".safetensors.index.json"))
        })
        .collect();
    indexes.sort();
    Ok(indexes
        .into_iter()
        .next()
        .unwrap_or_else(|| dir.to_path_buf()))
}
