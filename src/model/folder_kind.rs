//! What a folder that is not one model is, so the error names what to pass instead: a
//! diffusers pipeline (`model_index.json`: its parts, each a model folder of its
//! own), or a parent of several model folders (the ones it holds).

use std::path::Path;

use super::error::{FolderPart, IndexError};

/// Sub-folders looked at, at most: a parent folder is listed, not crawled.
const MAX_LISTED_FOLDERS: usize = 1000;

/// The error for `dir` if it is a diffusers pipeline folder: its parts by sub-folder
/// and class, from `model_index.json`.
pub(crate) fn pipeline_error(dir: &Path) -> Option<IndexError> {
    let index_path = dir.join("model_index.json");
    if !index_path.is_file() {
        return None;
    }
    let index = super::folder::read_json(&index_path).ok();
    let object = index.as_ref().and_then(serde_json::Value::as_object);
    let class = object
        .and_then(|object| object.get("_class_name"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or("a diffusers pipeline")
        .to_string();
    let mut parts: Vec<FolderPart> = object
        .into_iter()
        .flatten()
        .filter(|(name, _)| !name.starts_with('_'))
        .filter_map(|(name, value)| {
            // `"transformer": ["diffusers", "FluxTransformer2DModel"]`; `[null, null]`
            // is a part the pipeline does without.
            let kind = value.as_array()?.get(1)?.as_str()?;
            let holds_weights = folder_holds_a_model(&dir.join(name));
            holds_weights.then(|| FolderPart {
                name: name.clone(),
                kind: kind.to_string(),
            })
        })
        .collect();
    parts.sort_by(|a, b| a.name.cmp(&b.name));
    Some(IndexError::Pipeline {
        path: dir.to_path_buf(),
        class,
        parts,
    })
}

/// The error for `dir`, which holds no checkpoint of its own, if it holds model
/// folders: each with what its config says it is.
pub(crate) fn parent_error(dir: &Path) -> Option<IndexError> {
    let listing = std::fs::read_dir(dir).ok()?;
    let mut models: Vec<FolderPart> = listing
        .filter_map(Result::ok)
        .take(MAX_LISTED_FOLDERS)
        .map(|entry| entry.path())
        .filter(|path| path.is_dir())
        .filter_map(|path| {
            let kind = model_kind(&path)?;
            let name = path.file_name()?.to_string_lossy().into_owned();
            Some(FolderPart { name, kind })
        })
        .collect();
    if models.is_empty() {
        return None;
    }
    models.sort_by(|a, b| a.name.cmp(&b.name));
    Some(IndexError::ParentFolder {
        path: dir.to_path_buf(),
        models,
    })
}

/// What the folder `path` holds as a model: "pipeline FluxPipeline", its config's
/// `model_type` or `_class_name`, "safetensors" for bare weights; `None` if nothing.
fn model_kind(path: &Path) -> Option<String> {
    if path.join("model_index.json").is_file() {
        let index = super::folder::read_json(&path.join("model_index.json")).ok();
        let class = index
            .as_ref()
            .and_then(|index| index.get("_class_name")?.as_str().map(str::to_string));
        return Some(
            format!("pipeline {}", class.unwrap_or_default())
                .trim_end()
                .to_string(),
        );
    }
    if !folder_holds_a_model(path) {
        return None;
    }
    let config = super::folder::read_json(&path.join("config.json")).ok();
    let named = config.as_ref().and_then(|config| {
        let field = |key: &str| config.get(key)?.as_str().map(str::to_string);
        field("model_type").or_else(|| field("_class_name"))
    });
    Some(named.unwrap_or_else(|| "safetensors".to_string()))
}

/// Whether `path` is a folder with a `config.json` or `.safetensors` files.
fn folder_holds_a_model(path: &Path) -> bool {
    if path.join("config.json").is_file() {
        return true;
    }
    let Ok(listing) = std::fs::read_dir(path) else {
        return false;
    };
    listing
        .filter_map(Result::ok)
        .take(MAX_LISTED_FOLDERS)
        .any(|entry| {
            entry
                .path()
                .extension()
                .is_some_and(|ext| ext == "safetensors")
        })
}
