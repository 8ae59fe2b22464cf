//! The compute thread pool: the compute thread plus `threads − 1` workers that run one
//! job at a time, each on the part the job's fixed split gives its index.
//!
//! Why not rayon or a channel: on this kind of VM waking a parked thread costs ~50 µs
//! (STACK.md), and a decode step runs ~110 products of ~100–500 µs each. So the
//! caller runs part 0 itself, workers spin on a generation counter for a while after
//! each job (a hand-off is then one cache line, well under a microsecond) and park
//! only when no job came for [`SPIN_ROUNDS`]; the caller spins for completion.
//! Which part a thread runs is its index — never who got there first — so the work a
//! thread does is fixed by the job's shape and the thread count alone.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// Below this many elements [`Pool::split`] runs on the calling thread alone: the
/// hand-off would cost more than the second core saves.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;

/// Spin-loop rounds a worker waits for the next job before it parks: a few tens of
/// microseconds, longer than the gap between two products of a step, shorter than
/// the wait for a streamed block.
const SPIN_ROUNDS: u32 = 20_000;

/// A job: called once per thread index `0..threads`.
type Job<'a> = dyn Fn(usize) + Sync + 'a;

/// What the caller and the workers share.
struct Shared {
    /// Bumped once per job; a worker runs a job when it sees a generation it has not.
    generation: AtomicU64,
    /// The current job, lifetime erased: valid from the generation bump until
    /// `remaining` reaches 0 (see [`Pool::run`]).
    job: Mutex<Option<JobPointer>>,
    /// Workers that have not finished the current job.
    remaining: AtomicUsize,
    /// Workers parked on `wake` (they registered under `parking`).
    parked: AtomicUsize,
    parking: Mutex<()>,
    wake: Condvar,
    quit: AtomicBool,
    /// A worker's part of the current job panicked.
    panicked: AtomicBool,
}

/// A job reference whose lifetime [`Pool::run`] guarantees by waiting.
#[derive(Clone, Copy)]
struct JobPointer(*const Job<'static>);

// SAFETY: the pointee is `Sync` (a `Job` is `Fn + Sync`) and `Pool::run` keeps it
// alive until every worker is done with it.
unsafe impl Send for JobPointer {}

/// The pool. Owned by one `CpuCompute`; not `Sync` (one job at a time, from its owner).
pub(super) struct Pool {
    threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` threads in all (the caller counts as one; `0` is taken as 1).
    /// A worker that cannot be spawned leaves a smaller pool, which computes the same
    /// bits (every split is fixed by shape, see the module docs of the kernels).
    pub(super) fn new(threads: usize) -> Self {
        let shared = Arc::new(Shared {
            generation: AtomicU64::new(0),
            job: Mutex::new(None),
            remaining: AtomicUsize::new(0),
            parked: AtomicUsize::new(0),
            parking: Mutex::new(()),
            wake: Condvar::new(),
            quit: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
        });
        let mut workers = Vec::new();
        for index in 1..threads.max(1) {
            let worker_shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("stagehand-compute-{index}"))
                .spawn(move || work(&worker_shared, index));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(error) => {
                    tracing::warn!(
                        "compute worker {index} could not start ({error}); using {index} threads"
                    );
                    break;
                }
            }
        }
        Self {
            threads: workers.len() + 1,
            shared,
            workers,
        }
    }

    /// Threads that run a job, the caller included.
    pub(super) fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `job(index)` for every `index` in `0..threads()`, the caller taking 0,
    /// and returns when all have returned. A panic in any part is raised here.
    pub(super) fn run(&self, job: &Job<'_>) {
        if self.threads == 1 {
            job(0);
            return;
        }
        let shared = &*self.shared;
        // SAFETY: only the lifetime is erased. The pointer is published below and
        // this function does not return before `remaining` is 0, i.e. before every
        // worker has finished calling it, so it never outlives `job`.
        let erased = unsafe { std::mem::transmute::<*const Job<'_>, *const Job<'static>>(job) };
        *lock(&shared.job) = Some(JobPointer(erased));
        shared.remaining.store(self.threads - 1, Ordering::SeqCst);
        shared.generation.fetch_add(1, Ordering::SeqCst);
        if shared.parked.load(Ordering::SeqCst) > 0 {
            let _guard = lock(&shared.parking);
            shared.wake.notify_all();
        }
        let caller = catch_unwind(AssertUnwindSafe(|| job(0)));
        let mut rounds = 0u32;
        while shared.remaining.load(Ordering::Acquire) != 0 {
            rounds = rounds.saturating_add(1);
            if rounds < SPIN_ROUNDS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *lock(&shared.job) = None;
        if let Err(payload) = caller {
            std::panic::resume_unwind(payload);
        }
        if shared.panicked.swap(false, Ordering::SeqCst) {
            panic!("a compute worker panicked (see the message above)");
        }
    }

    /// Runs `work(part, first)` on contiguous parts of `data`, one a thread, each a
    /// multiple of `granule` elements long (a row, or a vector's lanes) but the last;
    /// `first` is where the part starts in `data`. A part's bounds follow from the
    /// length and the thread count alone, so an element-wise or row-wise `work`
    /// writes the same bits however `data` is split.
    pub(super) fn split(
        &self,
        data: &mut [f32],
        granule: usize,
        work: &(dyn Fn(&mut [f32], usize) + Sync),
    ) {
        let length = data.len();
        let parts = if length < PARALLEL_MIN_ELEMENTS {
            1
        } else {
            self.threads()
        };
        if parts == 1 {
            work(data, 0);
            return;
        }
        let output = SharedOut::new(data);
        self.run(&|index| {
            let (first, end) = share(length, parts, index, granule);
            if first < end {
                // SAFETY: `share` gives disjoint ranges inside `data`, which outlives
                // the job.
                work(unsafe { output.range(first, end - first) }, first);
            }
        });
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.quit.store(true, Ordering::SeqCst);
        self.shared.generation.fetch_add(1, Ordering::SeqCst);
        {
            let _guard = lock(&self.shared.parking);
            self.shared.wake.notify_all();
        }
        for worker in self.workers.drain(..) {
            // A worker that panicked has already reported it through `run`.
            let _ = worker.join();
        }
    }
}

/// Locks a mutex whose data stays valid even if a holder panicked (a job pointer, a
/// unit): poisoning carries no meaning here.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A worker's loop: wait for a generation it has not run, run its part, report.
fn work(shared: &Shared, index: usize) {
    let mut seen = 0u64;
    loop {
        seen = wait_for_job(shared, seen);
        if shared.quit.load(Ordering::SeqCst) {
            return;
        }
        let job = *lock(&shared.job);
        if let Some(JobPointer(job)) = job {
            // SAFETY: `Pool::run` published this pointer before the generation we
            // saw and keeps the job alive until `remaining` reaches 0 below.
            let job = unsafe { &*job };
            if catch_unwind(AssertUnwindSafe(|| job(index))).is_err() {
                shared.panicked.store(true, Ordering::SeqCst);
            }
        }
        shared.remaining.fetch_sub(1, Ordering::Release);
    }
}

/// Spins, then parks, until the generation differs from `seen`; returns the new one.
fn wait_for_job(shared: &Shared, seen: u64) -> u64 {
    for _ in 0..SPIN_ROUNDS {
        let now = shared.generation.load(Ordering::Acquire);
        if now != seen {
            return now;
        }
        std::hint::spin_loop();
    }
    let mut guard = lock(&shared.parking);
    // Registering before the re-check pairs with `run`'s bump-then-check (both
    // SeqCst): either `run` sees us parked and notifies under the lock, or we see its
    // new generation here and never wait.
    shared.parked.fetch_add(1, Ordering::SeqCst);
    loop {
        let now = shared.generation.load(Ordering::SeqCst);
        if now != seen {
            shared.parked.fetch_sub(1, Ordering::SeqCst);
            return now;
        }
        guard = shared
            .wake
            .wait(guard)
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

/// A pointer to an output that the parts of a job write in disjoint ranges.
#[derive(Clone, Copy)]
pub(super) struct SharedOut(*mut f32, usize);

// SAFETY: used only to hand disjoint ranges of one slice to the parts of a job (each
// `range` caller guarantees disjointness); the slice outlives the job.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub(super) fn new(out: &mut [f32]) -> Self {
        Self(out.as_mut_ptr(), out.len())
    }

    /// `out[start .. start + length]`.
    ///
    /// # Safety
    /// The range must lie inside the slice this was made from, that slice must outlive
    /// the returned borrow, and no two live borrows (from any thread) may overlap.
    pub(super) unsafe fn range<'a>(self, start: usize, length: usize) -> &'a mut [f32] {
        assert!(
            start + length <= self.1,
            "a part's output range is inside the output"
        );
        // SAFETY: inside the slice (asserted); disjointness and lifetime are the
        // caller's contract above.
        unsafe { std::slice::from_raw_parts_mut(self.0.add(start), length) }
    }

    /// The base pointer, for kernels that write strided views (a column block of a
    /// row-major output).
    pub(super) fn pointer(&self) -> *mut f32 {
        self.0
    }

    pub(super) fn len(&self) -> usize {
        self.1
    }
}

/// The `index`-th of `parts` equal shares of `0..total`, rounded to multiples of
/// `granule` (the last share takes the rest).
pub(super) fn share(total: usize, parts: usize, index: usize, granule: usize) -> (usize, usize) {
    let granules = total.div_ceil(granule.max(1));
    let start = (granules * index / parts.max(1)) * granule;
    let end = ((granules * (index + 1) / parts.max(1)) * granule).min(total);
    (start.min(total), end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_per_job_and_panics_reach_the_caller() {
        // Proves each thread index runs exactly once per job, over many jobs (spinning
        // and parked workers alike), and a worker's panic is raised in the caller.
        let pool = Pool::new(3);
        assert_eq!(pool.threads(), 3);
        let counts: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        for round in 0..200 {
            pool.run(&|index| {
                counts[index].fetch_add(1, Ordering::Relaxed);
            });
            if round == 100 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
        assert!(counts
            .iter()
            .all(|count| count.load(Ordering::Relaxed) == 200));
        let caught = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|index| assert_ne!(index, 2, "worker 2 fails"));
        }));
        assert!(caught.is_err());
        pool.run(&|index| {
            counts[index].fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(
            counts[2].load(Ordering::Relaxed),
            201,
            "the pool still works"
        );
    }

    #[test]
    fn shares_cover_the_range_in_granules() {
        // Proves the shares are disjoint, in order, cover 0..total and start on granules.
        for (total, parts, granule) in [(10, 3, 4), (2048, 2, 4), (3, 4, 4), (0, 2, 1)] {
            let mut next = 0;
            for index in 0..parts {
                let (start, end) = share(total, parts, index, granule);
                assert_eq!(start, next);
                assert!(start % granule == 0 || start == total);
                next = end;
            }
            assert_eq!(next, total);
        }
    }
}
