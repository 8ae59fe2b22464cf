//! Weights to f32 just before use (DESIGN §6): the compute stream's cast buffer, handed
//! out in regions per operation.
//!
//! Weights cross every link in their storage dtype. An operation asks for each weight
//! as f32: an unscaled f32 weight aligned for vector loads is used where it lies;
//! anything else (f16, bf16, fp8 and its scale, or f32 the file left unaligned) is
//! widened by a kernel into a region of
//! the [`CastBuffer`], which grows (in mapped chunks, never moving) to the most one
//! operation needs and stays there. Regions are reused from the start by the next
//! operation: it queues behind this one on the same stream, so its casts cannot
//! overwrite what this one's kernels still read.

use std::sync::Arc;

use stagehand_actors::DevicePtr;

use super::cast_buffer::CastBuffer;
use super::error::CudaError;
use super::kernels::Kernels;
use super::memory::Footprint;
use crate::compute::{DType, Weight};

/// Regions start on this boundary, and an f32 weight is read in place only when it
/// lies on one: cuBLAS picks its kernels by alignment, and a weight read in place in a
/// session slot and in a block loaded for the reference must get the same kernel
/// (both are 256-byte aligned allocations holding the tensor at the same offset).
pub const REGION_ALIGN_BYTES: u64 = 16;

pub struct CastArena {
    buffer: CastBuffer,
    /// Bytes handed out to the current operation.
    cursor: u64,
    footprint: Arc<Footprint>,
}

/// Whether a weight can be read where it lies: unscaled f32 on a region boundary.
pub fn readable_in_place(weight: &Weight<'_>) -> bool {
    weight.dtype() == DType::F32
        && weight.scale().is_none()
        && weight.ptr().0 % REGION_ALIGN_BYTES == 0
}

/// Bytes of `count` f32 rounded up to the region boundary.
fn region_bytes(count: u64) -> Option<u64> {
    count
        .checked_mul(4)?
        .checked_next_multiple_of(REGION_ALIGN_BYTES)
}

impl CastArena {
    pub fn new(buffer: CastBuffer, footprint: Arc<Footprint>) -> Self {
        Self {
            buffer,
            cursor: 0,
            footprint,
        }
    }

    /// Starts an operation: every region handed out before is free again.
    pub fn begin(&mut self) {
        self.cursor = 0;
    }

    /// Physical VRAM the cast buffer holds now.
    pub fn mapped_bytes(&self) -> u64 {
        self.buffer.mapped_bytes()
    }

    /// Room for `count` f32 for the current operation.
    pub fn region(&mut self, count: u64) -> Result<DevicePtr, CudaError> {
        let bytes = region_bytes(count).ok_or_else(|| {
            CudaError::InvalidArgument(format!("{count} values do not fit a cast buffer"))
        })?;
        let start = self.cursor;
        let end = start.checked_add(bytes).ok_or_else(|| {
            CudaError::InvalidArgument(format!("{count} values do not fit a cast buffer"))
        })?;
        let before = self.buffer.mapped_bytes();
        let grown = self.buffer.grow_to(end);
        // Chunks mapped before a failure stay mapped and count, whatever happened.
        self.footprint
            .add(self.buffer.mapped_bytes().saturating_sub(before));
        grown?;
        self.cursor = end;
        Ok(self.buffer.base().offset(start))
    }

    /// `weight` as f32 on the device: where it lies when [`readable_in_place`], else
    /// widened into a region of this operation (queued on the compute stream).
    pub fn f32_of(
        &mut self,
        kernels: &Kernels,
        weight: &Weight<'_>,
    ) -> Result<DevicePtr, CudaError> {
        if readable_in_place(weight) {
            return Ok(weight.ptr());
        }
        let count = weight.elements() as u64;
        let region = self.region(count)?;
        // SAFETY: the weight lies in a block the caller holds for the view's lifetime,
        // which outlasts this operation's queueing, and the holder releases it only
        // after a fence behind this operation; the region was just mapped for `count`
        // f32 and nothing else uses it until the next operation, which the stream runs
        // after this one.
        unsafe { kernels.widen(weight.ptr(), weight.dtype(), weight.scale(), region, count) }?;
        Ok(region)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_aligned_f32_is_read_in_place() {
        // Proves half-precision weights and f32 off a 16-byte boundary are cast, and
        // regions keep the boundary.
        let place = |dtype: DType, offset: u64, scale: Option<u64>| {
            // SAFETY: only the view's addresses are inspected, never read.
            let view = unsafe { crate::compute::BlockView::new(DevicePtr(0x1000), 4096) };
            let slot = crate::compute::TensorSlot {
                scale,
                ..crate::compute::TensorSlot::new(offset, dtype, 4, 4)
            };
            readable_in_place(&view.weight(&slot).unwrap())
        };
        assert!(place(DType::F32, 0, None));
        assert!(!place(DType::F32, 4, None));
        assert!(!place(DType::F32, 0, Some(2048)), "a scaled weight is cast");
        assert!(!place(DType::F16, 0, None));
        assert!(!place(DType::Bf16, 0, None));
        assert!(!place(DType::F8E4M3, 0, None));
        assert_eq!(region_bytes(1), Some(16));
        assert_eq!(region_bytes(4), Some(16));
        assert_eq!(region_bytes(5), Some(32));
        assert_eq!(region_bytes(u64::MAX / 2), None);
    }
}
