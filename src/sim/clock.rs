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
//! in response starts at the exact causal time, so rounding never accumulates. Between
//! completions (e.g. an actor's own timer) `now` falls back to tokio's clock, which is
//! exact on whole milliseconds. The residual error is below 1 ms and only where two
//! completions land in the same tick and one task's reaction is read by another.
//!
//! tokio's own time stays within 1 ms of the exact timeline, so actors' timers and
//! `Instant` measurements keep their meaning; only sub-millisecond precision needs this
//! clock.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::SimError;

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
        tokio::time::sleep_until(self.origin + end).await;
        let resumed_at = end.max(waiting_from);
        let tick = self.tokio_elapsed();
        *self.lock() = CausalTime {
            exact: resumed_at.min(tick),
            tick,
        };
    }

    fn tokio_elapsed(&self) -> Duration {
        Instant::now().saturating_duration_since(self.origin)
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
    fn a_lane_queues_operations_in_issue_order() {
        let lane = SerialLane::default();
        let second = Duration::from_secs(1);
        assert_eq!(lane.book(Duration::ZERO, second), (Duration::ZERO, second));
        assert_eq!(lane.book(Duration::ZERO, second), (second, 2 * second));
        // Issued after the lane went idle: starts when issued.
        assert_eq!(lane.book(5 * second, second), (5 * second, 6 * second));
    }
}
