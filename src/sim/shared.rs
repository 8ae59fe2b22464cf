//! The shared-bus machine: a backend whose copies, reads and compute are not
//! independent engines but threads on the same few cores and one memory bus (the CPU
//! backend: the copy thread's `memcpy`, the reader threads' page-cache copies and the
//! compute thread's GEMMs). A profile with a `[shared]` table runs its lanes through
//! [`SharedBus`] instead of the independent serial lanes a GPU has.
//!
//! The model is a fluid one. Each operation knows its time alone and what it needs
//! while it runs: cores (threads kept busy) and memory traffic (bytes per second
//! alone). While several run at once, the cores are shared in proportion to what
//! each asks (the scheduler's fair share), and when the traffic they ask for at that
//! share exceeds the bus, every operation's traffic is scaled down in the same
//! proportion; each progresses at the smaller of the two shares. Whenever an
//! operation starts or ends, the others' progress is brought up to date and their
//! ends re-projected, so the timeline stays exact and deterministic.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use super::clock::SimClock;
use crate::telemetry::trace::{Lane, TraceRecorder};

/// The `[shared]` table of a profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedSpec {
    /// Cores the copy thread, the reader threads and the compute thread share.
    pub cores: f64,
    /// Memory traffic all cores together sustain, GB/s (a copy moves each byte twice:
    /// a read and a write).
    pub memory_gb_per_s: f64,
}

impl SharedSpec {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.cores.is_finite() && self.cores >= 1.0) {
            return Err(format!("shared.cores = {}: at least 1", self.cores));
        }
        if !(self.memory_gb_per_s.is_finite() && self.memory_gb_per_s > 0.0) {
            return Err(format!(
                "shared.memory_gb_per_s = {}: must be a positive number",
                self.memory_gb_per_s
            ));
        }
        Ok(())
    }

    /// The shares each of `demands` progresses at when they run at once: its time
    /// alone is stretched by `1 / share`.
    pub fn shares(&self, demands: &[Demand]) -> Vec<f64> {
        // The cores are shared thread by thread. A one-thread operation gets its
        // fair share of a core. An operation split over several threads that all
        // must finish (the compute pool's fork and join, a read's requests) goes at
        // the pace of its slowest thread, on a core shared with the most others:
        // ⌈its threads / cores⌉ to a core alone (its solo time, measured on these
        // cores), ⌈all threads / cores⌉ now. So one operation alone is never slowed
        // by its own threads (four reader threads on two cores), and a two-thread
        // product beside a copy thread on two cores gets half its speed. A one-thread
        // operation shares the cores with at most `cores` threads of each split one:
        // the split one's further threads wait behind their siblings, not beside it.
        // (Issue 22's scenario at depth 2 and 3: the run's one-thread compute ran its
        // streamed blocks at 0.66–0.97 of its resident speed beside 16 MiB page-cache
        // reads of four requests on two cores; counting all four reader threads gave
        // it 2/5 and predicted those depths 13–23 % slow.)
        let threads: f64 = demands.iter().map(|demand| demand.threads).sum();
        let crowded = threads > self.cores;
        let per_core_now = (threads / self.cores).ceil();
        let placed: f64 = demands
            .iter()
            .map(|demand| demand.threads.min(self.cores))
            .sum();
        let cpu_of = |demand: &Demand| {
            if !crowded {
                1.0
            } else if demand.threads > 1.0 {
                (demand.threads / self.cores).ceil() / per_core_now
            } else {
                // Crowded, so `placed` exceeds the cores for any op with a thread.
                (self.cores / placed).min(1.0)
            }
        };
        let traffic: f64 = demands
            .iter()
            .map(|demand| {
                demand.memory_bytes_per_second
                    * if demand.threads > 0.0 {
                        cpu_of(demand)
                    } else {
                        1.0
                    }
            })
            .sum();
        // One operation alone is never slowed: a GEMV's reads may outrun what
        // `memory_gb_per_s` (from memcpy, a read and a write) says the bus carries.
        let largest = demands
            .iter()
            .map(|demand| demand.memory_bytes_per_second)
            .fold(0.0, f64::max);
        let bus = (self.memory_gb_per_s * 1e9).max(largest);
        let memory = if traffic > bus { bus / traffic } else { 1.0 };
        demands
            .iter()
            .map(|demand| {
                let cpu_share = if demand.threads > 0.0 {
                    cpu_of(demand)
                } else {
                    1.0
                };
                let memory_share = if demand.memory_bytes_per_second > 0.0 {
                    cpu_share * memory
                } else {
                    1.0
                };
                cpu_share.min(memory_share).max(1e-6)
            })
            .collect()
    }
}

/// What an operation needs while it runs at its solo speed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// Threads it keeps busy (0: DMA, nothing on the cores).
    pub threads: f64,
    /// Memory traffic it makes alone, bytes per second.
    pub memory_bytes_per_second: f64,
}

/// One operation on the bus.
struct Operation {
    lane: Lane,
    /// Seconds of solo work left.
    remaining: f64,
    demand: Demand,
    label: String,
    bytes: Option<u64>,
    started: Option<f64>,
    /// Set once done: its exact end.
    ended: Option<f64>,
}

struct BusState {
    operations: BTreeMap<u64, Operation>,
    /// Per lane, the operations queued behind the running one, in issue order.
    queues: BTreeMap<u8, VecDeque<u64>>,
    next_id: u64,
    /// When progress was last brought up to date (exact seconds).
    updated: f64,
}

/// The lanes of one shared-bus machine.
pub struct SharedBus {
    spec: SharedSpec,
    clock: Arc<SimClock>,
    state: Mutex<BusState>,
    changed: Notify,
    trace: Option<Arc<TraceRecorder>>,
}

/// `seconds` as a Duration rounded up to whole nanoseconds, so a waiter woken then
/// finds its operation's end reached (rounding down would wake it just before, again
/// and again).
fn nanoseconds_up(seconds: f64) -> Duration {
    Duration::from_nanos((seconds.max(0.0) * 1e9).ceil() as u64)
}

fn lane_key(lane: Lane) -> u8 {
    match lane {
        Lane::Disk => 0,
        Lane::Copy => 1,
        Lane::Compute => 2,
    }
}

impl SharedBus {
    pub fn new(
        spec: SharedSpec,
        clock: Arc<SimClock>,
        trace: Option<Arc<TraceRecorder>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            spec,
            clock,
            state: Mutex::new(BusState {
                operations: BTreeMap::new(),
                queues: BTreeMap::new(),
                next_id: 0,
                updated: 0.0,
            }),
            changed: Notify::new(),
            trace,
        })
    }

    pub fn spec(&self) -> &SharedSpec {
        &self.spec
    }

    fn lock(&self) -> MutexGuard<'_, BusState> {
        // Updates are whole-field writes made before anything that can panic.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Issues an operation of `solo` duration on `lane` now (serial per lane, in
    /// issue order); the future resolves at its exact end. The operation is on the
    /// bus from this call, not from the future's first poll, as a copy queued on a
    /// stream is.
    pub fn submit(
        self: &Arc<Self>,
        lane: Lane,
        solo: Duration,
        demand: Demand,
        label: String,
        bytes: Option<u64>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.submit_waking(lane, Duration::ZERO, solo, demand, label, bytes)
    }

    /// As [`Self::submit`], on a lane whose thread sleeps when it has nothing queued:
    /// issued to an idle lane, the operation first waits `wake` (the thread being
    /// woken, and its completion passed back: nothing on the cores or the bus);
    /// queued behind another, it starts when that one ends, the thread already awake.
    pub fn submit_waking(
        self: &Arc<Self>,
        lane: Lane,
        wake: Duration,
        solo: Duration,
        demand: Demand,
        label: String,
        bytes: Option<u64>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let (woken, id) = {
            let now = self.clock.now().as_secs_f64();
            let mut state = self.lock();
            self.advance(&mut state, now);
            let woken = (!Self::lane_busy(&state, lane) && !wake.is_zero()).then(|| {
                let asleep = Demand {
                    threads: 0.0,
                    memory_bytes_per_second: 0.0,
                };
                Self::enqueue(&mut state, now, lane, (wake, asleep), "wake".into(), None)
            });
            let id = Self::enqueue(&mut state, now, lane, (solo, demand), label, bytes);
            (woken, id)
        };
        // The others' shares changed: they re-project their ends.
        self.changed.notify_waiters();
        let bus = Arc::clone(self);
        async move {
            if let Some(woken) = woken {
                bus.wait_for(woken).await;
            }
            bus.wait_for(id).await
        }
    }

    /// Whether an operation on `lane` has not ended yet.
    fn lane_busy(state: &BusState, lane: Lane) -> bool {
        state
            .operations
            .values()
            .any(|operation| operation.lane == lane && operation.ended.is_none())
    }

    /// Adds an operation of `solo` seconds alone on `lane`: running from `now` if the
    /// lane is idle, else queued behind the lane's others.
    fn enqueue(
        state: &mut BusState,
        now: f64,
        lane: Lane,
        (solo, demand): (Duration, Demand),
        label: String,
        bytes: Option<u64>,
    ) -> u64 {
        let id = state.next_id;
        state.next_id += 1;
        let lane_busy = Self::lane_busy(state, lane);
        state.operations.insert(
            id,
            Operation {
                lane,
                remaining: solo.as_secs_f64(),
                demand,
                label,
                bytes,
                started: (!lane_busy).then_some(now),
                ended: None,
            },
        );
        if lane_busy {
            state
                .queues
                .entry(lane_key(lane))
                .or_default()
                .push_back(id);
        }
        id
    }

    /// Waits until operation `id` has ended, re-projecting its end whenever another
    /// operation starts or ends.
    async fn wait_for(&self, id: u64) {
        // Bounded: every pass either ends the wait or follows a start or an end of
        // another operation, and each operation starts and ends once.
        loop {
            // Registered before the state is read, so a submit in between wakes it.
            let notified = self.changed.notified();
            let (end, done) = {
                let now = self.clock.now().as_secs_f64();
                let mut state = self.lock();
                self.advance(&mut state, now);
                match state
                    .operations
                    .get(&id)
                    .and_then(|operation| operation.ended)
                {
                    Some(ended) => (ended, true),
                    None => (self.projected_end(&state, id), false),
                }
            };
            if done {
                let finished = self.lock().operations.remove(&id);
                if let (Some(trace), Some(operation)) = (&self.trace, finished) {
                    if let Some(started) = operation.started {
                        trace.record(
                            operation.lane,
                            operation.label,
                            Duration::from_secs_f64(started),
                            Duration::from_secs_f64(end),
                            operation.bytes,
                        );
                    }
                }
                // Resume at the exact end, as a serial lane's waiter does.
                self.clock.wait_until(nanoseconds_up(end)).await;
                return;
            }
            tokio::select! {
                () = self.clock.wait_until(nanoseconds_up(end)) => {}
                () = notified => {}
            }
        }
    }

    /// The running operations (one per lane) and their shares.
    fn running_shares(&self, state: &BusState) -> Vec<(u64, f64)> {
        let running: Vec<(u64, Demand)> = state
            .operations
            .iter()
            .filter(|(_, operation)| operation.started.is_some() && operation.ended.is_none())
            .map(|(&id, operation)| (id, operation.demand))
            .collect();
        let demands: Vec<Demand> = running.iter().map(|(_, demand)| *demand).collect();
        let shares = self.spec.shares(&demands);
        running
            .iter()
            .zip(shares)
            .map(|((id, _), share)| (*id, share))
            .collect()
    }

    /// Brings every running operation's progress up to `now`, ending those that
    /// finish on the way (in time order, each end re-sharing the rest) and starting
    /// the next of their lane.
    fn advance(&self, state: &mut BusState, now: f64) {
        // Bounded: each pass ends at least one operation or reaches `now`.
        for _ in 0..=state.operations.len() + 1 {
            let from = state.updated;
            if now <= from {
                return;
            }
            let shares = self.running_shares(state);
            // The first running operation to finish at these shares, if before `now`.
            let first_end = shares
                .iter()
                .filter_map(|&(id, share)| {
                    let operation = state.operations.get(&id)?;
                    Some((from + operation.remaining / share, id))
                })
                .min_by(|a, b| a.0.total_cmp(&b.0));
            let until = match first_end {
                Some((end, _)) if end < now => end,
                _ => now,
            };
            for &(id, share) in &shares {
                if let Some(operation) = state.operations.get_mut(&id) {
                    operation.remaining = (operation.remaining - (until - from) * share).max(0.0);
                }
            }
            state.updated = until;
            let finished: Vec<u64> = shares
                .iter()
                .filter(|&&(id, share)| {
                    state
                        .operations
                        .get(&id)
                        // Within a nanosecond of its end (the clock's resolution).
                        .is_some_and(|operation| operation.remaining <= 1e-9 * share)
                })
                .map(|&(id, _)| id)
                .collect();
            for id in finished {
                let lane = match state.operations.get_mut(&id) {
                    Some(operation) => {
                        operation.ended = Some(until);
                        operation.lane
                    }
                    None => continue,
                };
                let next = state
                    .queues
                    .get_mut(&lane_key(lane))
                    .and_then(VecDeque::pop_front);
                if let Some(next) = next.and_then(|next| state.operations.get_mut(&next)) {
                    next.started = Some(until);
                }
            }
            if until >= now {
                return;
            }
        }
    }

    /// When `id` ends if nothing else starts or ends first.
    fn projected_end(&self, state: &BusState, id: u64) -> f64 {
        let shares = self.running_shares(state);
        match shares.iter().find(|(running, _)| *running == id) {
            Some(&(_, share)) => {
                let remaining = state.operations.get(&id).map_or(0.0, |op| op.remaining);
                // The earliest other end re-shares; wake then to re-project.
                let others = shares
                    .iter()
                    .filter(|(other, _)| *other != id)
                    .filter_map(|&(other, share)| {
                        state
                            .operations
                            .get(&other)
                            .map(|op| state.updated + op.remaining / share)
                    })
                    .fold(f64::INFINITY, f64::min);
                (state.updated + remaining / share).min(others)
            }
            // Queued: wake when the lane's running operation may end.
            None => shares
                .iter()
                .filter_map(|&(other, share)| {
                    state
                        .operations
                        .get(&other)
                        .map(|op| state.updated + op.remaining / share)
                })
                .fold(f64::INFINITY, f64::min)
                .max(state.updated),
        }
    }
}

impl std::fmt::Debug for SharedBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBus")
            .field("spec", &self.spec)
            .finish()
    }
}
