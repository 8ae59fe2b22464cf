//! Bookkeeping for a growable cast buffer, kept apart from the driver calls so it is
//! tested without a GPU.
//!
//! A cast buffer is one virtual address range reserved once (`cuMemAddressReserve`)
//! with physical memory mapped into it in equal chunks, always as a prefix
//! `[0, mapped_chunks)`. Growing maps new chunks after the last one; shrinking unmaps
//! from the top down. Chunks already mapped are never touched by a grow, so a pointer
//! into the buffer stays valid and nothing is ever copied or fragmented.

use std::ops::Range;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChunkPlanError {
    #[error("the driver reported an allocation granularity of 0 bytes")]
    ZeroGranularity,
    #[error(
        "the reservation ({reservation_bytes} bytes) is smaller than one chunk \
         ({chunk_bytes} bytes): raise the cast buffer's maximum size"
    )]
    ReservationBelowOneChunk {
        reservation_bytes: u64,
        chunk_bytes: u64,
    },
    #[error(
        "asked for {requested_bytes} bytes but the cast buffer reserved only \
         {reservation_bytes}: raise the cast buffer's maximum size"
    )]
    ExceedsReservation {
        requested_bytes: u64,
        reservation_bytes: u64,
    },
    /// A mapping was recorded out of prefix order: a bug in the caller, reported
    /// instead of corrupting the bookkeeping.
    #[error("chunk {got} recorded out of order (expected {expected})")]
    OutOfOrder { expected: usize, got: usize },
}

/// Which chunks to map or unmap to reach a requested size. At most one range is
/// non-empty. Map in ascending order; unmap in descending order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkChange {
    pub map: Range<usize>,
    pub unmap: Range<usize>,
}

impl ChunkChange {
    fn nothing(at: usize) -> Self {
        Self {
            map: at..at,
            unmap: at..at,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty() && self.unmap.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan {
    chunk_bytes: u64,
    max_chunks: usize,
    mapped_chunks: usize,
}

impl ChunkPlan {
    /// `chunk_bytes_hint` is rounded up to a multiple of the driver's granularity (and to
    /// at least one granule); the reservation is rounded down to whole chunks.
    pub fn new(
        granularity_bytes: u64,
        chunk_bytes_hint: u64,
        reservation_bytes: u64,
    ) -> Result<Self, ChunkPlanError> {
        if granularity_bytes == 0 {
            return Err(ChunkPlanError::ZeroGranularity);
        }
        let granules = chunk_bytes_hint.div_ceil(granularity_bytes).max(1);
        let chunk_bytes = granules.saturating_mul(granularity_bytes);
        let max_chunks = reservation_bytes / chunk_bytes;
        if max_chunks == 0 {
            return Err(ChunkPlanError::ReservationBelowOneChunk {
                reservation_bytes,
                chunk_bytes,
            });
        }
        Ok(Self {
            chunk_bytes,
            max_chunks: usize::try_from(max_chunks).unwrap_or(usize::MAX),
            mapped_chunks: 0,
        })
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    pub fn max_chunks(&self) -> usize {
        self.max_chunks
    }

    pub fn mapped_chunks(&self) -> usize {
        self.mapped_chunks
    }

    /// Bytes of address space to reserve: whole chunks only.
    pub fn reservation_bytes(&self) -> u64 {
        self.max_chunks as u64 * self.chunk_bytes
    }

    /// Physical bytes currently mapped (what counts against the VRAM budget).
    pub fn mapped_bytes(&self) -> u64 {
        self.mapped_chunks as u64 * self.chunk_bytes
    }

    /// Offset of chunk `index` from the start of the reservation.
    pub fn chunk_offset(&self, index: usize) -> u64 {
        index as u64 * self.chunk_bytes
    }

    /// Chunks needed to hold `bytes`, or an error when the reservation cannot.
    pub fn chunks_needed(&self, bytes: u64) -> Result<usize, ChunkPlanError> {
        let chunks = bytes.div_ceil(self.chunk_bytes);
        if chunks > self.max_chunks as u64 {
            return Err(ChunkPlanError::ExceedsReservation {
                requested_bytes: bytes,
                reservation_bytes: self.reservation_bytes(),
            });
        }
        Ok(chunks as usize)
    }

    /// Chunks to map so that at least `requested_bytes` are usable. Never unmaps.
    pub fn plan_grow(&self, requested_bytes: u64) -> Result<ChunkChange, ChunkPlanError> {
        let needed = self.chunks_needed(requested_bytes)?;
        if needed <= self.mapped_chunks {
            return Ok(ChunkChange::nothing(self.mapped_chunks));
        }
        Ok(ChunkChange {
            map: self.mapped_chunks..needed,
            unmap: self.mapped_chunks..self.mapped_chunks,
        })
    }

    /// Chunks to unmap so that no more than the chunks holding `keep_bytes` stay
    /// mapped. Never maps; keeping more than is mapped is nothing to do.
    pub fn plan_shrink(&self, keep_bytes: u64) -> ChunkChange {
        let keep = keep_bytes.div_ceil(self.chunk_bytes);
        if keep >= self.mapped_chunks as u64 {
            return ChunkChange::nothing(self.mapped_chunks);
        }
        let keep = keep as usize;
        ChunkChange {
            map: self.mapped_chunks..self.mapped_chunks,
            unmap: keep..self.mapped_chunks,
        }
    }

    /// Records that chunk `index` is now mapped. Must be the next chunk of the prefix.
    pub fn record_mapped(&mut self, index: usize) -> Result<(), ChunkPlanError> {
        if index != self.mapped_chunks || index >= self.max_chunks {
            return Err(ChunkPlanError::OutOfOrder {
                expected: self.mapped_chunks,
                got: index,
            });
        }
        self.mapped_chunks += 1;
        Ok(())
    }

    /// Records that chunk `index` is now unmapped. Must be the last mapped chunk.
    pub fn record_unmapped(&mut self, index: usize) -> Result<(), ChunkPlanError> {
        if self.mapped_chunks == 0 || index != self.mapped_chunks - 1 {
            return Err(ChunkPlanError::OutOfOrder {
                expected: self.mapped_chunks.wrapping_sub(1),
                got: index,
            });
        }
        self.mapped_chunks -= 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
