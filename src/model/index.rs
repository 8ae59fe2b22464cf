//! The model index: every tensor of a checkpoint, where its bytes are, and which block
//! it belongs to. Built from headers only; no tensor data is read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use stagehand_actors::{BlockLayout, Extent, FileId, ModelLayout};

use super::blocks::{self, BlockMatcher};
use super::error::IndexError;
use super::header::{self, ShardHeader};
use super::part::CheckpointPart;
use super::source;

/// Most shard files one model may have (the largest public checkpoints have a few hundred).
const MAX_SHARD_FILES: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ShardFile {
    pub path: PathBuf,
    /// Size of the whole file.
    pub bytes: u64,
    /// Bytes before the data section: the 8-byte length field plus the JSON header.
    pub header_bytes: u64,
    /// The file as its header was read; a run refuses the file once it differs.
    #[serde(skip)]
    pub stamp: Option<super::FileStamp>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorInfo {
    pub name: String,
    /// The safetensors dtype name: "F32", "BF16", ...
    pub dtype: String,
    pub shape: Vec<usize>,
    /// Index into [`ModelIndex::files`].
    pub file: usize,
    /// Absolute offset of the tensor's first byte in its file.
    pub offset: u64,
    pub bytes: u64,
    /// Index into [`ModelIndex::blocks`].
    pub block: usize,
    /// Where this tensor's bytes start in its block's buffer (the block's extents laid
    /// end to end).
    pub block_offset: u64,
    /// The expert number of a mixture-of-experts tensor (`experts.N.`).
    pub expert: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockInfo {
    /// `head`, `tail`, or the name prefix up to the layer number (`model.layers.3`).
    pub name: String,
    /// The layer number, for numbered blocks.
    pub index: Option<u64>,
    pub bytes: u64,
    /// Indices into [`ModelIndex::tensors`], in buffer order.
    pub tensors: Vec<usize>,
    /// The block's bytes on disk, in buffer order; adjacent tensors share one extent.
    pub extents: Vec<Extent>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelIndex {
    /// What the user pointed at.
    pub path: PathBuf,
    pub files: Vec<ShardFile>,
    /// In file order: by file, then offset.
    pub tensors: Vec<TensorInfo>,
    /// In forward order: head, numbered blocks, tail.
    pub blocks: Vec<BlockInfo>,
    /// The first file's `__metadata__`.
    pub metadata: BTreeMap<String, String>,
}

impl ModelIndex {
    /// Indexes a `.safetensors` file, a folder of shards, or a `*.safetensors.index.json`.
    /// `block_pattern` overrides the built-in layer prefixes; its first capture group is
    /// the block key.
    pub fn open(path: &Path, block_pattern: Option<&str>) -> Result<ModelIndex, IndexError> {
        Self::open_selected(path, block_pattern, None)
    }

    /// Indexes one model of a checkpoint that holds others too or names it otherwise
    /// ([`CheckpointPart`]): only its tensors, under the names its family reads, at
    /// their places in the files.
    pub fn open_part(
        path: &Path,
        block_pattern: Option<&str>,
        part: &CheckpointPart,
    ) -> Result<ModelIndex, IndexError> {
        Self::open_selected(path, block_pattern, Some(part))
    }

    fn open_selected(
        path: &Path,
        block_pattern: Option<&str>,
        part: Option<&CheckpointPart>,
    ) -> Result<ModelIndex, IndexError> {
        let matcher = BlockMatcher::new(block_pattern)?;
        let sources = source::resolve(path)?;
        if sources.shards.len() > MAX_SHARD_FILES {
            return Err(IndexError::Model {
                path: path.to_path_buf(),
                problem: format!(
                    "{} shard files is more than the {MAX_SHARD_FILES} supported",
                    sources.shards.len()
                ),
            });
        }
        let mut headers = sources
            .shards
            .iter()
            .map(|shard| header::read_shard(shard))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some((index_path, expected)) = &sources.index {
            check_against_index(index_path, expected, &headers)?;
        }
        if let Some(part) = part {
            for header in &mut headers {
                if let Some((tensor, problem)) = part.unknown_tensor(&header.tensors) {
                    return Err(IndexError::Tensor {
                        path: path.to_path_buf(),
                        tensor,
                        problem,
                    });
                }
                header.tensors = part.select(std::mem::take(&mut header.tensors));
                // A whole file's checksum says nothing of a part of it.
                header.metadata.remove(super::DATA_CHECKSUM_KEY);
            }
            if headers.iter().all(|header| header.tensors.is_empty()) {
                return Err(IndexError::Model {
                    path: path.to_path_buf(),
                    problem: format!(
                        "holds no tensor under `{}`; is this the checkpoint that holds that model?",
                        part.prefix
                    ),
                });
            }
        }
        build(path, headers, &matcher)
    }

    /// Indexes a one-file checkpoint from an image of the whole file in memory, with
    /// the same checks as [`ModelIndex::open`]; `path` only names it in errors. (The
    /// header fuzz target's entry point.)
    pub fn from_image(
        path: &Path,
        image: &[u8],
        block_pattern: Option<&str>,
    ) -> Result<ModelIndex, IndexError> {
        let matcher = BlockMatcher::new(block_pattern)?;
        let header = header::parse_shard(path, image, image.len() as u64)?;
        build(path, vec![header], &matcher)
    }

    /// What the actors need: blocks and extents, with `FileId(i)` = `files[i]`.
    pub fn layout(&self) -> ModelLayout {
        ModelLayout {
            blocks: self
                .blocks
                .iter()
                .map(|block| BlockLayout::new(block.name.clone(), block.extents.clone()))
                .collect(),
        }
    }

    /// Fails if any file is no longer what was indexed (rewritten, truncated or
    /// replaced since): checked before a run opens them, so a change made while the
    /// model was being checked is caught then, not steps later.
    pub fn check_unchanged(&self) -> Result<(), IndexError> {
        for file in &self.files {
            let Some(stamp) = file.stamp else {
                continue;
            };
            let now = std::fs::metadata(&file.path)
                .map(|metadata| super::FileStamp::of(&metadata))
                .map_err(|error| IndexError::io(&file.path, &error))?;
            if let Some(difference) = stamp.difference(&now) {
                return Err(IndexError::Changed {
                    path: file.path.clone(),
                    difference,
                });
            }
        }
        Ok(())
    }

    pub fn total_bytes(&self) -> u64 {
        self.blocks.iter().map(|block| block.bytes).sum()
    }

    /// The largest block (the first of equals); `None` for a model with no blocks.
    pub fn largest_block(&self) -> Option<&BlockInfo> {
        self.blocks.iter().rev().max_by_key(|block| block.bytes)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|tensor| tensor.name == name)
    }

    pub fn block_named(&self, name: &str) -> Option<&BlockInfo> {
        self.blocks.iter().find(|block| block.name == name)
    }
}

/// Every tensor the index places in a shard must be there.
fn check_against_index(
    index_path: &Path,
    expected: &BTreeMap<String, usize>,
    headers: &[ShardHeader],
) -> Result<(), IndexError> {
    let present: HashSet<(usize, &str)> = headers
        .iter()
        .enumerate()
        .flat_map(|(shard, header)| {
            header
                .tensors
                .iter()
                .map(move |tensor| (shard, tensor.name.as_str()))
        })
        .collect();
    for (tensor, &shard) in expected {
        let Some(header) = headers.get(shard) else {
            continue;
        };
        if !present.contains(&(shard, tensor.as_str())) {
            return Err(IndexError::Index {
                path: index_path.to_path_buf(),
                problem: format!(
                    "places tensor `{}` in {}, which has no such tensor",
                    tensor.escape_debug(),
                    header.path.display()
                ),
            });
        }
    }
    Ok(())
}

fn build(
    path: &Path,
    headers: Vec<ShardHeader>,
    matcher: &BlockMatcher,
) -> Result<ModelIndex, IndexError> {
    let count = check_names_unique(path, &headers)?;
    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(count);
    for (file, header) in headers.iter().enumerate() {
        for tensor in &header.tensors {
            tensors.push(TensorInfo {
                name: tensor.name.clone(),
                dtype: tensor.dtype.clone(),
                shape: tensor.shape.clone(),
                file,
                offset: tensor.offset,
                bytes: tensor.bytes,
                block: 0,
                block_offset: 0,
                expert: matcher.expert(&tensor.name),
            });
        }
    }
    let names: Vec<&str> = tensors.iter().map(|tensor| tensor.name.as_str()).collect();
    let grouping = blocks::group(matcher, &names);
    let mut blocks: Vec<BlockInfo> = grouping
        .blocks
        .into_iter()
        .map(|(name, index)| BlockInfo {
            name,
            index,
            bytes: 0,
            tensors: Vec::new(),
            extents: Vec::new(),
        })
        .collect();

    place_in_blocks(&mut tensors, &grouping.block_of_tensor, &mut blocks);

    let metadata = headers
        .first()
        .map(|header| header.metadata.clone())
        .unwrap_or_default();
    let files = headers
        .into_iter()
        .map(|header| ShardFile {
            path: header.path,
            bytes: header.file_bytes,
            header_bytes: header.header_bytes,
            stamp: header.stamp,
        })
        .collect();
    Ok(ModelIndex {
        path: path.to_path_buf(),
        files,
        tensors,
        blocks,
        metadata,
    })
}

/// Each tensor name once across the shards; returns how many tensors there are.
fn check_names_unique(path: &Path, headers: &[ShardHeader]) -> Result<usize, IndexError> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (file, header) in headers.iter().enumerate() {
        for tensor in &header.tensors {
            if let Some(&other) = seen.get(tensor.name.as_str()) {
                // A folder's files, listed rather than named by an index: one of them
                // is not the model's (a stray file beside it).
                if path.is_dir() {
                    return Err(IndexError::NotOneModel {
                        dir: path.to_path_buf(),
                        tensor: tensor.name.clone(),
                        first: headers[other].path.clone(),
                        second: header.path.clone(),
                    });
                }
                return Err(IndexError::Tensor {
                    path: header.path.clone(),
                    tensor: tensor.name.clone(),
                    problem: format!("also in {}", headers[other].path.display()),
                });
            }
            seen.insert(tensor.name.as_str(), file);
        }
    }
    if seen.is_empty() {
        return Err(IndexError::Model {
            path: path.to_path_buf(),
            problem: "the checkpoint holds no tensors".to_string(),
        });
    }
    Ok(seen.len())
}

/// Puts each tensor in its block, in buffer order, and gives each block its extents.
fn place_in_blocks(
    tensors: &mut [TensorInfo],
    block_of_tensor: &[usize],
    blocks: &mut [BlockInfo],
) {
    // Tensors are already in (file, offset) order, so each block's list comes out in
    // buffer order and adjacent tensors can be merged into one extent as they arrive.
    for (position, tensor) in tensors.iter_mut().enumerate() {
        let block_position = block_of_tensor[position];
        let block = &mut blocks[block_position];
        tensor.block = block_position;
        tensor.block_offset = block.bytes;
        block.bytes += tensor.bytes;
        block.tensors.push(position);
        if tensor.bytes == 0 {
            continue;
        }
        let file_id = FileId(u32::try_from(tensor.file).unwrap_or(u32::MAX));
        match block.extents.last_mut() {
            Some(last) if last.file == file_id && last.offset + last.length == tensor.offset => {
                last.length += tensor.bytes;
            }
            _ => block.extents.push(Extent {
                file: file_id,
                offset: tensor.offset,
                length: tensor.bytes,
            }),
        }
    }
}
