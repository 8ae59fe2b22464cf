//! Turning a read's extents into the requests the workers issue.
//!
//! A block's tensors usually sit back to back in its file, so adjacent extents are
//! merged first (one 4 MiB request instead of dozens of bias-sized ones), then each run
//! is cut at multiples of the request size in *file* offsets: every request after a
//! run's first starts on an aligned file offset, which is what O_DIRECT wants.

use stagehand_actors::{Extent, FileId};

/// One read request: `length` bytes at `file_offset`, landing at `buffer_offset` from
/// the start of the read's destination region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub file: FileId,
    pub file_offset: u64,
    pub length: u64,
    pub buffer_offset: u64,
}

/// Merges adjacent extents and splits the result into requests of at most
/// `request_bytes`. Zero-length extents produce nothing. The chunks tile the
/// destination region `[0, sum of lengths)` exactly, in order.
pub(crate) fn plan_chunks(extents: &[Extent], request_bytes: u64) -> Vec<Chunk> {
    let request_bytes = request_bytes.max(1);
    let mut runs: Vec<Chunk> = Vec::with_capacity(extents.len());
    let mut buffer_offset = 0u64;
    for extent in extents.iter().filter(|extent| extent.length > 0) {
        let continues_previous = runs.last().is_some_and(|run| {
            run.file == extent.file && run.file_offset + run.length == extent.offset
        });
        match runs.last_mut() {
            Some(run) if continues_previous => run.length += extent.length,
            _ => runs.push(Chunk {
                file: extent.file,
                file_offset: extent.offset,
                length: extent.length,
                buffer_offset,
            }),
        }
        buffer_offset += extent.length;
    }

    let mut chunks = Vec::with_capacity(runs.len() + (buffer_offset / request_bytes) as usize);
    for run in runs {
        let run_end = run.file_offset + run.length;
        let mut position = run.file_offset;
        while position < run_end {
            let next_boundary = (position / request_bytes + 1) * request_bytes;
            let end = next_boundary.min(run_end);
            chunks.push(Chunk {
                file: run.file,
                file_offset: position,
                length: end - position,
                buffer_offset: run.buffer_offset + (position - run.file_offset),
            });
            position = end;
        }
    }
    chunks
}

/// Cutting a block into slot-sized pieces is the pipeline's own arithmetic too.
pub use stagehand_actors::slice_extents;

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
    fn adjacent_extents_merge_and_split_on_request_boundaries() {
        let chunks = plan_chunks(&[extent(0, 100, 50), extent(0, 150, 250)], 128);
        let pieces: Vec<(u64, u64, u64)> = chunks
            .iter()
            .map(|chunk| (chunk.file_offset, chunk.length, chunk.buffer_offset))
            .collect();
        assert_eq!(
            pieces,
            vec![
                (100, 28, 0),
                (128, 128, 28),
                (256, 128, 156),
                (384, 16, 284)
            ]
        );
    }

    #[test]
    fn extents_of_other_files_or_gaps_do_not_merge_and_empty_ones_vanish() {
        let chunks = plan_chunks(
            &[
                extent(0, 0, 10),
                extent(1, 10, 10),
                extent(1, 30, 0),
                extent(1, 40, 5),
            ],
            4096,
        );
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[1].buffer_offset, 10);
        assert_eq!(chunks[2].buffer_offset, 20);
        assert_eq!(chunks[2].file_offset, 40);
    }

    #[test]
    fn slicing_cuts_extents_at_region_positions() {
        let extents = [extent(0, 1000, 10), extent(1, 0, 10), extent(0, 50, 10)];
        assert_eq!(
            slice_extents(&extents, 5, 10),
            vec![extent(0, 1005, 5), extent(1, 0, 5)]
        );
        assert_eq!(slice_extents(&extents, 25, 100), vec![extent(0, 55, 5)]);
        assert!(slice_extents(&extents, 30, 5).is_empty());
    }
}
