//! An embedding table kept in host memory in its storage dtype: a step needs only its
//! tokens' rows, so only those rows (widened to f32) go to the device, as activations.

use crate::compute::DType;
use crate::model::{BlockReader, ModelIndex};

use super::FamilyError;

pub struct HostTable {
    /// The table's bytes; empty for a table described from the header only.
    bytes: Vec<u8>,
    dtype: DType,
    rows: usize,
    cols: usize,
}

impl HostTable {
    /// The table at tensor `tensor` from the header alone: its shape and size, no
    /// bytes (its rows gather as zeros), for describing a model that will not run.
    pub fn described(index: &ModelIndex, tensor: usize) -> Result<Self, FamilyError> {
        let info = &index.tensors[tensor];
        let dtype = DType::float_from_safetensors(&info.dtype).ok_or_else(|| {
            FamilyError::tensor_dtype(
                &index.path,
                &info.name,
                &info.dtype,
                format!("{}: {} is not a float table", info.name, info.dtype),
            )
        })?;
        Ok(Self {
            bytes: Vec::new(),
            dtype,
            rows: info.shape.first().copied().unwrap_or(0),
            cols: info.shape.get(1).copied().unwrap_or(1),
        })
    }

    /// Reads tensor `tensor` of the index (a `[rows, cols]` float table) once.
    pub fn read(index: &ModelIndex, tensor: usize) -> Result<Self, FamilyError> {
        let info = &index.tensors[tensor];
        let dtype = DType::float_from_safetensors(&info.dtype).ok_or_else(|| {
            FamilyError::tensor_dtype(
                &index.path,
                &info.name,
                &info.dtype,
                format!("{}: {} is not a float table", info.name, info.dtype),
            )
        })?;
        let reader = BlockReader::open(index)?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(info.bytes as usize)
            .map_err(|_| FamilyError::NotEnoughMemory {
                needed_bytes: info.bytes,
                message: format!(
                    "{}: {} bytes do not fit in host memory",
                    info.name, info.bytes
                ),
            })?;
        bytes.resize(info.bytes as usize, 0);
        let extent = stagehand_actors::Extent {
            file: stagehand_actors::FileId(info.file as u32),
            offset: info.offset,
            length: info.bytes,
        };
        reader.read_once(&[extent], &mut bytes)?;
        Ok(Self {
            bytes,
            dtype,
            rows: info.shape.first().copied().unwrap_or(0),
            cols: info.shape.get(1).copied().unwrap_or(1),
        })
    }

    /// Bytes the table takes in host memory (a described one: what it would take).
    pub fn bytes(&self) -> u64 {
        (self.rows * self.cols * self.dtype.size_bytes()) as u64
    }

    /// The rows of `ids`, widened to f32, into `out`.
    pub fn gather(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), FamilyError> {
        let row_bytes = self.cols * self.dtype.size_bytes();
        let rows = self.rows;
        out.clear();
        out.resize(ids.len() * self.cols, 0.0);
        for (&id, row) in ids.iter().zip(out.chunks_exact_mut(self.cols)) {
            let id = id as usize;
            if self.bytes.is_empty() && id < rows {
                continue; // described from the header: zeros
            }
            if id >= rows || (id + 1) * row_bytes > self.bytes.len() {
                return Err(FamilyError::request(
                    "token_ids",
                    format!("token id {id} is outside the vocabulary of {rows}"),
                ));
            }
            self.dtype
                .widen(&self.bytes[id * row_bytes..(id + 1) * row_bytes], row);
        }
        Ok(())
    }
}
