//! How a model family lays the tensors it computes with out as blocks: which tensors
//! form each block, in what order, and where each lands in its block's buffer. Tensors
//! the forward pass does not use (a pooler head, `position_ids` buffers) are left out,
//! so every byte the session streams ends in a computation.

use std::collections::HashMap;

use stagehand_actors::{BlockLayout, Extent, FileId, ModelLayout};

use super::FamilyError;
use crate::compute::quant::Groups;
use crate::compute::{DType, TensorSlot};
use crate::model::ModelIndex;

/// Blocks being assembled from the index's tensors.
pub struct PlacementBuilder<'i> {
    index: &'i ModelIndex,
    /// Per block: its name and the tensors it holds.
    blocks: Vec<(String, Vec<usize>)>,
    /// (weight, its scale tensor): FP8 and int8 weights stored with a per-tensor scale.
    scales: Vec<(usize, usize)>,
    /// U4 weights (ComfyUI's `awq_w4a16`) with their group scales and zeros.
    grouped: Vec<GroupedWeight>,
}

/// A U4 weight's tensors, and what the slot needs of their shapes.
#[derive(Debug, Clone, Copy)]
struct GroupedWeight {
    weight: usize,
    scale: usize,
    zero: usize,
    /// Inputs per group.
    size: usize,
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
            grouped: Vec::new(),
        }
    }

    /// Starts a new block; the tensors added next belong to it.
    pub fn block(&mut self, name: impl Into<String>) {
        self.blocks.push((name.into(), Vec::new()));
    }

    /// Adds the tensor named `name` to the current block, checking it is a float
    /// tensor of `shape` (`[rows, cols]`, or `[n]` for a vector). Returns its index.
    pub fn add(&mut self, name: &str, shape: &[usize]) -> Result<usize, FamilyError> {
        let position = self.find(name, shape)?;
        let dtype = &self.index.tensors[position].dtype;
        if dtype == "I8" {
            return Err(self.dtype(name, "I8", format!(
                "tensor `{name}` is I8; stagehand computes I8 only as a quantized linear weight (int8_tensorwise with its weight_scale, or awq_w4a16)"
            )));
        }
        self.push(position)
    }

    fn message(&self, problem: String) -> String {
        format!("{}: {problem}", self.index.path.display())
    }

    /// Tensor `name` is missing from the checkpoint.
    fn missing(&self, name: &str, problem: String) -> FamilyError {
        FamilyError::missing_tensor(&self.index.path, name, self.message(problem))
    }

    /// Tensor `name` is `found`, not `expected` (empty: no one shape is).
    fn shape(&self, name: &str, shapes: (&[usize], &[usize]), problem: String) -> FamilyError {
        FamilyError::tensor_shape(&self.index.path, name, shapes, self.message(problem))
    }

    /// Tensor `name` is stored as `dtype`, which is not computed there.
    fn dtype(&self, name: &str, dtype: &str, problem: String) -> FamilyError {
        FamilyError::tensor_dtype(&self.index.path, name, dtype, self.message(problem))
    }

    /// The index of the tensor named `name`, checked to have `shape` and a dtype
    /// stagehand computes with.
    fn find(&self, name: &str, shape: &[usize]) -> Result<usize, FamilyError> {
        let position = self.position(name).ok_or_else(|| {
            self.missing(
                name,
                format!("tensor `{name}` is missing (expected shape {shape:?})"),
            )
        })?;
        let tensor = &self.index.tensors[position];
        if tensor.shape != shape {
            return Err(self.shape(
                name,
                (shape, &tensor.shape),
                format!(
                    "tensor `{name}` has shape {:?}, but config.json implies {shape:?}",
                    tensor.shape
                ),
            ));
        }
        if DType::from_safetensors(&tensor.dtype).is_none() {
            return Err(self.dtype(name, &tensor.dtype, format!(
                "tensor `{name}` is {}; stagehand computes with F32, F16 and BF16 weights (and FP8, int8 or awq_w4a16 quantized linear weights)",
                tensor.dtype
            )));
        }
        Ok(position)
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.index
            .tensors
            .iter()
            .position(|tensor| tensor.name == name)
    }

    /// Puts tensor `position` in the current block.
    fn push(&mut self, position: usize) -> Result<usize, FamilyError> {
        match self.blocks.last_mut() {
            Some((_, tensors)) => tensors.push(position),
            None => {
                return Err(FamilyError::internal(
                    "a tensor was placed before any block was started".into(),
                ))
            }
        }
        Ok(position)
    }

    /// As [`PlacementBuilder::add`] for a weight `<stem>.weight`: an FP8 or I8
    /// weight's per-tensor scale (`<stem>.weight_scale`, or ComfyUI's
    /// `<stem>.scale_weight`; one F32 value) travels in the same block, as do an
    /// `awq_w4a16` weight's group scales and zeros (`<stem>.weight_zeros` marks one).
    /// `scales_required`: the checkpoint scales its FP8 weights, so one without a
    /// scale is an error (an I8 weight always needs one).
    pub fn add_weight(
        &mut self,
        name: &str,
        shape: &[usize],
        scales_required: bool,
    ) -> Result<usize, FamilyError> {
        let stem = name.strip_suffix(".weight").unwrap_or(name).to_string();
        let zeros = [
            format!("{stem}.weight_zeros"),
            format!("{stem}.weight_zero"),
        ]
        .into_iter()
        .find_map(|candidate| self.position(&candidate));
        if let Some(zero) = zeros {
            return self.add_grouped(name, &stem, shape, zero);
        }
        let tensor = self.find(name, shape)?;
        let dtype = self.index.tensors[tensor].dtype.clone();
        if !dtype.starts_with("F8_") && dtype != "I8" {
            return self.push(tensor);
        }
        self.push(tensor)?;
        let scale = [
            format!("{stem}.weight_scale"),
            format!("{stem}.scale_weight"),
        ]
        .into_iter()
        .find_map(|candidate| self.position(&candidate));
        let Some(scale) = scale else {
            if scales_required || dtype == "I8" {
                return Err(self.missing(
                    &format!("{stem}.weight_scale"),
                    format!(
                        "{dtype} tensor `{name}` has no scale (`{stem}.weight_scale`){}",
                        if dtype == "I8" {
                            "; an int8 weight is stored divided by one"
                        } else {
                            ", while the checkpoint's other FP8 weights have one"
                        }
                    ),
                ));
            }
            return Ok(tensor);
        };
        let scale_info = &self.index.tensors[scale];
        let values: usize = scale_info.shape.iter().product();
        if scale_info.dtype != "F32" || values != 1 {
            let message = format!(
                "the scale `{}` of {dtype} tensor `{name}` is {} {:?}; a per-tensor scale is one F32 value (per-row int8 scales are not implemented)",
                scale_info.name, scale_info.dtype, scale_info.shape
            );
            return Err(match scale_info.dtype.as_str() {
                "F32" => self.shape(&scale_info.name, (&[1], &scale_info.shape), message),
                other => self.dtype(&scale_info.name, other, message),
            });
        }
        self.push(scale)?;
        self.scales.push((tensor, scale));
        Ok(tensor)
    }

    /// An `awq_w4a16` weight of logical `shape` `[rows, cols]`: `I8 [rows, cols / 2]`
    /// codes, `weight_scale` and `zero` of `[cols / size, rows]` in F32, F16 or BF16.
    fn add_grouped(
        &mut self,
        name: &str,
        stem: &str,
        shape: &[usize],
        zero: usize,
    ) -> Result<usize, FamilyError> {
        let &[rows, cols] = shape else {
            let problem = format!("`{name}` is group-quantized but not a matrix");
            return Err(self.shape(name, (&[], shape), problem));
        };
        if cols % 2 != 0 {
            return Err(self.shape(name, (&[], shape), format!(
                "`{name}` is awq_w4a16 with {cols} inputs; two 4-bit codes share a byte, so the inputs must be even"
            )));
        }
        let weight = self.find(name, &[rows, cols / 2])?;
        let weight_dtype = &self.index.tensors[weight].dtype;
        if weight_dtype != "I8" {
            return Err(self.dtype(name, weight_dtype, format!(
                "`{name}` has group zeros (awq_w4a16) but is {weight_dtype}; its packed codes are I8"
            )));
        }
        let scale_name = format!("{stem}.weight_scale");
        let scale = self.position(&scale_name).ok_or_else(|| {
            let problem = format!("awq_w4a16 weight `{name}` has no `{scale_name}`");
            self.missing(&scale_name, problem)
        })?;
        let (scale_info, zero_info) = (&self.index.tensors[scale], &self.index.tensors[zero]);
        let groups = match scale_info.shape[..] {
            [groups, out] if out == rows && groups > 0 && cols % groups == 0 => groups,
            _ => {
                return Err(self.shape(&scale_name, (&[], &scale_info.shape), format!(
                    "`{scale_name}` has shape {:?}; an awq_w4a16 scale of a [{rows}, {cols}] weight is [inputs / group size, {rows}]",
                    scale_info.shape
                )))
            }
        };
        let float = matches!(scale_info.dtype.as_str(), "F32" | "F16" | "BF16");
        if !float || zero_info.shape != scale_info.shape || zero_info.dtype != scale_info.dtype {
            let message = format!(
                "`{scale_name}` is {} {:?} and `{}` is {} {:?}; they must be one float dtype (F32, F16 or BF16) and one shape",
                scale_info.dtype, scale_info.shape, zero_info.name, zero_info.dtype, zero_info.shape
            );
            return Err(match (float, zero_info.shape == scale_info.shape) {
                (false, _) => self.dtype(&scale_name, &scale_info.dtype, message),
                (true, false) => {
                    let shapes = (&scale_info.shape[..], &zero_info.shape[..]);
                    self.shape(&zero_info.name, shapes, message)
                }
                (true, true) => self.dtype(&zero_info.name, &zero_info.dtype, message),
            });
        }
        self.push(weight)?;
        self.push(scale)?;
        self.push(zero)?;
        self.grouped.push(GroupedWeight {
            weight,
            scale,
            zero,
            size: cols / groups,
        });
        Ok(weight)
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
                            groups: None,
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
        for grouped in self.grouped {
            let scale = slots.get(&grouped.scale).map(|(_, slot)| *slot);
            let zero = slots.get(&grouped.zero).map(|(_, slot)| slot.offset);
            if let (Some((_, slot)), Some(scale), Some(zero)) =
                (slots.get_mut(&grouped.weight), scale, zero)
            {
                slot.dtype = DType::U4;
                slot.cols *= 2;
                slot.groups = Some(Groups {
                    scale: scale.offset,
                    zero,
                    dtype: scale.dtype,
                    size: grouped.size,
                    stride: slot.rows,
                });
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
