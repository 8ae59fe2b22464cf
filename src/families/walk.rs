//! Placing a family's tensors with one walk over its structure: the walk names each
//! block and each tensor with its shape, once to lay them out as blocks and once to
//! give each its slot, so the layout and the family's slots cannot disagree on a
//! name. A tensor's slot is the matrix `[shape[0], rest]` (a convolution's `[out,
//! in, kh, kw]` is `[out, in·kh·kw]`), a vector's `[1, n]`; FP8 and int8 weights
//! bring their per-tensor scale into the same block.

use super::placement::{Placement, PlacementBuilder};
use super::FamilyError;
use crate::compute::{DType, TensorSlot};
use crate::model::ModelIndex;

/// What a walk asks at each tensor and block.
pub trait Tensors {
    /// Starts a block: the tensors named next belong to it.
    fn block(&mut self, name: &str);
    /// The tensor `name`, checked to have `shape`.
    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<TensorSlot, FamilyError>;
}

/// The first pass: every tensor into the current block.
struct Placing<'i>(PlacementBuilder<'i>);

impl Tensors for Placing<'_> {
    fn block(&mut self, name: &str) {
        self.0.block(name);
    }

    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<TensorSlot, FamilyError> {
        self.0.add_weight(name, shape, false)?;
        Ok(TensorSlot::new(0, DType::F32, 0, 0))
    }
}

/// The second pass: each tensor's slot.
struct Placed<'p> {
    index: &'p ModelIndex,
    placement: &'p Placement,
}

impl Tensors for Placed<'_> {
    fn block(&mut self, _name: &str) {}

    fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<TensorSlot, FamilyError> {
        let position = (self.index.tensors.iter()).position(|tensor| tensor.name == name);
        let slot = position.and_then(|position| self.placement.slot_of(position));
        let Some((_, slot)) = slot else {
            return Err(FamilyError::internal(format!(
                "tensor `{name}` was not placed"
            )));
        };
        let rows = if shape.len() > 1 { shape[0] } else { 1 };
        Ok(TensorSlot {
            rows,
            cols: shape.iter().product::<usize>() / rows.max(1),
            ..slot
        })
    }
}

/// Lays out the tensors `walk` names as blocks, then walks again for their slots.
pub fn place<T>(
    index: &ModelIndex,
    walk: impl Fn(&mut dyn Tensors) -> Result<T, FamilyError>,
) -> Result<(Placement, T), FamilyError> {
    let mut placing = Placing(PlacementBuilder::new(index));
    walk(&mut placing)?;
    let placement = placing.0.finish();
    let slots = walk(&mut Placed {
        index,
        placement: &placement,
    })?;
    Ok((placement, slots))
}
