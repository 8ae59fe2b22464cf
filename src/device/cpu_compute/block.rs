//! The CPU adapter's block: a model block for the reference pass, in host memory of its
//! own or in the model file's cached pages, mapped.

use stagehand_actors::HostBuffer;

use crate::compute::{ComputeError, SharedBytes};

/// A block for the reference pass.
pub struct CpuBlock {
    memory: Memory,
}

enum Memory {
    /// Page-aligned host memory the block was copied into.
    Owned(HostBuffer),
    /// Host bytes computed from where they are (read-only).
    Shared(SharedBytes),
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
        Ok(Self {
            memory: Memory::Owned(buffer),
        })
    }

    /// A block computed from `bytes` in place, with nothing copied.
    pub(super) fn shared(bytes: SharedBytes) -> Self {
        Self {
            memory: Memory::Shared(bytes),
        }
    }

    /// The block's bytes.
    pub(super) fn bytes(&self) -> &[u8] {
        match &self.memory {
            Memory::Owned(buffer) => buffer.as_slice().unwrap_or(&[]),
            Memory::Shared(bytes) => bytes.as_slice(),
        }
    }
}
