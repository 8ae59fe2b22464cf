//! Direct-to-VRAM streaming (`--fast-disk`): a block is read slot by slot into a small
//! ring of pinned staging buffers and copied on from there, so it never needs a full
//! pinned copy and pinned RAM stays at the ring's size.
//!
//! While the caller copies chunk i out of its slot, the reads of chunks i+1 and i+2 are
//! already filling the other slots (with the default three slots). The caller's copy
//! hands the slot back when the device is done with it; only then is it refilled.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::pin;
use std::task::{Context, Poll};

use stagehand_actors::{Extent, HostBuffer, OpFuture, Storage, StorageError};

use super::read_plan::slice_extents;

/// Most slots a ring may have: a bound on reads in flight per streamed block.
pub const MAX_STAGING_SLOTS: usize = 64;

/// K equally sized staging buffers (pinned, from `Device::allocate_pinned`).
pub struct StagingRing {
    free: Vec<HostBuffer>,
    slots: usize,
    slot_bytes: u64,
}

impl StagingRing {
    /// Takes ownership of the buffers; they must be 1..=64 of one non-zero size.
    pub fn new(buffers: Vec<HostBuffer>) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::Io {
            path: "staging ring".to_string(),
            reason,
        };
        let Some(first) = buffers.first() else {
            return Err(invalid("needs at least one staging buffer".to_string()));
        };
        let slot_bytes = first.len() as u64;
        if slot_bytes == 0 || buffers.len() > MAX_STAGING_SLOTS {
            return Err(invalid(format!(
                "needs 1..={MAX_STAGING_SLOTS} non-empty buffers, got {} of {slot_bytes} bytes",
                buffers.len()
            )));
        }
        if buffers
            .iter()
            .any(|buffer| buffer.len() as u64 != slot_bytes)
        {
            return Err(invalid(
                "staging buffers must all have the same size".to_string(),
            ));
        }
        Ok(Self {
            slots: buffers.len(),
            free: buffers,
            slot_bytes,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    /// Host bytes the ring holds: what it adds to pinned RAM.
    pub fn total_bytes(&self) -> u64 {
        self.slot_bytes * self.slots as u64
    }

    /// Gives the buffers back (e.g. to unregister them); all are home between streams.
    pub fn into_buffers(self) -> Vec<HostBuffer> {
        self.free
    }
}

/// Why a streamed block failed: the disk read, or the caller's copy out of a slot.
#[derive(Debug, thiserror::Error)]
pub enum StreamError<E: std::error::Error + 'static> {
    #[error("staging read failed: {0}")]
    Read(#[source] StorageError),
    #[error("staging copy failed: {0}")]
    Copy(#[source] E),
}

type ReadOutcome = Result<HostBuffer, (StorageError, HostBuffer)>;

struct PendingRead {
    block_offset: u64,
    bytes: u64,
    future: Option<OpFuture<HostBuffer, (StorageError, HostBuffer)>>,
    outcome: Option<ReadOutcome>,
}

/// Streams the block made of `extents` (laid back to back) through `ring`: each chunk
/// of at most `ring.slot_bytes()` is read into a free slot, then handed to
/// `on_chunk(slot, chunk_offset_in_block, chunk_bytes)`, whose future resolves with the
/// slot once the copy out of it is done (a `Device::copy_to_device` future fits as is:
/// `|slot, offset, bytes| device.copy_to_device(slot, 0, bytes, block_slot.offset(offset))`).
/// Chunks are handed over in block order, one copy at a time.
///
/// On success and on failure alike, every buffer is back in the ring when this returns:
/// a failed stream waits for its reads in flight instead of abandoning their slots.
pub async fn stream_block<F, Fut, E>(
    storage: &dyn Storage,
    extents: Vec<Extent>,
    ring: &mut StagingRing,
    mut on_chunk: F,
) -> Result<(), StreamError<E>>
where
    F: FnMut(HostBuffer, u64, u64) -> Fut,
    Fut: Future<Output = Result<HostBuffer, (E, HostBuffer)>>,
    E: std::error::Error + 'static,
{
    let block_bytes: u64 = extents.iter().map(|extent| extent.length).sum();
    let slot_bytes = ring.slot_bytes;
    let mut next_offset = 0u64;
    let mut reads: VecDeque<PendingRead> = VecDeque::with_capacity(ring.slots);
    let mut failure: Option<StreamError<E>> = None;

    while failure.is_none() && (next_offset < block_bytes || !reads.is_empty()) {
        // Fill every free slot: with K slots, K−1 reads run while one slot is copied.
        while next_offset < block_bytes {
            let Some(slot) = ring.free.pop() else { break };
            let bytes = slot_bytes.min(block_bytes - next_offset);
            let chunk_extents = slice_extents(&extents, next_offset, bytes);
            reads.push_back(PendingRead {
                block_offset: next_offset,
                bytes,
                future: Some(storage.read(chunk_extents, slot, 0)),
                outcome: None,
            });
            next_offset += bytes;
        }

        poll_fn(|context| {
            poll_reads(context, &mut reads);
            let head_done = reads.front().is_none_or(|read| read.outcome.is_some());
            if head_done {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        let Some(head) = reads.pop_front() else { break };
        let slot = match head.outcome {
            Some(Ok(slot)) => slot,
            Some(Err((error, slot))) => {
                ring.free.push(slot);
                failure = Some(StreamError::Read(error));
                break;
            }
            None => break,
        };

        let mut copy = pin!(on_chunk(slot, head.block_offset, head.bytes));
        // Keep driving the reads while the copy runs: some storages only make progress
        // when polled.
        let copied = poll_fn(|context| {
            poll_reads(context, &mut reads);
            copy.as_mut().poll(context)
        })
        .await;
        match copied {
            Ok(slot) => ring.free.push(slot),
            Err((error, slot)) => {
                ring.free.push(slot);
                failure = Some(StreamError::Copy(error));
            }
        }
    }

    // Bring every slot home before returning, whatever happened.
    poll_fn(|context| {
        poll_reads(context, &mut reads);
        if reads.iter().all(|read| read.outcome.is_some()) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    for read in reads.drain(..) {
        match read.outcome {
            Some(Ok(slot)) | Some(Err((_, slot))) => ring.free.push(slot),
            None => {}
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

fn poll_reads(context: &mut Context<'_>, reads: &mut VecDeque<PendingRead>) {
    for read in reads.iter_mut() {
        let Some(future) = read.future.as_mut() else {
            continue;
        };
        if let Poll::Ready(outcome) = future.as_mut().poll(context) {
            read.outcome = Some(outcome);
            read.future = None;
        }
    }
}
