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
    block: BlockId,
    destination: DevicePtr,
    bytes: u64,
    next_offset: u64,
    done_bytes: u64,
    failed: bool,
    in_flight: u32,
}

impl ChunkStream {
    /// A block of `bytes` to stream to `destination`, nothing read yet.
    pub(super) fn new(block: BlockId, destination: DevicePtr, bytes: u64) -> Self {
        Self {
            block,
            destination,
            bytes,
            next_offset: 0,
            done_bytes: 0,
            failed: false,
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
            let extents = slice_extents(&self.extents[block.index()], offset, length);
            self.reader.post(ReadBlock {
                block,
                extents,
                buffer,
                home: BufferHome::Chunk { offset },
                reply_to: ctx.address().recipient(),
            });
        }
    }

    /// A chunk arrived in pinned memory: copy it on to its place in VRAM.
    pub(super) fn copy_chunk(
        &mut self,
        block: BlockId,
        offset: u64,
        buffer: crate::HostBuffer,
        bytes: u64,
        read_seconds: f64,
        ctx: &mut Context<Self>,
    ) {
        let Some(destination) = self
            .streams
            .iter()
            .find(|stream| stream.block == block)
            .map(|stream| stream.destination.offset(offset))
        else {
            self.give_back(block, buffer, BufferHome::Chunk { offset }, false, ctx);
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
                actor.give_back(block, buffer, BufferHome::Chunk { offset }, true, ctx);
                match error {
                    None => {
                        actor
                            .observer
                            .transfer(Link::DiskToVram, Owner::Model, bytes, seconds);
                        actor
                            .observer
                            .block_transfer(Link::DiskToVram, block, bytes, seconds);
                        actor.chunk_done(block, bytes, None);
                    }
                    Some(reason) => {
                        actor.observer.error(ErrorKind::Copy);
                        actor.chunk_done(
                            block,
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

    /// Accounts a finished (or failed) chunk; reports the block when all have landed.
    pub(super) fn chunk_done(&mut self, block: BlockId, bytes: u64, error: Option<SessionError>) {
        let Some(index) = self.streams.iter().position(|stream| stream.block == block) else {
            return;
        };
        let stream = &mut self.streams[index];
        stream.in_flight -= 1;
        stream.done_bytes += bytes;
        if let Some(error) = error {
            if !stream.failed {
                stream.failed = true;
                self.allocator.post(PinFailed { block, error });
            }
        }
        let finished =
            stream.in_flight == 0 && (stream.failed || stream.done_bytes >= stream.bytes);
        if finished {
            let stream = self.streams.remove(index);
            if stream.is_some_and(|stream| !stream.failed) {
                self.allocator.post(Streamed { block });
            }
        }
    }
}
