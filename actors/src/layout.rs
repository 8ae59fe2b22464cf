//! What the actors know of a model: blocks, their sizes, and where their bytes live.
//!
//! The actors never see paths or tensor names. A [`FileId`] is an index the
//! [`Storage`](crate::Storage) adapter maps to a real file; a block's bytes are its
//! extents laid end to end, which is exactly how the block sits in its device slot.

use serde::Serialize;

/// Index of a block in [`ModelLayout::blocks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct BlockId(pub u32);

impl BlockId {
    /// The id as an index into per-block tables (the layout, the residency table).
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// Index of a file in the storage adapter's file table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FileId(pub u32);

/// A contiguous byte range of one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Extent {
    /// The file the bytes are in.
    pub file: FileId,
    /// Absolute offset in the file (safetensors: 8 + header length + data offset).
    pub offset: u64,
    /// The range's size in bytes.
    pub length: u64,
}

/// One schedulable unit: the tensors of one transformer layer (or the head/tail).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockLayout {
    /// A name for people: logs, traces, summaries. The model index gives `head`,
    /// `tail`, or the tensors' prefix up to the layer number (`model.layers.3`).
    pub name: String,
    /// Sum of the extents' lengths: the block's size in every tier.
    pub bytes: u64,
    /// Extents in the order their bytes are laid out in the block's buffer.
    pub extents: Vec<Extent>,
}

impl BlockLayout {
    /// A block of `extents`, laid out in that order; its size is their sum.
    pub fn new(name: impl Into<String>, extents: Vec<Extent>) -> Self {
        let bytes = extents.iter().map(|extent| extent.length).sum();
        Self {
            name: name.into(),
            bytes,
            extents,
        }
    }
}

/// The blocks of a model, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ModelLayout {
    /// Every block, indexed by [`BlockId`].
    pub blocks: Vec<BlockLayout>,
}

impl ModelLayout {
    /// The model's size: every block's bytes, counted once.
    pub fn total_bytes(&self) -> u64 {
        self.blocks.iter().map(|block| block.bytes).sum()
    }

    /// The largest block's size (unaligned); 0 for an empty layout.
    pub fn largest_block_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .map(|block| block.bytes)
            .max()
            .unwrap_or(0)
    }

    /// The block with this id, or `None` past the end.
    pub fn block(&self, id: BlockId) -> Option<&BlockLayout> {
        self.blocks.get(id.index())
    }

    /// The number of blocks: every valid [`BlockId`] is below it.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether the model has no blocks.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

/// The same bytes as `extents`, sorted and with touching or overlapping ranges of a
/// file merged: one range per run of adjacent tensors (or blocks).
pub fn coalesce_extents(mut extents: Vec<Extent>) -> Vec<Extent> {
    extents.sort_by_key(|extent| (extent.file, extent.offset));
    let mut merged: Vec<Extent> = Vec::with_capacity(extents.len());
    for extent in extents.into_iter().filter(|extent| extent.length > 0) {
        match merged.last_mut() {
            Some(last)
                if last.file == extent.file && extent.offset <= last.offset + last.length =>
            {
                let end = (last.offset + last.length).max(extent.offset + extent.length);
                last.length = end - last.offset;
            }
            _ => merged.push(extent),
        }
    }
    merged
}

/// The extents covering bytes `start .. start + length` of a region laid out as
/// `extents` end to end (a chunk of a block, for chunked reads).
pub fn slice_extents(extents: &[Extent], start: u64, length: u64) -> Vec<Extent> {
    let end = start.saturating_add(length);
    let mut sliced = Vec::new();
    let mut region_offset = 0u64;
    for extent in extents {
        let extent_end = region_offset + extent.length;
        let overlap_start = start.max(region_offset);
        let overlap_end = end.min(extent_end);
        if overlap_start < overlap_end {
            sliced.push(Extent {
                file: extent.file,
                offset: extent.offset + (overlap_start - region_offset),
                length: overlap_end - overlap_start,
            });
        }
        region_offset = extent_end;
        if region_offset >= end {
            break;
        }
    }
    sliced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(file: u32, offset: u64, length: u64) -> Extent {
        Extent {
            file: FileId(file),
            offset,
            length,
        }
    }

    #[test]
    fn coalescing_merges_touching_and_overlapping_ranges_per_file() {
        // Proves adjacent tensors become one range, gaps and other files stay apart,
        // order does not matter and empty ranges vanish.
        let merged = coalesce_extents(vec![
            extent(0, 100, 50),
            extent(1, 0, 10),
            extent(0, 0, 100),
            extent(0, 160, 40),
            extent(0, 190, 20),
            extent(1, 10, 0),
            extent(1, 10, 5),
        ]);
        assert_eq!(
            merged,
            vec![extent(0, 0, 150), extent(0, 160, 50), extent(1, 0, 15),]
        );
    }
}
