//! Fast-disk streaming: a block without a pinned copy goes from disk to VRAM in chunks
//! through the staging ring — fill buffer i while the device copies buffer i − 1.

use actix::prelude::*;

use crate::mailbox::Post;

use super::PinManager;
use crate::device::DevicePtr;
use crate::error::SessionError;
use crate::layout::{slice_extents, BlockId};
use crate::messages::{PinFailed, ReadBlock, Streamed};
use crate::observer::{ErrorKind, Link, Owner};
use crate::pin_state::BufferHome;

/// A block on its way from disk to VRAM through the fast-disk chunk ring.
pub(super) struct ChunkStream {
    /// Unique among the pin manager's streams.
    id: u64,
    block: BlockId,
    destination: DevicePtr,
    bytes: u64,
    next_offset: u64,
    done_bytes: u64,
    failed: bool,
    /// The first failure, reported once no chunk is in flight.
    error: Option<SessionError>,
    in_flight: u32,
}

impl ChunkStream {
    /// A block of `bytes` to stream to `destination`, nothing read yet.
    pub(super) fn new(id: u64, block: BlockId, destination: DevicePtr, bytes: u64) -> Self {
        Self {
            id,
            block,
            destination,
            bytes,
            next_offset: 0,
            done_bytes: 0,
            failed: false,
            error: None,
            in_flight: 0,
        }
    }
}

impl PinManager {
    /// Starts chunk reads while ring buffers are free: fill slot i while the device
    /// copies slot i − 1.
    pub(super) fn pump(&mut self, ctx: &mut Context<Self>) {
        while let Some(stream) = self
            .streams
            .iter_mut()
            .find(|stream| !stream.failed && stream.next_offset < stream.bytes)
        {
            let Some(buffer) = self.state.take_chunk_buffer() else {
                return;
            };
            let offset = stream.next_offset;
            let length = (buffer.len() as u64).min(stream.bytes - offset);
            stream.next_offset += length;
            stream.in_flight += 1;
            let block = stream.block;
            let id = stream.id;
            let extents = slice_extents(&self.extents[block.index()], offset, length);
            self.reader.post(ReadBlock {
                block,
                extents,
                buffer,
                home: BufferHome::Chunk { offset, stream: id },
                reply_to: ctx.address().recipient(),
            });
        }
    }

    /// A chunk of stream `stream` arrived in pinned memory: copy it on to its place
    /// in VRAM — unless the stream already failed: then its slot is about to be given
    /// up, and nothing more may land in it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_chunk(
        &mut self,
        block: BlockId,
        stream: u64,
        offset: u64,
        buffer: crate::HostBuffer,
        bytes: u64,
        read_seconds: f64,
        ctx: &mut Context<Self>,
    ) {
        let home = BufferHome::Chunk { offset, stream };
        let destination = self
            .streams
            .iter()
            .find(|candidate| candidate.id == stream && !candidate.failed)
            .map(|candidate| candidate.destination.offset(offset));
        let Some(destination) = destination else {
            self.give_back(block, buffer, home, false, ctx);
            self.chunk_done(stream, bytes, None);
            return;
        };
        let started = tokio::time::Instant::now();
        let copy = self.device.copy_to_device(buffer, 0, bytes, destination);
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(copy).map(move |outcome, actor, ctx| {
                let seconds = read_seconds + started.elapsed().as_secs_f64();
                let (buffer, error) = match outcome {
                    Ok(buffer) => (buffer, None),
                    Err((error, buffer)) => (buffer, Some(error.to_string())),
                };
                actor.give_back(block, buffer, home, true, ctx);
                match error {
                    None => {
                        actor
                            .observer
                            .transfer(Link::DiskToVram, Owner::Model, bytes, seconds);
                        actor
                            .observer
                            .block_transfer(Link::DiskToVram, block, bytes, seconds);
                        actor.chunk_done(stream, bytes, None);
                    }
                    Some(reason) => {
                        actor.observer.error(ErrorKind::Copy);
                        actor.chunk_done(
                            stream,
                            bytes,
                            Some(SessionError::CopyFailed { block, reason }),
                        );
                    }
                }
                actor.pump(ctx);
                actor.try_finish_drain();
            }),
        );
    }

    /// Accounts a finished (or failed) chunk of stream `stream`. Once none of its
    /// chunks is in flight, reports the block streamed, or failed with its first
    /// error — not before: the allocator reuses a failed block's slot at once, so no
    /// copy may still be landing in it.
    pub(super) fn chunk_done(&mut self, stream: u64, bytes: u64, error: Option<SessionError>) {
        let Some(index) = self
            .streams
            .iter()
            .position(|candidate| candidate.id == stream)
        else {
            return;
        };
        let entry = &mut self.streams[index];
        entry.in_flight = entry.in_flight.saturating_sub(1);
        entry.done_bytes += bytes;
        if let Some(error) = error {
            entry.failed = true;
            entry.error.get_or_insert(error);
        }
        let finished = entry.in_flight == 0 && (entry.failed || entry.done_bytes >= entry.bytes);
        if !finished {
            return;
        }
        let Some(entry) = self.streams.remove(index) else {
            return;
        };
        let block = entry.block;
        match entry.error {
            Some(error) => self.allocator.post(PinFailed { block, error }),
            None => self.allocator.post(Streamed { block }),
        }
    }
}
