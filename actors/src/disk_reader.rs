//! DiskReader: owns the storage adapter and bounds the reads in flight.
//!
//! The adapter (`pread` worker pool, O_DIRECT, or the simulator) does the blocking
//! work off this thread; this actor only queues requests beyond the bound and turns
//! completions into `ReadDone` messages. Its queue is bounded by the protocol: every
//! read carries one of the pin manager's buffers, so no more reads than buffers can be
//! outstanding; the bound is given at start and held (past it the session stops).

use std::collections::VecDeque;
use std::sync::Arc;

use actix::prelude::*;

use crate::mailbox::Post;
use tokio::time::Instant;

use crate::error::ReadFault;
use crate::messages::{ForgetCached, ReadBlock, ReadDone};
use crate::storage::Storage;

pub struct DiskReader {
    storage: Arc<dyn Storage>,
    max_in_flight: usize,
    in_flight: usize,
    queued: VecDeque<ReadBlock>,
    /// Reads started or queued at most: one per pinned buffer there can be.
    max_outstanding: usize,
}

impl DiskReader {
    pub fn new(storage: Arc<dyn Storage>, max_in_flight: usize, max_outstanding: usize) -> Self {
        let max_in_flight = max_in_flight.max(1);
        Self {
            storage,
            max_in_flight,
            in_flight: 0,
            queued: VecDeque::with_capacity(
                max_outstanding.saturating_sub(max_in_flight).min(1024),
            ),
            max_outstanding: max_outstanding.max(max_in_flight),
        }
    }

    fn start(&mut self, request: ReadBlock, ctx: &mut Context<Self>) {
        self.in_flight += 1;
        let ReadBlock {
            block,
            extents,
            buffer,
            home,
            reply_to,
        } = request;
        let bytes = extents.iter().map(|extent| extent.length).sum();
        let started = Instant::now();
        let read = self.storage.read(extents, buffer, 0);
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(read).map(move |result, actor, ctx| {
                actor.in_flight -= 1;
                let seconds = started.elapsed().as_secs_f64();
                let (buffer, error) = match result {
                    Ok(buffer) => (buffer, None),
                    Err((error, buffer)) => (buffer, Some(ReadFault::of(&error))),
                };
                reply_to.post(ReadDone {
                    block,
                    home,
                    buffer,
                    bytes,
                    seconds,
                    error,
                });
                if let Some(next) = actor.queued.pop_front() {
                    actor.start(next, ctx);
                }
            }),
        );
    }
}

impl Actor for DiskReader {
    type Context = Context<Self>;
}

impl Handler<ReadBlock> for DiskReader {
    type Result = ();

    fn handle(&mut self, request: ReadBlock, ctx: &mut Self::Context) {
        if self.in_flight < self.max_in_flight {
            self.start(request, ctx);
            return;
        }
        let outstanding = self.in_flight + self.queued.len() + 1;
        if outstanding > self.max_outstanding {
            // More reads than buffers: the pin manager lent a buffer twice. The queue
            // does not grow past its bound; the session stops instead.
            crate::mailbox::queue_over_bound(&format!(
                "{outstanding} reads outstanding, over the bound of {} (one per pinned buffer)",
                self.max_outstanding
            ));
            return;
        }
        self.queued.push_back(request);
    }
}

impl Handler<ForgetCached> for DiskReader {
    type Result = ();

    fn handle(&mut self, message: ForgetCached, _ctx: &mut Self::Context) {
        self.storage.forget_cached(&message.extents);
    }
}
