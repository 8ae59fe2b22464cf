//! The CPU adapter's block: a model block loaded for the reference pass, in host memory
//! of its own.

use stagehand_actors::HostBuffer;

use crate::compute::ComputeError;

/// A block loaded for the reference pass: page-aligned host memory.
pub struct CpuBlock {
    pub(super) buffer: HostBuffer,
}

impl CpuBlock {
    /// A block of `length` bytes written by `fill`. Backed by huge pages where the
    /// kernel has them: a reference block is written once, at once, in whole, and
    /// faulting it in 4 KiB at a time cost more than copying its bytes.
    pub(super) fn filled<E: From<ComputeError>>(
        length: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<(), E>,
    ) -> Result<Self, E> {
        let huge_pages = crate::os::advise_huge_pages;
        let mut buffer = HostBuffer::allocate_advised(length, huge_pages).map_err(|error| {
            ComputeError::OutOfMemory(format!("loading a block for the reference: {error}"))
        })?;
        if let Some(block) = buffer.as_mut_slice() {
            fill(block)?;
        }
        Ok(Self { buffer })
    }
}
