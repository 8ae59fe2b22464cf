//! PinManager: owns the pinned RAM budget — the pinned cache of streamed blocks and the
//! staging ring — and does its registration work only at sync points.

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;

use crate::mailbox::Post;

use crate::device::Device;
use crate::disk_reader::DiskReader;
use crate::error::ReadFault;
use crate::layout::{coalesce_extents, BlockId, Extent};
use crate::messages::{
    Drain, EnsurePinned, ForgetCached, PinFailed, Pinned, ReadAhead, ReadBlock, ReadDone, Reply,
    ReturnBuffer, SyncPoint,
};
use crate::observer::{ErrorKind, Link, Observer, Owner, Tier, TierUsage};
use crate::pin_state::{AheadDone, BufferHome, PinAction, PinState};
use crate::vram_allocator::VramAllocator;

pub struct PinManager {
    state: PinState,
    /// Fast-disk streams in request order; the ring serves the oldest first.
    streams: VecDeque<ChunkStream>,
    /// The last stream's number (each stream gets the next one).
    next_stream: u64,

    extents: Vec<Vec<Extent>>,
    device: Arc<dyn Device>,
    reader: Addr<DiskReader>,
    /// Where pinned blocks, streamed blocks and failures are reported.
    allocator: Addr<VramAllocator>,
    observer: Arc<dyn Observer>,
    /// File ranges of blocks that now have a pinned copy: their page-cache copy is
    /// dropped at the next sync point, merged, so that folios straddling two tensors
    /// (or two adjacent pinned blocks) go too — the kernel keeps any folio a range
    /// covers only in part.
    forget: Vec<Extent>,
    draining: Option<Reply<()>>,
}

impl PinManager {
    pub fn new(
        state: PinState,
        extents: Vec<Vec<Extent>>,
        device: Arc<dyn Device>,
        reader: Addr<DiskReader>,
        allocator: Addr<VramAllocator>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Self {
            state,
            streams: VecDeque::new(),
            next_stream: 0,
            extents,
            device,
            reader,
            allocator,
            observer,
            forget: Vec::new(),
            draining: None,
        }
    }

    fn report_usage(&self) {
        self.observer.tier_usage(
            Tier::Pinned,
            TierUsage {
                model_bytes: self.state.cache_bytes(),
                lora_bytes: self.state.lora_bytes(),
                other_bytes: self.state.staging_bytes(),
                budget_bytes: self.state.ceiling_bytes(),
                blocks: self.state.cached_blocks(),
            },
        );
    }

    fn act(&mut self, action: PinAction, ctx: &mut Context<Self>) {
        match action {
            PinAction::Stream { .. } => self.pump(ctx),
            PinAction::Ready {
                block,
                buffer,
                home,
            } => self.allocator.post(Pinned {
                block,
                buffer,
                home,
            }),
            PinAction::Read {
                block,
                buffer,
                home,
            } => self.reader.post(ReadBlock {
                block,
                extents: self.extents[block.index()].clone(),
                buffer,
                home,
                reply_to: ctx.address().recipient(),
            }),
        }
    }

    /// Returns a buffer to its home; a request that was waiting for it goes ahead.
    fn give_back(
        &mut self,
        block: BlockId,
        buffer: crate::HostBuffer,
        home: BufferHome,
        bytes_valid: bool,
        ctx: &mut Context<Self>,
    ) {
        if let Some(action) = self.state.give_back(block, buffer, home, bytes_valid) {
            self.act(action, ctx);
        }
    }

    /// A read-ahead read landed (or failed): hand it to the allocator if it already
    /// asked, else keep it for when it does.
    fn read_ahead_done(
        &mut self,
        block: BlockId,
        buffer: crate::HostBuffer,
        bytes: u64,
        seconds: f64,
        error: Option<ReadFault>,
        ctx: &mut Context<Self>,
    ) {
        if error.is_none() {
            self.observer
                .transfer(Link::DiskToPinned, Owner::Model, bytes, seconds);
            self.observer
                .block_transfer(Link::DiskToPinned, block, bytes, seconds);
        } else {
            self.observer.error(ErrorKind::Read);
        }
        match self.state.ahead_done(block, buffer, error.is_none()) {
            AheadDone::Wanted(action) => self.act(action, ctx),
            AheadDone::Failed(action) => {
                self.allocator.post(PinFailed {
                    block,
                    error: error.unwrap_or_default().into_error(block),
                });
                if let Some(action) = action {
                    self.act(action, ctx);
                }
            }
            AheadDone::Kept(action) => {
                if let Some(action) = action {
                    self.act(action, ctx);
                }
            }
        }
        if self.draining.is_none() {
            if let Some(action) = self.state.next_read_ahead() {
                self.act(action, ctx);
            }
        }
        self.pump(ctx);
        self.try_finish_drain();
    }

    /// Drops the page-cache copy of what was pinned since the last sync point.
    fn forget_pinned(&mut self) {
        if !self.forget.is_empty() {
            let extents = coalesce_extents(std::mem::take(&mut self.forget));
            self.reader.post(ForgetCached { extents });
        }
    }

    /// Reports what became of the read-aheads since the last sync point.
    fn report_read_ahead(&mut self) {
        let outcomes = self.state.take_read_ahead_outcomes();
        for (outcome, blocks) in crate::observer::ReadAheadOutcome::ALL.iter().zip(outcomes) {
            if blocks > 0 {
                self.observer.read_ahead(*outcome, blocks);
            }
        }
    }

    /// Registers what the plan wants pinned now. Runs only at sync points (and once at
    /// start), never in the middle of a block.
    fn consolidate(&mut self, cursor: usize) {
        self.forget_pinned();
        self.report_read_ahead();
        // The staging ring was pinned whole before the session started.
        let mut operations = 0;
        for (block, bytes) in self.state.registrations_due(cursor) {
            match self.device.allocate_pinned(bytes) {
                Ok(buffer) => self.state.registered(block, buffer),
                Err(error) => {
                    // Not fatal: the block keeps streaming through the staging ring.
                    tracing::warn!("pinning {block}: {error}");
                    self.observer.error(ErrorKind::Pin);
                    break;
                }
            }
            operations += 1;
        }
        if operations > 0 {
            self.observer.pin_consolidation(operations);
            self.report_usage();
        }
    }

    fn block_bytes(&self, block: BlockId) -> u64 {
        self.extents[block.index()]
            .iter()
            .map(|extent| extent.length)
            .sum()
    }

    fn try_finish_drain(&mut self) {
        if self.draining.is_none() || self.state.lent_out() > 0 {
            return;
        }
        self.forget_pinned();
        self.report_read_ahead();
        let (buffers, cache_buffers) = self.state.release_all();
        drop(buffers);
        if cache_buffers > 0 {
            self.observer.eviction(Tier::Pinned, cache_buffers);
        }
        self.report_usage();
        if let Some(reply) = self.draining.take() {
            let _ = reply.send(());
        }
    }
}

mod chunks;
mod lora_pins;
mod resize;

use chunks::ChunkStream;

impl Actor for PinManager {
    type Context = Context<Self>;

    fn started(&mut self, _ctx: &mut Self::Context) {
        self.report_usage();
        self.consolidate(0);
    }
}

impl Handler<EnsurePinned> for PinManager {
    type Result = ();

    fn handle(&mut self, message: EnsurePinned, ctx: &mut Self::Context) {
        let action = self.state.request(message.block);
        if let Some(PinAction::Stream { block }) = &action {
            let bytes = self.block_bytes(*block);
            self.next_stream += 1;
            self.streams.push_back(ChunkStream::new(
                self.next_stream,
                *block,
                message.destination,
                bytes,
            ));
        }
        if let Some(action) = action {
            self.act(action, ctx);
        }
    }
}

impl Handler<ReadDone> for PinManager {
    type Result = ();

    fn handle(&mut self, done: ReadDone, ctx: &mut Self::Context) {
        let ReadDone {
            block,
            home,
            buffer,
            bytes,
            seconds,
            error,
        } = done;
        if let BufferHome::Chunk { offset, stream } = home {
            match error {
                None => self.copy_chunk(block, stream, offset, buffer, bytes, seconds, ctx),
                Some(fault) => {
                    self.observer.error(ErrorKind::Read);
                    self.give_back(block, buffer, home, false, ctx);
                    self.chunk_done(stream, bytes, Some(fault.into_error(block)));
                    self.pump(ctx);
                    self.try_finish_drain();
                }
            }
            return;
        }
        if home == BufferHome::Ahead {
            self.read_ahead_done(block, buffer, bytes, seconds, error, ctx);
            return;
        }
        // A read for a request landed: the disk may be idle for a read-ahead now.
        self.state.request_read_done();
        if let Some(action) = self.state.next_read_ahead() {
            self.act(action, ctx);
        }
        if let Some(fault) = error {
            self.observer.error(ErrorKind::Read);
            self.allocator.post(PinFailed {
                block,
                error: fault.into_error(block),
            });
            self.give_back(block, buffer, home, false, ctx);
            self.try_finish_drain();
            return;
        }
        self.observer
            .transfer(Link::DiskToPinned, Owner::Model, bytes, seconds);
        self.observer
            .block_transfer(Link::DiskToPinned, block, bytes, seconds);
        if home == BufferHome::Cache {
            self.state.filled(block);
            // The block now has a pinned copy; its file pages need not stay cached too.
            self.forget.extend_from_slice(&self.extents[block.index()]);
        }
        self.allocator.post(Pinned {
            block,
            buffer,
            home,
        });
    }
}

impl Handler<ReturnBuffer> for PinManager {
    type Result = ();

    fn handle(&mut self, message: ReturnBuffer, ctx: &mut Self::Context) {
        let ReturnBuffer {
            block,
            buffer,
            home,
        } = message;
        self.give_back(block, buffer, home, true, ctx);
        // A returned staging buffer may be what a chunked load is waiting for, or room
        // for a read-ahead.
        self.pump(ctx);
        if self.draining.is_none() {
            if let Some(action) = self.state.next_read_ahead() {
                self.act(action, ctx);
            }
        }
        self.try_finish_drain();
    }
}

impl Handler<SyncPoint> for PinManager {
    type Result = ();

    fn handle(&mut self, message: SyncPoint, _ctx: &mut Self::Context) {
        if self.draining.is_none() {
            self.consolidate(message.cursor);
        }
    }
}

impl Handler<Drain> for PinManager {
    type Result = ();

    fn handle(&mut self, message: Drain, ctx: &mut Self::Context) {
        self.draining = Some(message.reply);
        for action in self.state.cancel_read_ahead() {
            self.act(action, ctx);
        }
        self.try_finish_drain();
    }
}

impl Handler<ReadAhead> for PinManager {
    type Result = ();

    fn handle(&mut self, message: ReadAhead, ctx: &mut Self::Context) {
        if self.draining.is_some() {
            return;
        }
        for action in self.state.read_ahead(&message.blocks) {
            self.act(action, ctx);
        }
    }
}
