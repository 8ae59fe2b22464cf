//! One VRAM budget and one pin ceiling shared by several models, each with its own
//! session. The broker is a thread that owns the ledger ([`PoolState`]) and a
//! [`BudgetHandle`] per model, and talks only by messages: the sessions never share a
//! lock, and no session reads another's state.
//!
//! Why a broker over per-model sessions, rather than one allocator holding every
//! model's layout: each model keeps its own plan, residency table, ring and actors
//! (its hot path is unchanged, and one model's bytes can never be counted in
//! another's figures), and only the budget moves between them. What moves is decided
//! block by block by the model that gives way (its resident blocks of lowest
//! max-scatter priority first, in its last step those past their last use: a
//! partial unload), inside its own allocator, where
//! activations already win; the broker only says how much.
//!
//! ```no_run
//! use stagehand_actors::{Lease, PoolAsk, SharedBudget};
//! # fn demo() -> Result<(), stagehand_actors::PoolError> {
//! let pool = SharedBudget::start(Lease { vram_bytes: 24 << 30, pin_bytes: 32 << 30 })?;
//! let ask = PoolAsk {
//!     floor: Lease { vram_bytes: 1 << 30, pin_bytes: 1 << 30 },
//!     want: Lease { vram_bytes: 16 << 30, pin_bytes: 16 << 30 },
//! };
//! let lease = pool.join("llm", ask)?; // start its session with `lease` as its budgets,
//! // then `pool.attach("llm", session.budget_handle())`; before each job
//! // `pool.begin_use("llm")`, after it `pool.end_use("llm")`; once finished
//! // `pool.leave("llm")`.
//! # let _ = lease; Ok(()) }
//! ```

use std::collections::HashMap;

use crate::pool_state::{Lease, MemberSnapshot, PoolAsk, PoolError, PoolState};
use crate::session::BudgetHandle;

type Answer<T> = flume::Sender<Result<T, PoolError>>;

enum Request {
    Join(String, PoolAsk, Answer<Lease>),
    Attach(String, BudgetHandle, Answer<()>),
    Use(String, Answer<Lease>),
    Idle(String),
    Leave(String, Answer<()>),
    Snapshot(flume::Sender<Vec<MemberSnapshot>>),
}

/// The way in to a shared budget's broker: cheap to clone, usable from any thread.
/// The broker stops when the last clone is dropped.
#[derive(Clone)]
pub struct SharedBudget {
    requests: flume::Sender<Request>,
    total: Lease,
}

/// Requests waiting for the broker at once: each model has at most one outstanding.
const BROKER_QUEUE: usize = 64;

impl SharedBudget {
    /// Starts the broker of a budget of `total`.
    pub fn start(total: Lease) -> Result<Self, PoolError> {
        let (requests, inbox) = flume::bounded(BROKER_QUEUE);
        std::thread::Builder::new()
            .name("stagehand-budget".into())
            .spawn(move || {
                let mut broker = Broker {
                    state: PoolState::new(total),
                    handles: HashMap::new(),
                };
                while let Ok(request) = inbox.recv() {
                    broker.handle(request);
                }
            })
            .map_err(|_| PoolError::Stopped)?;
        Ok(Self { requests, total })
    }

    /// The whole shared budget.
    pub fn total(&self) -> Lease {
        self.total
    }

    fn ask<T>(&self, request: impl FnOnce(Answer<T>) -> Request) -> Result<T, PoolError> {
        let (reply, answer) = flume::bounded(1);
        self.requests
            .send(request(reply))
            .map_err(|_| PoolError::Stopped)?;
        answer.recv().map_err(|_| PoolError::Stopped)?
    }

    /// Adds a model and makes room for it (others give way, least recent first):
    /// returns the lease to start its session with, at least `ask.floor`.
    pub fn join(&self, name: &str, ask: PoolAsk) -> Result<Lease, PoolError> {
        self.ask(|reply| Request::Join(name.to_string(), ask, reply))
    }

    /// The model's session runs: from now on it can be asked to give way.
    pub fn attach(&self, name: &str, handle: BudgetHandle) -> Result<(), PoolError> {
        self.ask(|reply| Request::Attach(name.to_string(), handle, reply))
    }

    /// The model is about to run: ranks it first and grows it toward its want,
    /// taking room from the others in rank order. Returns its lease.
    pub fn begin_use(&self, name: &str) -> Result<Lease, PoolError> {
        self.ask(|reply| Request::Use(name.to_string(), reply))
    }

    /// The model is idle (between jobs): it gives way before busy models.
    pub fn end_use(&self, name: &str) {
        let _ = self.requests.send(Request::Idle(name.to_string()));
    }

    /// Removes the model once its session has finished; its lease is free again.
    pub fn leave(&self, name: &str) -> Result<(), PoolError> {
        self.ask(|reply| Request::Leave(name.to_string(), reply))
    }

    /// Every model's lease and rank.
    pub fn snapshot(&self) -> Vec<MemberSnapshot> {
        let (reply, answer) = flume::bounded(1);
        if self.requests.send(Request::Snapshot(reply)).is_err() {
            return Vec::new();
        }
        answer.recv().unwrap_or_default()
    }
}

/// The broker thread's state.
struct Broker {
    state: PoolState,
    handles: HashMap<String, BudgetHandle>,
}

impl Broker {
    fn handle(&mut self, request: Request) {
        match request {
            Request::Join(name, ask, reply) => {
                let _ = reply.send(self.join(&name, ask));
            }
            Request::Attach(name, handle, reply) => {
                let attached = self.state.attach(&name);
                if attached.is_ok() {
                    self.handles.insert(name, handle);
                }
                let _ = reply.send(attached);
            }
            Request::Use(name, reply) => {
                let _ = reply.send(self.begin_use(&name));
            }
            Request::Idle(name) => {
                let _ = self.state.end_use(&name);
            }
            Request::Leave(name, reply) => {
                self.handles.remove(&name);
                let _ = reply.send(self.state.leave(&name));
            }
            Request::Snapshot(reply) => {
                let _ = reply.send(self.state.snapshot());
            }
        }
    }

    fn lease_of(&self, name: &str) -> Lease {
        self.state
            .snapshot()
            .into_iter()
            .find(|member| member.name == name)
            .map_or(Lease::default(), |member| member.lease)
    }

    fn join(&mut self, name: &str, ask: PoolAsk) -> Result<Lease, PoolError> {
        self.state.join(name, ask)?;
        let (wanted, victims) = self.state.begin_use(name)?;
        self.make_room(wanted, &victims)?;
        let lease = self.state.free().min(ask.want);
        if !ask.floor.within(lease) {
            // Every other model gave way to its floor and it still does not fit.
            let total = self.state.total();
            let needed = (self.state.snapshot().iter())
                .fold(Lease::default(), |sum, member| sum.plus(member.ask.floor));
            self.state.leave(name)?;
            return Err(PoolError::DoesNotFit {
                name: name.to_string(),
                total,
                needed,
            });
        }
        self.state.record(name, lease)?;
        Ok(lease)
    }

    fn begin_use(&mut self, name: &str) -> Result<Lease, PoolError> {
        let (wanted, victims) = self.state.begin_use(name)?;
        self.make_room(wanted, &victims)?;
        // Even without more room, the resize re-plans the model in its lease: blocks
        // its own activations pushed out (a decoder's KV pages, since given back)
        // are planned resident again.
        let target = (self.state.grow_target(name)).unwrap_or_else(|| self.lease_of(name));
        if let Some(handle) = self.handles.get(name) {
            // A model that cannot take the room (stopped) keeps what it had.
            if let Ok(granted) = handle.resize(target) {
                self.state.record(name, granted.min(target))?;
            }
        }
        Ok(self.lease_of(name))
    }

    /// Asks `victims` in order to give way until `wanted` is free.
    fn make_room(&mut self, wanted: Lease, victims: &[String]) -> Result<(), PoolError> {
        for victim in victims {
            let still_needed = wanted.minus(self.state.free());
            if still_needed == Lease::default() {
                break;
            }
            let Some(target) = self.state.shrink_target(victim, still_needed) else {
                continue;
            };
            let Some(handle) = self.handles.get(victim) else {
                continue;
            };
            let before = self.lease_of(victim);
            // A session that has stopped gives nothing now; its leave frees it all.
            if let Ok(granted) = handle.resize(target) {
                tracing::debug!(
                    "shared budget: {victim} gave way from vram {} / pin {} to vram {} / pin {}",
                    crate::Bytes(before.vram_bytes),
                    crate::Bytes(before.pin_bytes),
                    crate::Bytes(granted.vram_bytes),
                    crate::Bytes(granted.pin_bytes)
                );
                self.state.record(victim, granted.min(before))?;
            }
        }
        Ok(())
    }
}
