//! ComputeStream: the compute thread's mailbox. It turns what the compute thread
//! reports (misses, streamed releases, step ends) into prefetch scheduling for the
//! VRAM allocator and sync points for the pin manager, and runs the shutdown.

use std::sync::Arc;

use actix::prelude::*;

use crate::mailbox::Post;

use crate::messages::{
    Demand, Drain, LastStep, Miss, ReleaseActivations, ReleaseStreamed, Released,
    ReserveActivations, Shutdown, StepDone, SyncPoint,
};
use crate::observer::Observer;
use crate::pin_manager::PinManager;
use crate::vram_allocator::VramAllocator;

pub struct ComputeStream {
    allocator: Addr<VramAllocator>,
    pins: Addr<PinManager>,
    observer: Arc<dyn Observer>,
    /// Stop the actix system after shutdown (the session owns it).
    owns_system: bool,
}

impl ComputeStream {
    pub fn new(
        allocator: Addr<VramAllocator>,
        pins: Addr<PinManager>,
        observer: Arc<dyn Observer>,
        owns_system: bool,
    ) -> Self {
        Self {
            allocator,
            pins,
            observer,
            owns_system,
        }
    }
}

impl Actor for ComputeStream {
    type Context = Context<Self>;
}

impl Handler<Miss> for ComputeStream {
    type Result = ();

    fn handle(&mut self, miss: Miss, _ctx: &mut Self::Context) {
        // Compute is waiting: a sync point costs nothing here.
        self.pins.post(SyncPoint {
            cursor: miss.position,
        });
        self.allocator.post(Demand {
            block: miss.block,
            position: miss.position,
            reply: miss.reply,
        });
    }
}

impl Handler<ReleaseStreamed> for ComputeStream {
    type Result = ();

    fn handle(&mut self, release: ReleaseStreamed, _ctx: &mut Self::Context) {
        self.allocator.post(Released {
            block: release.block,
            position: release.position,
        });
        self.pins.post(SyncPoint {
            cursor: release.position + 1,
        });
    }
}

impl Handler<StepDone> for ComputeStream {
    type Result = ();

    fn handle(&mut self, done: StepDone, _ctx: &mut Self::Context) {
        self.observer.acquires(done.batch);
        self.observer.step(done.step_seconds);
        self.pins.post(SyncPoint { cursor: 0 });
    }
}

impl Handler<LastStep> for ComputeStream {
    type Result = ();

    fn handle(&mut self, message: LastStep, _ctx: &mut Self::Context) {
        self.allocator.post(message);
    }
}

impl Handler<ReserveActivations> for ComputeStream {
    type Result = ();

    fn handle(&mut self, message: ReserveActivations, _ctx: &mut Self::Context) {
        self.allocator.post(message);
    }
}

impl Handler<ReleaseActivations> for ComputeStream {
    type Result = ();

    fn handle(&mut self, message: ReleaseActivations, _ctx: &mut Self::Context) {
        self.allocator.post(message);
    }
}

impl Handler<Shutdown> for ComputeStream {
    type Result = ();

    fn handle(&mut self, shutdown: Shutdown, ctx: &mut Self::Context) {
        let allocator = self.allocator.clone();
        let pins = self.pins.clone();
        let owns_system = self.owns_system;
        // The allocator drains first (it drains the LoRA offloader, whose regions live
        // in its arena; copies in flight return buffers to the pins), then the pins.
        let drain = async move {
            let (reply, done) = flume::bounded(1);
            allocator.post(Drain { reply });
            let _ = done.recv_async().await;
            let (reply, done) = flume::bounded(1);
            pins.post(Drain { reply });
            let _ = done.recv_async().await;
        };
        ctx.spawn(
            actix::fut::wrap_future::<_, Self>(drain).map(move |_, _actor, ctx| {
                let _ = shutdown.reply.send(());
                ctx.stop();
                if owns_system {
                    System::current().stop();
                }
            }),
        );
    }
}
