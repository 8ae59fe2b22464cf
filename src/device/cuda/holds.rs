//! Blocks the CUDA driver loop holds until the compute that reads them has completed.
//!
//! A plain state machine over a completion it can poll or wait for (a CUDA event in
//! the run, a flag in the tests) and a release callback (the session's release), so the
//! rules that keep a slot from being overwritten under a kernel, and that free streamed
//! slots in time for the next copy, are tested without a GPU.

use std::collections::VecDeque;
use std::sync::Arc;

use stagehand_actors::BlockHandle;

use super::error::CudaError;
use super::events::Event;

/// Something that completes once the compute queued before it has.
pub trait Completion {
    /// True once complete; never blocks.
    fn is_done(&self) -> Result<bool, CudaError>;
    /// Blocks until complete.
    fn wait(&self) -> Result<(), CudaError>;
}

impl Completion for Arc<Event> {
    fn is_done(&self) -> Result<bool, CudaError> {
        self.query()
    }

    fn wait(&self) -> Result<(), CudaError> {
        self.synchronize()
    }
}

/// Held blocks in the order their compute was queued (one stream: they complete in
/// that order too).
pub struct Holds<C> {
    pending: VecDeque<(BlockHandle, C)>,
}

impl<C: Completion> Holds<C> {
    /// Room for `blocks` holds, the most one step can have.
    pub fn with_capacity(blocks: usize) -> Self {
        Self {
            pending: VecDeque::with_capacity(blocks),
        }
    }

    /// Keeps `handle` until `done` completes.
    pub fn push(&mut self, handle: BlockHandle, done: C) {
        self.pending.push_back((handle, done));
    }

    /// Releases, in order, every hold whose compute has completed; never blocks.
    pub fn release_finished(
        &mut self,
        release: &mut impl FnMut(BlockHandle),
    ) -> Result<(), CudaError> {
        while let Some((_, done)) = self.pending.front() {
            if !done.is_done()? {
                break;
            }
            if let Some((handle, _)) = self.pending.pop_front() {
                release(handle);
            }
        }
        Ok(())
    }

    /// Waits for the compute of the newest *streamed* hold other than the newest hold,
    /// then releases it and everything before it, so its ring slot is freed as soon
    /// as the GPU is done with it and the next copy starts under the compute of the
    /// block just queued. Without this the compute thread, which queues faster than the
    /// GPU computes, would run ahead and free slots only at its next miss, after the
    /// GPU had drained: copies would then follow compute instead of overlapping it.
    pub fn release_behind_newest(
        &mut self,
        release: &mut impl FnMut(BlockHandle),
    ) -> Result<(), CudaError> {
        let older = self.pending.len().saturating_sub(1);
        let newest_streamed = self
            .pending
            .iter()
            .take(older)
            .rposition(|(handle, _)| handle.streamed);
        if let Some(position) = newest_streamed {
            // One stream runs in order: once this completes, so has everything before.
            self.pending[position].1.wait()?;
            for _ in 0..=position {
                if let Some((handle, _)) = self.pending.pop_front() {
                    release(handle);
                }
            }
        }
        self.release_finished(release)
    }

    /// Waits for every held block's compute, then releases it. On a device error the
    /// handle is still released (a failed context runs nothing more on it) and the
    /// first error is returned.
    pub fn release_all(&mut self, release: &mut impl FnMut(BlockHandle)) -> Result<(), CudaError> {
        let mut first_error = None;
        while let Some((handle, done)) = self.pending.pop_front() {
            if let Err(error) = done.wait() {
                first_error.get_or_insert(error);
            }
            release(handle);
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use stagehand_actors::{BlockId, DevicePtr, ResidencyTable};

    use super::*;

    /// A completion the test finishes by hand; `wait` finishes it and is counted.
    #[derive(Clone)]
    struct Flag {
        done: Rc<Cell<bool>>,
        waits: Rc<Cell<u32>>,
    }

    impl Completion for Flag {
        fn is_done(&self) -> Result<bool, CudaError> {
            Ok(self.done.get())
        }

        fn wait(&self) -> Result<(), CudaError> {
            self.waits.set(self.waits.get() + 1);
            self.done.set(true);
            Ok(())
        }
    }

    /// A real hold on `block` (handles are only made by a residency table); the
    /// table is leaked so the handle can outlive this call, as a session's would.
    fn handle(block: u32, streamed: bool) -> BlockHandle {
        let table: &'static ResidencyTable = Box::leak(Box::new(ResidencyTable::new([64; 4])));
        table.publish_ready(
            BlockId(block),
            DevicePtr(0x1000 * u64::from(block + 1)),
            streamed,
        );
        table
            .try_acquire(BlockId(block))
            .expect("a published block can be acquired")
    }

    fn flag() -> Flag {
        Flag {
            done: Rc::new(Cell::new(false)),
            waits: Rc::new(Cell::new(0)),
        }
    }

    #[test]
    fn nothing_is_released_before_its_compute_completes() {
        // Proves a poll releases only completed holds, in queue order, and stops at the
        // first one still running even if a later one reads as done.
        let (first, second, third) = (flag(), flag(), flag());
        let mut holds = Holds::with_capacity(3);
        holds.push(handle(0, false), first.clone());
        holds.push(handle(1, false), second.clone());
        holds.push(handle(2, false), third.clone());
        let mut released = Vec::new();
        holds
            .release_finished(&mut |h| released.push(h.block.0))
            .unwrap();
        assert!(released.is_empty());
        first.done.set(true);
        third.done.set(true);
        holds
            .release_finished(&mut |h| released.push(h.block.0))
            .unwrap();
        assert_eq!(released, vec![0]);
        assert_eq!(holds.pending.len(), 2);
    }

    #[test]
    fn a_streamed_hold_is_waited_for_once_the_next_block_is_queued() {
        // Proves the thread waits for an older streamed block (freeing its slot for the
        // next copy) but never for the block it just queued, and releases the resident
        // holds before it too.
        let flags: Vec<Flag> = (0..3).map(|_| flag()).collect();
        let mut holds = Holds::with_capacity(3);
        let mut released = Vec::new();
        holds.push(handle(0, false), flags[0].clone());
        holds.push(handle(1, true), flags[1].clone());
        holds
            .release_behind_newest(&mut |h| released.push(h.block.0))
            .unwrap();
        assert!(released.is_empty(), "the newest hold is never waited for");
        assert_eq!(flags[1].waits.get(), 0);
        holds.push(handle(2, false), flags[2].clone());
        holds
            .release_behind_newest(&mut |h| released.push(h.block.0))
            .unwrap();
        assert_eq!(released, vec![0, 1]);
        assert_eq!(flags[1].waits.get(), 1);
        assert_eq!(
            flags[0].waits.get(),
            0,
            "in-order stream: one wait covers both"
        );
        assert_eq!(holds.pending.len(), 1);
    }

    #[test]
    fn resident_holds_alone_never_block_the_thread() {
        // Proves a run of resident blocks is never waited for: the thread keeps
        // queueing while the GPU computes.
        let flags: Vec<Flag> = (0..4).map(|_| flag()).collect();
        let mut holds = Holds::with_capacity(4);
        for (index, flag) in flags.iter().enumerate() {
            holds.push(handle(index as u32, false), flag.clone());
            holds.release_behind_newest(&mut |_| {}).unwrap();
        }
        assert!(flags.iter().all(|flag| flag.waits.get() == 0));
        assert_eq!(holds.pending.len(), 4);
    }

    #[test]
    fn release_all_waits_for_and_releases_everything() {
        // Proves the end of a step (or a miss) leaves no hold behind.
        let flags: Vec<Flag> = (0..3).map(|_| flag()).collect();
        let mut holds = Holds::with_capacity(3);
        for (index, flag) in flags.iter().enumerate() {
            holds.push(handle(index as u32, index == 1), flag.clone());
        }
        let mut released = Vec::new();
        holds
            .release_all(&mut |h| released.push(h.block.0))
            .unwrap();
        assert_eq!(released, vec![0, 1, 2]);
        assert!(holds.pending.is_empty());
        assert!(flags.iter().all(|flag| flag.done.get()));
    }
}
