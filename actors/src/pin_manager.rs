//! PinManager: owns the pinned RAM budget — the pinned cache of streamed blocks and the
//! staging ring — and does its registration work only at sync points.

use std::sync::Arc;

use actix::prelude::*;

use crate::device::Device;
use crate::disk_reader::DiskReader;
use crate::error::SessionError;
use crate::layout::Extent;
use crate::messages::{
    Drain, EnsurePinned, PinFailed, Pinned, ReadBlock, ReadDone, Reply, ReturnBuffer, SyncPoint,
};
use crate::observer::{ErrorKind, Link, Observer, Owner, Tier, TierUsage};
use crate::pin_state::{BufferHome, PinAction, PinState};

pub struct PinManager {
    state: PinState,
    extents: Vec<Vec<Extent>>,
    device: Arc<dyn Device>,
    reader: Addr<DiskReader>,
    allocator: Recipient<Pinned>,
    failures: Recipient<PinFailed>,
    observer: Arc<dyn Observer>,
    draining: Option<Reply<()>>,
}

impl PinManager {
    pub fn new(
        state: PinState,
        extents: Vec<Vec<Extent>>,
        device: Arc<dyn Device>,
        reader: Addr<DiskReader>,
        allocator: Recipient<Pinned>,
        failures: Recipient<PinFailed>,
        observer: Arc<dyn Observer>,
    ) -> Self {
        Self {
            state,
            extents,
            device,
            reader,
            allocator,
            failures,
            observer,
            draining: None,
        }
    }

    fn report_usage(&self) {
        self.observer.tier_usage(
            Tier::Pinned,
            TierUsage {
                model_bytes: self.state.cache_bytes(),
                lora_bytes: 0,
                other_bytes: self.state.staging_bytes(),
                budget_bytes: self.state.ceiling_bytes(),
                blocks: self.state.cached_blocks(),
            },
        );
    }

    fn act(&mut self, action: PinAction, ctx: &mut Context<Self>) {
        match action {
            PinAction::Ready {
                block,
                buffer,
                home,
            } => self.allocator.do_send(Pinned {
                block,
                buffer,
                home,
            }),
            PinAction::Read {
                block,
                buffer,
                home,
            } => self.reader.do_send(ReadBlock {
                block,
                extents: self.extents[block.index()].clone(),
                buffer,
                home,
                reply_to: ctx.address().recipient(),
            }),
        }
    }

    /// Registers what the plan wants pinned now. Runs only at sync points (and once at
    /// start for the staging ring), never in the middle of a block.
    fn consolidate(&mut self, cursor: usize) {
        let mut operations = 0;
        while let Some(bytes) = self.state.staging_wanted() {
            match self.device.allocate_pinned(bytes) {
                Ok(buffer) => self.state.add_staging(buffer),
                Err(error) => {
                    tracing::warn!("staging buffer: {error}");
                    self.observer.error(ErrorKind::Pin);
                    break;
                }
            }
            operations += 1;
        }
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

    fn try_finish_drain(&mut self) {
        if self.draining.is_none() || self.state.lent_out() > 0 {
            return;
        }
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

impl Actor for PinManager {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1024);
        self.consolidate(0);
    }
}

impl Handler<EnsurePinned> for PinManager {
    type Result = ();

    fn handle(&mut self, message: EnsurePinned, ctx: &mut Self::Context) {
        if let Some(action) = self.state.request(message.block) {
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
        if let Some(reason) = error {
            self.observer.error(ErrorKind::Read);
            self.failures.do_send(PinFailed {
                block,
                error: SessionError::ReadFailed { block, reason },
            });
            if let Some(action) = self.state.give_back(block, buffer, home, false) {
                self.act(action, ctx);
            }
            self.try_finish_drain();
            return;
        }
        self.observer
            .transfer(Link::DiskToPinned, Owner::Model, bytes, seconds);
        if home == BufferHome::Cache {
            self.state.filled(block);
        }
        self.allocator.do_send(Pinned {
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
        if let Some(action) = self.state.give_back(block, buffer, home, true) {
            self.act(action, ctx);
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

    fn handle(&mut self, message: Drain, _ctx: &mut Self::Context) {
        self.draining = Some(message.reply);
        self.try_finish_drain();
    }
}
