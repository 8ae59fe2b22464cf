//! Exact virtual time on top of tokio's paused clock.
//!
//! tokio's timer wheel has millisecond ticks: on a paused runtime a `sleep_until` wakes
//! at the first whole millisecond at or after its deadline, and `Instant::now()` then
//! reads that rounded tick. A 300 MB block copied in 12.3 ms would be seen finishing at
//! 13 ms, and a decode step made of microsecond kernels would be off a thousandfold.
//!
//! So the simulator keeps its own exact timeline. Every timed operation knows its exact
//! end; the task that awaited it resumes in tokio's rounded tick, and [`SimClock::now`]
//! reports the exact end of the completion being handled in that tick. Anything issued
//! in response starts at the exact causal time, so rounding never accumulates.
//!
//! That causal time is one for the whole runtime: when two completions land in the
//! same tick, a task reacting to the first (a compute waiting for its block, woken
//! through the allocator's reply) may read the second's end. So tokio's clock runs
//! [`TOKIO_SLOWDOWN`] times slower than the virtual timeline: one tick is 1 µs of
//! virtual time, and only completions less than 1 µs apart share one. Measured: a tiny
//! decoder's 0.4 ms step of 67 µs kernels and 87 µs copies, where every compute
//! resumed at the end of the copy two blocks later and the step read 0.949 ms (a run
//! measured 0.41 ms); 0.379 ms with the slower tick. Between completions (e.g. an
//! actor's own timer) `now` falls back to tokio's clock, exact on whole ticks.
//!
//! Anything that waits on tokio's clock directly inside the simulator (a test's
//! timeout, an injected delay) converts its virtual duration with [`tokio_duration`].

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::SimError;

/// How many times slower tokio's paused clock runs than the virtual timeline (see the
/// module documentation): its 1 ms tick is 1 µs of virtual time. A month of virtual
/// time is 82 years of tokio's, which its timer wheel still schedules to the tick (a
/// test below).
pub const TOKIO_SLOWDOWN: u32 = 1000;

/// `virtual_time` on tokio's paused clock inside the simulator (saturating).
pub fn tokio_duration(virtual_time: Duration) -> Duration {
    virtual_time
        .checked_mul(TOKIO_SLOWDOWN)
        .unwrap_or(Duration::MAX)
}

/// The exact timeline shared by the simulated device, disk and compute.
#[derive(Debug)]
pub struct SimClock {
    origin: Instant,
    causal: Mutex<CausalTime>,
}

#[derive(Debug, Clone, Copy, Default)]
struct CausalTime {
    /// Exact time of the completion being handled.
    exact: Duration,
    /// tokio's elapsed time when it was set: valid only while tokio is still there.
    tick: Duration,
}

impl SimClock {
    /// A clock whose zero is now. Must be created inside the simulator's runtime
    /// (see [`super::virtual_time_runtime`]), because its origin is that runtime's clock.
    pub fn new() -> Result<Arc<Self>, SimError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(SimError::NoRuntime);
        }
        Ok(Arc::new(Self {
            origin: Instant::now(),
            causal: Mutex::new(CausalTime::default()),
        }))
    }

    /// Exact virtual time since the clock was created.
    pub fn now(&self) -> Duration {
        let elapsed = self.tokio_elapsed();
        let causal = *self.lock();
        if causal.tick == elapsed {
            causal.exact.min(elapsed)
        } else {
            elapsed
        }
    }

    /// Waits until the exact virtual time `end`, then makes it the causal time of the
    /// waiting task. If the task only started waiting after `end` (it awaited late),
    /// it resumes at the time it started waiting: an operation that finished long ago
    /// does not send its waiter back in time.
    pub async fn wait_until(&self, end: Duration) {
        let waiting_from = self.now();
        match self.origin.checked_add(tokio_duration(end)) {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            // Past any instant the platform represents: it never comes.
            None => std::future::pending().await,
        }
        let resumed_at = end.max(waiting_from);
        let tick = self.tokio_elapsed();
        *self.lock() = CausalTime {
            exact: resumed_at.min(tick),
            tick,
        };
    }

    fn tokio_elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin) / TOKIO_SLOWDOWN
    }

    fn lock(&self) -> MutexGuard<'_, CausalTime> {
        // The guarded value is two durations: a panic elsewhere cannot leave it torn.
        self.causal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A resource that serves one operation at a time: a copy engine, a disk, a compute
/// stream. Operations queue behind each other in the order they were issued.
#[derive(Debug, Default)]
pub struct SerialLane {
    busy_until: Mutex<Duration>,
}

impl SerialLane {
    /// Books `duration` on the lane for an operation issued at `now`:
    /// returns its exact (start, end).
    pub fn book(&self, now: Duration, duration: Duration) -> (Duration, Duration) {
        let mut busy_until = self
            .busy_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let start = now.max(*busy_until);
        let end = start + duration;
        *busy_until = end;
        (start, end)
    }

    /// When the lane's last booked operation ends.
    pub fn busy_until(&self) -> Duration {
        *self
            .busy_until
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// `bytes` at `bytes_per_second`, exact to the nanosecond (integer arithmetic, so
/// 10 GB at 25 GB/s is exactly 0.4 s).
pub fn transfer_duration(bytes: u64, bytes_per_second: u64) -> Duration {
    if bytes_per_second == 0 {
        return Duration::MAX;
    }
    let nanos = (u128::from(bytes) * 1_000_000_000).div_ceil(u128::from(bytes_per_second));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_durations_are_exact() {
        assert_eq!(
            transfer_duration(10_000_000_000, 25_000_000_000),
            Duration::from_millis(400)
        );
        assert_eq!(transfer_duration(1, 3), Duration::from_nanos(333_333_334));
        assert_eq!(transfer_duration(5, 0), Duration::MAX);
    }

    #[test]
    fn completions_microseconds_apart_keep_their_own_causal_time() {
        // Proves a task woken by the first of two completions 200 µs apart (within
        // one of tokio's millisecond ticks) reads the first's time, not the second's:
        // what a compute resumed by its block's copy does while a later copy ends.
        let runtime = crate::sim::virtual_time_runtime().unwrap();
        let seen = runtime.block_on(async {
            let clock = SimClock::new().unwrap();
            let (sender, receiver) = tokio::sync::oneshot::channel();
            let reacting = tokio::spawn({
                let clock = Arc::clone(&clock);
                async move {
                    receiver.await.unwrap();
                    clock.now()
                }
            });
            let later = tokio::spawn({
                let clock = Arc::clone(&clock);
                async move { clock.wait_until(Duration::from_micros(300)).await }
            });
            clock.wait_until(Duration::from_micros(100)).await;
            sender.send(()).unwrap();
            let seen = reacting.await.unwrap();
            later.await.unwrap();
            seen
        });
        assert_eq!(seen, Duration::from_micros(100));
    }

    #[test]
    fn a_month_of_virtual_time_stays_exact() {
        let runtime = crate::sim::virtual_time_runtime().unwrap();
        let month = Duration::from_secs(30 * 24 * 3600) + Duration::from_nanos(7);
        let now = runtime.block_on(async {
            let clock = SimClock::new().unwrap();
            clock.wait_until(month).await;
            clock.now()
        });
        assert_eq!(now, month);
    }

    #[test]
    fn a_lane_queues_operations_in_issue_order() {
        let lane = SerialLane::default();
        let second = Duration::from_secs(1);
        assert_eq!(lane.book(Duration::ZERO, second), (Duration::ZERO, second));
        assert_eq!(lane.book(Duration::ZERO, second), (second, 2 * second));
        // Issued after the lane went idle: starts when issued.
        assert_eq!(lane.book(5 * second, second), (5 * second, 6 * second));
    }
}
