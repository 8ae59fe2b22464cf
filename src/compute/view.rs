//! Views of weights in the device tier. A [`BlockView`] stands for a block the caller
//! holds; every [`Weight`] taken from it borrows that hold, so the type system keeps a
//! weight from outliving the hold on its block.

use std::marker::PhantomData;

use stagehand_actors::DevicePtr;

use super::quant::Groups;
use super::{ComputeError, DType};

/// Where one tensor sits inside its block's buffer, and what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorSlot {
    /// Byte offset of the tensor's first element in its block.
    pub offset: u64,
    pub dtype: DType,
    /// A matrix `[rows, cols]`, row-major; a vector is one row.
    pub rows: usize,
    pub cols: usize,
    /// Where an f32 scale of the weight sits in the same block (FP8 checkpoints store
    /// `weight_scale` beside the weight): the weight's values are `stored × scale`.
    pub scale: Option<u64>,
    /// Where the per-group scales and zeros of a [`DType::U4`] weight sit in the
    /// same block.
    pub groups: Option<Groups>,
}

impl TensorSlot {
    /// An unscaled tensor.
    pub fn new(offset: u64, dtype: DType, rows: usize, cols: usize) -> Self {
        Self {
            offset,
            dtype,
            rows,
            cols,
            scale: None,
            groups: None,
        }
    }

    pub fn elements(&self) -> usize {
        self.rows * self.cols
    }

    pub fn bytes(&self) -> u64 {
        self.dtype.bytes(self.elements()) as u64
    }

    /// Rows `first .. first + count` of a matrix slot; a U4 weight's group scales and
    /// zeros start `first` values on, their stride kept. A slice of a fused weight,
    /// computed or patched on its own.
    pub fn sub_rows(&self, first: usize, count: usize) -> TensorSlot {
        let groups = self.groups.map(|groups| {
            let skipped = groups.dtype.bytes(first) as u64;
            Groups {
                scale: groups.scale + skipped,
                zero: groups.zero + skipped,
                ..groups
            }
        });
        TensorSlot {
            offset: self.offset + self.dtype.bytes(first * self.cols) as u64,
            rows: count,
            groups,
            ..*self
        }
    }

    /// Elements `first .. first + count` of a vector slot (one row): a slice of a
    /// fused linear's bias.
    pub fn sub_vector(&self, first: usize, count: usize) -> TensorSlot {
        TensorSlot {
            offset: self.offset + self.dtype.bytes(first) as u64,
            cols: count,
            ..*self
        }
    }
}

/// A block's bytes in the device tier, valid for `'a`.
#[derive(Debug, Clone, Copy)]
pub struct BlockView<'a> {
    ptr: DevicePtr,
    bytes: u64,
    held: PhantomData<&'a [u8]>,
}

impl<'a> BlockView<'a> {
    /// # Safety
    /// `ptr .. ptr + bytes` must be memory of the device whose [`super::Compute`]
    /// adapter will run operations on this view's weights, and it must stay allocated
    /// and unchanged (but for [`super::Compute::merge_low_rank`] by the holder) for
    /// `'a`: a block held from a session until the hold is released, or a block the
    /// adapter loaded itself while it is borrowed.
    pub unsafe fn new(ptr: DevicePtr, bytes: u64) -> Self {
        Self {
            ptr,
            bytes,
            held: PhantomData,
        }
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The tensor at `slot`, checked to lie inside the block.
    pub fn weight(&self, slot: &TensorSlot) -> Result<Weight<'a>, ComputeError> {
        let end = slot.offset.checked_add(slot.bytes());
        if end.is_none_or(|end| end > self.bytes) {
            return Err(ComputeError::Shape(format!(
                "a {} [{}, {}] tensor at offset {} does not fit in a block of {} bytes",
                slot.dtype, slot.rows, slot.cols, slot.offset, self.bytes
            )));
        }
        let scale = match slot.scale {
            Some(offset) if offset.checked_add(4).is_some_and(|end| end <= self.bytes) => {
                Some(self.ptr.offset(offset))
            }
            Some(offset) => {
                return Err(ComputeError::Shape(format!(
                    "a weight scale at offset {offset} does not fit in a block of {} bytes",
                    self.bytes
                )))
            }
            None => None,
        };
        Ok(Weight {
            ptr: self.ptr.offset(slot.offset),
            dtype: slot.dtype,
            rows: slot.rows,
            cols: slot.cols,
            scale,
            groups: self.groups(slot)?,
            held: PhantomData,
        })
    }

    /// The slot's group scales and zeros as addresses, checked to lie inside the block.
    fn groups(&self, slot: &TensorSlot) -> Result<Option<Groups>, ComputeError> {
        let Some(groups) = slot.groups else {
            return Ok(None);
        };
        let fits = |offset: u64| {
            groups
                .extent_bytes(slot.rows, slot.cols)
                .and_then(|extent| offset.checked_add(extent))
                .is_some_and(|end| end <= self.bytes)
        };
        if !fits(groups.scale) || !fits(groups.zero) {
            return Err(ComputeError::Shape(format!(
                "the group scales of a [{}, {}] weight (groups of {}, {} a row) do not fit in a block of {} bytes",
                slot.rows, slot.cols, groups.size, groups.stride, self.bytes
            )));
        }
        Ok(Some(Groups {
            scale: self.ptr.offset(groups.scale).0,
            zero: self.ptr.offset(groups.zero).0,
            ..groups
        }))
    }
}

/// A weight matrix `[rows, cols]` in the device tier, in its storage dtype.
#[derive(Debug, Clone, Copy)]
pub struct Weight<'a> {
    ptr: DevicePtr,
    dtype: DType,
    rows: usize,
    cols: usize,
    /// Where its f32 scale is, for scaled (FP8, int8) weights.
    scale: Option<DevicePtr>,
    /// Where its group scales and zeros are (addresses), for U4 weights.
    groups: Option<Groups>,
    held: PhantomData<&'a [u8]>,
}

impl Weight<'_> {
    /// The device addresses of a U4 weight's group scales and zeros.
    pub fn groups(&self) -> Option<Groups> {
        self.groups
    }

    /// The device address of the weight's f32 scale, if it has one.
    pub fn scale(&self) -> Option<DevicePtr> {
        self.scale
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn elements(&self) -> usize {
        self.rows * self.cols
    }

    pub fn bytes(&self) -> usize {
        self.dtype.bytes(self.elements())
    }
}

/// A LoRA's factors of one weight: `a` is `[rank, in]`, `b` is `[out, rank]`.
#[derive(Debug, Clone, Copy)]
pub struct LowRank<'a> {
    a: Weight<'a>,
    b: Weight<'a>,
}

impl<'a> LowRank<'a> {
    pub fn new(a: Weight<'a>, b: Weight<'a>) -> Result<Self, ComputeError> {
        if a.rows() != b.cols() || a.rows() == 0 {
            return Err(ComputeError::Shape(format!(
                "LoRA factors disagree: A is [{}, {}], B is [{}, {}]; A must be [rank, in] and B [out, rank]",
                a.rows(),
                a.cols(),
                b.rows(),
                b.cols()
            )));
        }
        Ok(Self { a, b })
    }

    pub fn a(&self) -> &Weight<'a> {
        &self.a
    }

    pub fn b(&self) -> &Weight<'a> {
        &self.b
    }

    pub fn rank(&self) -> usize {
        self.a.rows()
    }

    pub fn in_features(&self) -> usize {
        self.a.cols()
    }

    pub fn out_features(&self) -> usize {
        self.b.rows()
    }

    /// The factors of output rows `first .. first + count` alone (`B`'s rows): a LoRA
    /// of a fused weight (Flux's qkv) applied to one of its slices.
    pub fn out_rows(&self, first: usize, count: usize) -> Result<Self, ComputeError> {
        let b = &self.b;
        if first.checked_add(count).is_none_or(|end| end > b.rows) || count == 0 {
            return Err(ComputeError::Shape(format!(
                "LoRA rows {first}..{} of a B of {} rows",
                first.saturating_add(count),
                b.rows
            )));
        }
        let offset = (first * b.cols * b.dtype.size_bytes()) as u64;
        let b = Weight {
            ptr: b.ptr.offset(offset),
            rows: count,
            ..*b
        };
        Ok(Self { a: self.a, b })
    }
}
