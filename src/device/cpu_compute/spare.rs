//! Activation buffers handed back by dropped tensors and reused by the next ones.
//!
//! A step allocates and drops the same activation shapes layer after layer. Fresh
//! allocations of that size come from `mmap`: every page faults in and is cleared by
//! the kernel once per layer (4–5 % of an encoder batch's samples on the 2-core VM).
//! Dropped buffers are kept on their thread instead — tensors are made and dropped on
//! the compute thread — and the next tensor takes the smallest one that holds it.
//! Bounded: at most [`SPARE_BUFFERS`] buffers of at most [`SPARE_BYTES_MAX`] in all
//! per thread; a buffer that would pass either is freed as before.

use std::cell::RefCell;

use crate::compute::{shapes, ComputeError};

/// Buffers kept per thread, at most.
const SPARE_BUFFERS: usize = 16;

/// Bytes kept per thread, at most (a 1B decoder's largest activation of a 265-token
/// prefill is 8.7 MB; a VAE decode's at 256² is 64 MiB, at 1024² 1 GiB). The buffers
/// were live activations once; the compute that made them frees them when it is
/// dropped ([`release`]).
const SPARE_BYTES_MAX: usize = 512 << 20;

thread_local! {
    static SPARE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A zeroed activation of `rows × cols`: a kept buffer when one holds it, else a new
/// allocation (refused with a clear error when host memory cannot hold it).
pub(super) fn allocate(rows: usize, cols: usize) -> Result<Vec<f32>, ComputeError> {
    let count = shapes::elements(rows, cols)?;
    let mut data = match take(count) {
        Some(data) => data,
        None => {
            let mut data = Vec::new();
            data.try_reserve_exact(count).map_err(|_| {
                ComputeError::OutOfMemory(format!(
                    "an activation of {rows} × {cols} f32 does not fit in host memory; lower --batch"
                ))
            })?;
            data
        }
    };
    data.resize(count, 0.0);
    Ok(data)
}

/// A kept buffer that holds `count` floats (the smallest such), emptied; `None` when
/// no kept buffer is large enough.
fn take(count: usize) -> Option<Vec<f32>> {
    SPARE
        .try_with(|spare| {
            let mut spare = spare.borrow_mut();
            let best = spare
                .iter()
                .enumerate()
                .filter(|(_, buffer)| buffer.capacity() >= count)
                .min_by_key(|(_, buffer)| buffer.capacity())
                .map(|(index, _)| index)?;
            let mut buffer = spare.swap_remove(best);
            buffer.clear();
            Some(buffer)
        })
        .ok()
        .flatten()
}

/// Keeps `buffer` for a later [`take`] when the bounds allow; frees it otherwise.
pub(super) fn give(buffer: Vec<f32>) {
    if buffer.capacity() == 0 {
        return;
    }
    // During thread teardown the store may be gone: the buffer is then just freed.
    let _ = SPARE.try_with(|spare| {
        let mut spare = spare.borrow_mut();
        let kept: usize = spare.iter().map(|kept| kept.capacity() * 4).sum();
        if spare.len() < SPARE_BUFFERS && kept + buffer.capacity() * 4 <= SPARE_BYTES_MAX {
            spare.push(buffer);
        }
    });
}

/// The activation buffers a compute's thread kept for reuse go with it.
impl Drop for super::CpuCompute {
    fn drop(&mut self) {
        release();
    }
}

/// Frees every buffer kept on this thread (a compute is done with them).
fn release() {
    let _ = SPARE.try_with(|spare| spare.borrow_mut().clear());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_is_reused_by_the_smallest_fit_and_the_store_is_bounded() {
        // Proves `take` returns the smallest kept buffer that holds the request,
        // emptied, none when nothing fits, and `give` stops at its bounds.
        std::thread::spawn(|| {
            give(Vec::with_capacity(1000));
            give(Vec::with_capacity(100));
            let reused = take(50).expect("a kept buffer");
            assert_eq!((reused.capacity(), reused.len()), (100, 0));
            assert!(take(5000).is_none());
            assert_eq!(take(1000).map(|buffer| buffer.capacity()), Some(1000));
            give(Vec::with_capacity(SPARE_BYTES_MAX / 4 + 1));
            assert!(
                take(1).is_none(),
                "a buffer past the byte bound is not kept"
            );
            for _ in 0..SPARE_BUFFERS + 4 {
                give(Vec::with_capacity(10));
            }
            let kept = std::iter::from_fn(|| take(1)).count();
            assert_eq!(kept, SPARE_BUFFERS);
        })
        .join()
        .expect("the test thread");
    }
}
