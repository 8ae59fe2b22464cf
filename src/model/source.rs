//! Turning what the user pointed at (a file, a folder, an index) into the list of
//! shard files to read, in a stable order.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::error::IndexError;

/// Index files larger than this are not a real Hugging Face index.
const MAX_INDEX_JSON_BYTES: u64 = 100_000_000;

/// The shard files of a checkpoint and, when an index named them, which tensors the
/// index expects in each.
#[derive(Debug)]
pub(crate) struct Sources {
    pub shards: Vec<PathBuf>,
    /// `Some` when the checkpoint came from a `*.safetensors.index.json`: its path and
    /// tensor name → index into `shards`.
    pub index: Option<(PathBuf, BTreeMap<String, usize>)>,
}

#[derive(Deserialize)]
struct IndexJson {
    weight_map: BTreeMap<String, String>,
}

pub(crate) fn resolve(path: &Path) -> Result<Sources, IndexError> {
    let meta = std::fs::metadata(path).map_err(|error| IndexError::io(path, &error))?;
    if meta.is_dir() {
        return resolve_directory(path);
    }
    if is_index_name(path) || path.extension().is_some_and(|ext| ext == "json") {
        return resolve_index(path);
    }
    Ok(Sources {
        shards: vec![path.to_path_buf()],
        index: None,
    })
}

fn is_index_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|name| name.to_str())
        .is_some_and(|name| name.ends_with(".safetensors.index.json"))
}

/// A folder: its index if it has exactly one, else every `*.safetensors` in it.
fn resolve_directory(dir: &Path) -> Result<Sources, IndexError> {
    if let Some(pipeline) = super::folder_kind::pipeline_error(dir) {
        return Err(pipeline);
    }
    let listing = std::fs::read_dir(dir).map_err(|error| IndexError::io(dir, &error))?;
    let mut indexes = Vec::new();
    let mut shards = Vec::new();
    for entry in listing {
        let entry = entry.map_err(|error| IndexError::io(dir, &error))?;
        let path = entry.path();
        // Follows symlinks: the Hugging Face cache links snapshot files to blobs.
        if !path.is_file() {
            continue;
        }
        if is_index_name(&path) {
            indexes.push(path);
        } else if path.extension().is_some_and(|ext| ext == "safetensors") {
            shards.push(path);
        }
    }
    indexes.sort();
    shards.sort();
    if indexes.is_empty() {
        shards = without_strays(dir, shards);
    }
    match indexes.as_slice() {
        [index] => resolve_index(index),
        [] if shards.is_empty() => Err(super::folder_kind::parent_error(dir).unwrap_or(
            IndexError::EmptyDirectory {
                path: dir.to_path_buf(),
            },
        )),
        [] => Ok(Sources {
            shards,
            index: None,
        }),
        several => Err(IndexError::Model {
            path: dir.to_path_buf(),
            problem: format!(
                "holds {} index files ({}); pass the one you mean",
                several.len(),
                several
                    .iter()
                    .filter_map(|path| path.file_name())
                    .map(|name| name.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }),
    }
}

/// The names Hugging Face libraries save a one-file model under (transformers',
/// diffusers').
const SINGLE_WEIGHTS_NAMES: &[&str] = &["model.safetensors", "diffusion_pytorch_model.safetensors"];

/// A folder's shards: where one of them is the model's own one-file weights (under a
/// name [`SINGLE_WEIGHTS_NAMES`] lists), that file alone — the others beside it are
/// not the model's (a latent, an adapter, an earlier download), named in a warning
/// rather than read as more of the model.
fn without_strays(dir: &Path, shards: Vec<PathBuf>) -> Vec<PathBuf> {
    let is_weights = |path: &PathBuf| {
        path.file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| SINGLE_WEIGHTS_NAMES.contains(&name))
    };
    let Some(weights) = shards.iter().find(|path| is_weights(path)).cloned() else {
        return shards;
    };
    let strays: Vec<String> = shards
        .iter()
        .filter(|path| **path != weights)
        .filter_map(|path| path.file_name())
        .map(|name| name.to_string_lossy().into_owned())
        .collect();
    if !strays.is_empty() {
        tracing::warn!(
            "{}: left out {} beside the model's weights {}: not part of the model (move it out of the folder to silence this)",
            dir.display(),
            strays.join(", "),
            weights.file_name().map(|name| name.to_string_lossy()).unwrap_or_default()
        );
    }
    vec![weights]
}

fn resolve_index(index_path: &Path) -> Result<Sources, IndexError> {
    let problem = |problem: String| IndexError::Index {
        path: index_path.to_path_buf(),
        problem,
    };
    let bytes = crate::os::read_regular(index_path, MAX_INDEX_JSON_BYTES)
        .map_err(|error| problem(error.to_string()))?;
    let parsed = parse_index(index_path, &bytes)?;
    let dir = index_path.parent().unwrap_or(Path::new("."));
    let mut shards = Vec::with_capacity(parsed.shard_names.len());
    for name in &parsed.shard_names {
        let shard = dir.join(name);
        if !shard.is_file() {
            return Err(problem(format!(
                "names shard `{}`, which does not exist in {}",
                name.escape_debug(),
                dir.display()
            )));
        }
        shards.push(shard);
    }
    Ok(Sources {
        shards,
        index: Some((index_path.to_path_buf(), parsed.expected)),
    })
}

/// What a `*.safetensors.index.json` says, checked but not yet looked up on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedIndex {
    /// Shard file names, sorted, each a plain file name next to the index.
    pub shard_names: Vec<String>,
    /// Tensor name → position in `shard_names`.
    pub expected: BTreeMap<String, usize>,
}

/// Parses and checks an index's JSON (`index_path` only names it in errors). The
/// sharded-index fuzz target's entry point.
pub fn parse_index(index_path: &Path, bytes: &[u8]) -> Result<ParsedIndex, IndexError> {
    let problem = |problem: String| IndexError::Index {
        path: index_path.to_path_buf(),
        problem,
    };
    let index: IndexJson = serde_json::from_slice(bytes).map_err(|error| {
        problem(format!(
            "not a safetensors index ({error}); expected an object with a `weight_map`"
        ))
    })?;
    if index.weight_map.is_empty() {
        return Err(problem("`weight_map` is empty".to_string()));
    }
    let mut shard_names: Vec<&String> = index.weight_map.values().collect();
    shard_names.sort();
    shard_names.dedup();
    for name in &shard_names {
        let relative = Path::new(name.as_str());
        let stays_inside = !name.is_empty()
            && relative
                .components()
                .all(|component| matches!(component, Component::Normal(_)));
        if !stays_inside {
            return Err(problem(format!(
                "names shard `{}`, which is outside the index's directory; shard names \
                 must be plain file names next to the index",
                name.escape_debug()
            )));
        }
    }
    let mut expected = BTreeMap::new();
    for (tensor, shard_name) in &index.weight_map {
        // `shard_names` is sorted and holds every value of the map, so this finds it.
        if let Ok(position) = shard_names.binary_search(&shard_name) {
            expected.insert(tensor.clone(), position);
        }
    }
    Ok(ParsedIndex {
        shard_names: shard_names.into_iter().cloned().collect(),
        expected,
    })
}
