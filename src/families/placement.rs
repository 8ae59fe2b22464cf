//! How a model family lays the tensors it computes with out as blocks: which tensors
//! form each block, in what order, and where each lands in its block's buffer. Tensors
//! the forward pass does not use (a pooler head, `position_ids` buffers) are left out,
//! so every byte the session streams ends in a computation.

use std::collections::HashMap;

use stagehand_actors::{BlockLayout, Extent, FileId, ModelLayout};

use super::FamilyError;
use crate::compute::{DType, TensorSlot};
use crate::model::ModelIndex;

/// Blocks being assembled from the index's tensors.
pub struct PlacementBuilder<'i> {
    index: &'i ModelIndex,
    /// Per block: its name and the tensors it holds.
    blocks: Vec<(String, Vec<usize>)>,
    /// (weight, its scale tensor): FP8 weights stored with a per-tensor scale.
    scales: Vec<(usize, usize)>,
}

/// The finished layout, and where each placed tensor of the index is.
#[derive(Debug, Clone)]
pub struct Placement {
    pub layout: ModelLayout,
    /// Tensor index → (block, slot).
    slots: HashMap<usize, (usize, TensorSlot)>,
}

impl<'i> PlacementBuilder<'i> {
    pub fn new(index: &'i ModelIndex) -> Self {
        Self {
            index,
            blocks: Vec::new(),
            scales: Vec::new(),
        }
    }

    /// Starts a new block; the tensors added next belong to it.
    pub fn block(&mut self, name: impl Into<String>) {
        self.blocks.push((name.into(), Vec::new()));
    }

    /// Adds the tensor named `name` to the current block, checking it is a float
    /// tensor of `shape` (`[rows, cols]`, or `[n]` for a vector). Returns its index.
    pub fn add(&mut self, name: &str, shape: &[usize]) -> Result<usize, FamilyError> {
        let position = self
            .index
            .tensors
            .iter()
            .position(|tensor| tensor.name == name)
            .ok_or_else(|| {
                FamilyError::Model(format!(
                    "{}: tensor `{name}` is missing (expected shape {shape:?})",
                    self.index.path.display()
                ))
            })?;
        let tensor = &self.index.tensors[position];
        if tensor.shape != shape {
            return Err(FamilyError::Model(format!(
                "{}: tensor `{name}` has shape {:?}, but config.json implies {shape:?}",
                self.index.path.display(),
                tensor.shape
            )));
        }
        if DType::from_safetensors(&tensor.dtype).is_none() {
            return Err(FamilyError::Model(format!(
                "{}: tensor `{name}` is {}; stagehand computes with F32, F16 and BF16 weights",
                self.index.path.display(),
                tensor.dtype
            )));
        }
        match self.blocks.last_mut() {
            Some((_, tensors)) => tensors.push(position),
            None => {
                return Err(FamilyError::Model(
                    "a tensor was placed before any block was started".into(),
                ))
            }
        }
        Ok(position)
    }

    /// As [`PlacementBuilder::add`] for a weight `<stem>.weight`: an FP8 weight's
    /// per-tensor scale (`<stem>.weight_scale`, or ComfyUI's `<stem>.scale_weight`; one
    /// F32 value) travels in the same block. `scales_required`: the checkpoint scales
    /// its FP8 weights, so one without a scale is an error.
    pub fn add_weight(
        &mut self,
        name: &str,
        shape: &[usize],
        scales_required: bool,
    ) -> Result<usize, FamilyError> {
        let tensor = self.add(name, shape)?;
        let info = &self.index.tensors[tensor];
        if !info.dtype.starts_with("F8_") {
            return Ok(tensor);
        }
        let stem = name.strip_suffix(".weight").unwrap_or(name);
        let scale = [
            format!("{stem}.weight_scale"),
            format!("{stem}.scale_weight"),
        ]
        .into_iter()
        .find_map(|candidate| {
            self.index
                .tensors
                .iter()
                .position(|tensor| tensor.name == candidate)
        });
        let Some(scale) = scale else {
            if scales_required {
                return Err(FamilyError::Model(format!(
                    "{}: FP8 tensor `{name}` has no scale (`{stem}.weight_scale`), while the checkpoint's other FP8 weights have one",
                    self.index.path.display()
                )));
            }
            return Ok(tensor);
        };
        let scale_info = &self.index.tensors[scale];
        let values: usize = scale_info.shape.iter().product();
        if scale_info.dtype != "F32" || values != 1 {
            return Err(FamilyError::Model(format!(
                "{}: the scale `{}` of FP8 tensor `{name}` is {} {:?}; a per-tensor scale is one F32 value",
                self.index.path.display(),
                scale_info.name,
                scale_info.dtype,
                scale_info.shape
            )));
        }
        if let Some((_, tensors)) = self.blocks.last_mut() {
            tensors.push(scale);
        }
        self.scales.push((tensor, scale));
        Ok(tensor)
    }

    /// Lays each block's tensors out in file order (so neighbours in the file share
    /// one read) and records every tensor's slot.
    pub fn finish(self) -> Placement {
        let mut slots = HashMap::new();
        let mut blocks = Vec::with_capacity(self.blocks.len());
        for (block_number, (name, mut tensors)) in self.blocks.into_iter().enumerate() {
            tensors.sort_by_key(|&tensor| {
                let info = &self.index.tensors[tensor];
                (info.file, info.offset)
            });
            let mut extents: Vec<Extent> = Vec::new();
            let mut offset = 0u64;
            for tensor in tensors {
                let info = &self.index.tensors[tensor];
                let (rows, cols) = match info.shape[..] {
                    [rows, cols] => (rows, cols),
                    [cols] => (1, cols),
                    _ => (1, info.shape.iter().product()),
                };
                let dtype = DType::from_safetensors(&info.dtype).unwrap_or(DType::F32);
                // Scales are f32 scalars read by their weights' casts.
                slots.insert(
                    tensor,
                    (
                        block_number,
                        TensorSlot {
                            offset,
                            dtype,
                            rows,
                            cols,
                            scale: None,
                        },
                    ),
                );
                offset += info.bytes;
                let file = FileId(u32::try_from(info.file).unwrap_or(u32::MAX));
                match extents.last_mut() {
                    Some(last) if last.file == file && last.offset + last.length == info.offset => {
                        last.length += info.bytes;
                    }
                    _ if info.bytes > 0 => extents.push(Extent {
                        file,
                        offset: info.offset,
                        length: info.bytes,
                    }),
                    _ => {}
                }
            }
            blocks.push(BlockLayout::new(name, extents));
        }
        for (weight, scale) in self.scales {
            let offset = slots.get(&scale).map(|(_, slot)| slot.offset);
            if let Some((_, slot)) = slots.get_mut(&weight) {
                slot.scale = offset;
            }
        }
        Placement {
            layout: ModelLayout { blocks },
            slots,
        }
    }
}

impl Placement {
    /// The block and slot of tensor `tensor` of the index, if it was placed.
    pub fn slot_of(&self, tensor: usize) -> Option<(usize, TensorSlot)> {
        self.slots.get(&tensor).copied()
    }
}
