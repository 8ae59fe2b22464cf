//! Reading one safetensors file's header without touching its tensor data.
//!
//! The `safetensors` crate is the authority on what a valid file is, but its errors
//! do not say which tensor is wrong or how ("invalid shape, data type, or offset").
//! So a first pass over the raw JSON diagnoses the common faults with a precise
//! message, and only then does the crate's `Metadata` parse the header for real.
//!
//! The header is read with `pread` into a buffer of its own, never through a mapping:
//! a file another process truncates meanwhile is a short read (an error naming the
//! file), not a SIGBUS.

use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use safetensors::tensor::Metadata;
use safetensors::Dtype;
use serde::Deserialize;

use super::error::IndexError;

/// The largest header the `safetensors` crate accepts (100 MB, decimal).
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Size of the little-endian header-length field that starts every file.
const LENGTH_FIELD_BYTES: u64 = 8;

/// One tensor as its header describes it, with its offset made absolute.
#[derive(Debug, Clone)]
pub(crate) struct HeaderTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub offset: u64,
    pub bytes: u64,
}

/// What one file's header says.
#[derive(Debug)]
pub(crate) struct ShardHeader {
    pub path: PathBuf,
    pub file_bytes: u64,
    /// The file as it was read (`None` for an image in memory).
    pub stamp: Option<super::FileStamp>,
    /// Bytes before the data section: the length field plus the JSON header.
    pub header_bytes: u64,
    /// Sorted by offset.
    pub tensors: Vec<HeaderTensor>,
    pub metadata: BTreeMap<String, String>,
}

/// The fields of one header entry, read loosely so a bad entry gets a precise message.
#[derive(Deserialize)]
struct RawEntry {
    dtype: String,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

/// Where a shard's bytes come from: a file (read with `pread`), or a buffer holding a
/// whole file's image (the fuzz targets).
pub(crate) trait ShardSource {
    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> std::io::Result<()>;
}

impl ShardSource for std::fs::File {
    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> std::io::Result<()> {
        FileExt::read_exact_at(self, bytes, offset)
    }
}

impl ShardSource for [u8] {
    fn read_exact_at(&self, bytes: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let source = start
            .checked_add(bytes.len())
            .and_then(|end| self.get(start..end))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        bytes.copy_from_slice(source);
        Ok(())
    }
}

pub(crate) fn read_shard(path: &Path) -> Result<ShardHeader, IndexError> {
    let (file, file_meta) =
        crate::os::open_regular(path).map_err(|error| IndexError::NotSafetensors {
            path: path.to_path_buf(),
            reason: error.to_string(),
        })?;
    let mut header = parse_shard(path, &file, file_meta.len())?;
    header.stamp = Some(super::FileStamp::of(&file_meta));
    Ok(header)
}

/// Reads and checks the header of a shard of `file_bytes` bytes at `path` (named in
/// errors) from `source`.
pub(crate) fn parse_shard<S: ShardSource + ?Sized>(
    path: &Path,
    file: &S,
    file_bytes: u64,
) -> Result<ShardHeader, IndexError> {
    let not_safetensors = |reason: String| IndexError::NotSafetensors {
        path: path.to_path_buf(),
        reason,
    };
    if file_bytes < LENGTH_FIELD_BYTES {
        return Err(not_safetensors(format!(
            "the file is {file_bytes} bytes, too short to hold the 8-byte header length"
        )));
    }
    let truncated = |error: std::io::Error| IndexError::Header {
        path: path.to_path_buf(),
        problem: format!(
            "the header could not be read whole ({error}): the file shrank while it was \
             read, or it is truncated"
        ),
    };
    let mut length_field = [0u8; LENGTH_FIELD_BYTES as usize];
    file.read_exact_at(&mut length_field, 0)
        .map_err(truncated)?;
    let json_bytes = u64::from_le_bytes(length_field);
    if json_bytes > MAX_HEADER_BYTES {
        return Err(not_safetensors(format!(
            "the header length field says {json_bytes} bytes, over the {MAX_HEADER_BYTES}-byte \
             (100 MB) limit; the file is corrupt or of another format"
        )));
    }
    let bytes_after_length = file_bytes - LENGTH_FIELD_BYTES;
    if json_bytes > bytes_after_length {
        return Err(IndexError::Header {
            path: path.to_path_buf(),
            problem: format!(
                "the header length field says {json_bytes} bytes but only {bytes_after_length} \
                 follow it: truncated header (an incomplete download?)"
            ),
        });
    }
    // At most 100 MB (checked above), and only as much as the file really holds.
    let mut json = vec![0u8; json_bytes as usize];
    file.read_exact_at(&mut json, LENGTH_FIELD_BYTES)
        .map_err(truncated)?;
    let header_bytes = LENGTH_FIELD_BYTES + json_bytes;
    let data_bytes = file_bytes - header_bytes;

    let (mut tensors, metadata) = diagnose(path, &json, data_bytes)?;

    // The crate re-validates everything; after `diagnose` it should agree, and if it
    // does not its message still names the file. (`diagnose` has checked that the
    // tensors cover the data section exactly, which the crate checks only against a
    // buffer of the whole file.)
    let parsed: Metadata = std::str::from_utf8(&json)
        .map_err(|error| error.to_string())
        .and_then(|text| serde_json::from_str(text).map_err(|error| error.to_string()))
        .map_err(|error| IndexError::Header {
            path: path.to_path_buf(),
            problem: format!("rejected by the safetensors parser: {error}"),
        })?;
    let parsed_tensors = parsed.tensors();
    if parsed_tensors.len() != tensors.len() {
        return Err(IndexError::Header {
            path: path.to_path_buf(),
            problem: format!(
                "{} tensor entries, but the safetensors parser found {} (duplicate names?)",
                tensors.len(),
                parsed_tensors.len()
            ),
        });
    }
    for tensor in &mut tensors {
        let Some(info) = parsed_tensors.get(&tensor.name) else {
            return Err(IndexError::Tensor {
                path: path.to_path_buf(),
                tensor: tensor.name.clone(),
                problem: "missing from the safetensors parser's view".to_string(),
            });
        };
        tensor.dtype = info.dtype.to_string();
        tensor.shape = info.shape.clone();
        tensor.offset = header_bytes + info.data_offsets.0 as u64;
    }
    Ok(ShardHeader {
        path: path.to_path_buf(),
        file_bytes,
        stamp: None,
        header_bytes,
        tensors,
        metadata,
    })
}

/// First pass over the raw header JSON: finds the faults users actually hit and says
/// exactly what is wrong. Returns the tensors sorted by offset (offsets still relative).
fn diagnose(
    path: &Path,
    json: &[u8],
    data_bytes: u64,
) -> Result<(Vec<HeaderTensor>, BTreeMap<String, String>), IndexError> {
    let entries = header_entries(path, json)?;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(entries.len());
    for (name, value) in entries {
        if name == "__metadata__" {
            metadata = serde_json::from_value(value).map_err(|_| IndexError::Header {
                path: path.to_path_buf(),
                problem: "`__metadata__` must map strings to strings".to_string(),
            })?;
            continue;
        }
        tensors.push(diagnose_tensor(path, name, value, data_bytes)?);
    }
    tensors.sort_by(|left, right| {
        (left.offset, left.bytes, &left.name).cmp(&(right.offset, right.bytes, &right.name))
    });
    check_coverage(path, &tensors, data_bytes)?;
    Ok((tensors, metadata))
}

/// The header's entries, when it is a JSON object at all.
fn header_entries(
    path: &Path,
    json: &[u8],
) -> Result<serde_json::Map<String, serde_json::Value>, IndexError> {
    // A byte string, not a byte literal: tests/structure.rs counts braces, and a
    // brace in quotes of its own would open a block there.
    if !json.trim_ascii_start().starts_with(b"{") {
        return Err(IndexError::NotSafetensors {
            path: path.to_path_buf(),
            reason: "the header is not a JSON object".to_string(),
        });
    }
    serde_json::from_slice(json).map_err(|error| IndexError::NotSafetensors {
        path: path.to_path_buf(),
        reason: format!("the header is not valid JSON ({error})"),
    })
}

/// One tensor's entry: a known dtype, offsets inside the data section that hold
/// exactly what dtype × shape needs, and a shape this machine can index.
fn diagnose_tensor(
    path: &Path,
    name: String,
    value: serde_json::Value,
    data_bytes: u64,
) -> Result<HeaderTensor, IndexError> {
    let tensor_problem = |problem: String| IndexError::Tensor {
        path: path.to_path_buf(),
        tensor: name.clone(),
        problem,
    };
    let entry: RawEntry = serde_json::from_value(value).map_err(|error| {
        tensor_problem(format!(
            "bad entry ({error}); expected dtype, shape and data_offsets"
        ))
    })?;
    let dtype: Dtype = serde_json::from_value(serde_json::Value::String(entry.dtype.clone()))
        .map_err(|_| tensor_problem(format!("unknown dtype `{}`", entry.dtype.escape_debug())))?;
    let (start, end) = entry.data_offsets;
    if end < start {
        return Err(tensor_problem(format!(
            "data_offsets [{start}, {end}] end before they start"
        )));
    }
    if end > data_bytes {
        return Err(tensor_problem(format!(
            "data_offsets [{start}, {end}] run past the end of the data section \
             ({data_bytes} bytes): offset out of range or truncated file"
        )));
    }
    let needed_bytes = tensor_bytes(dtype, &entry.shape).ok_or_else(|| {
        tensor_problem(format!(
            "dtype {dtype} x shape {:?} is not a whole number of bytes or overflows",
            entry.shape
        ))
    })?;
    if needed_bytes != end - start {
        return Err(tensor_problem(format!(
            "data_offsets [{start}, {end}] hold {} bytes but dtype {dtype} x shape {:?} \
             needs {needed_bytes}",
            end - start,
            entry.shape
        )));
    }
    let shape = entry
        .shape
        .iter()
        .map(|&dim| usize::try_from(dim))
        .collect::<Result<Vec<usize>, _>>()
        .map_err(|_| tensor_problem("a dimension does not fit this machine".to_string()))?;
    Ok(HeaderTensor {
        name,
        dtype: dtype.to_string(),
        shape,
        offset: start,
        bytes: end - start,
    })
}

/// Tensors must tile the data section exactly: no overlap, no gap, nothing left over.
fn check_coverage(
    path: &Path,
    tensors: &[HeaderTensor],
    data_bytes: u64,
) -> Result<(), IndexError> {
    let mut covered_to = 0u64;
    let mut previous: Option<&HeaderTensor> = None;
    for tensor in tensors {
        if tensor.offset < covered_to {
            let other = previous.map_or("?", |tensor| tensor.name.as_str());
            return Err(IndexError::Header {
                path: path.to_path_buf(),
                problem: format!(
                    "tensors `{}` and `{}` overlap (data bytes {}..{})",
                    other.escape_debug(),
                    tensor.name.escape_debug(),
                    tensor.offset,
                    covered_to
                ),
            });
        }
        if tensor.offset > covered_to {
            return Err(IndexError::Header {
                path: path.to_path_buf(),
                problem: format!(
                    "data bytes {covered_to}..{} belong to no tensor (gap before `{}`)",
                    tensor.offset,
                    tensor.name.escape_debug()
                ),
            });
        }
        covered_to = tensor.offset + tensor.bytes;
        previous = Some(tensor);
    }
    if covered_to != data_bytes {
        return Err(IndexError::Header {
            path: path.to_path_buf(),
            problem: format!(
                "the data section is {data_bytes} bytes but the tensors cover {covered_to}: \
                 trailing bytes after the last tensor"
            ),
        });
    }
    Ok(())
}

/// Bytes of a tensor of `dtype` and `shape`; `None` on overflow or a partial byte.
pub(crate) fn tensor_bytes(dtype: Dtype, shape: &[u64]) -> Option<u64> {
    let elements = shape
        .iter()
        .try_fold(1u64, |count, &dim| count.checked_mul(dim))?;
    let bits = elements.checked_mul(dtype.bitsize() as u64)?;
    (bits % 8 == 0).then_some(bits / 8)
}
