//! Copies into the device tier through the `Device` port a run would use: from a
//! buffer the device pinned and from plain (pageable) host memory, and the fixed cost
//! of one small copy (on the CPU backend: handing the job to the copy thread and the
//! completion back).

use std::sync::Arc;
use std::time::Instant;

use stagehand_actors::{Device, HostBuffer};

use super::{median, Measured};

/// Bytes of one latency probe: small enough that its transfer time is noise.
const LATENCY_PROBE_BYTES: u64 = 4096;
/// Latency probes per measurement.
const LATENCY_PROBES: usize = 64;

/// What the copy measurements found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CopyFigures {
    pub pinned: Measured,
    pub pageable: Measured,
    /// Seconds of one 4 KiB copy, issue to completion (median).
    pub latency_seconds: f64,
    pub latency_how: String,
    /// How fast fresh device-tier memory is faulted in on its first write (bytes/s
    /// of the time a copy into fresh pages takes beyond the same copy into warm
    /// ones); `None` when fresh pages cost nothing measurable (memory mapped when
    /// allocated, as a GPU's).
    pub first_touch: Option<Measured>,
}

/// Chunks copied into a fresh arena, then again into the same (now warm) places.
pub(super) const FIRST_TOUCH_CHUNKS: usize = 8;
/// A first copy this much slower than the warm one, or less, is "no cost": noise.
const FIRST_TOUCH_NOISE: f64 = 0.03;
/// Fresh arenas timed; the figure is the fastest. On a VM that hands free memory back
/// to its host (free page reporting) a fresh page the host must back again costs
/// several times one the guest kept: one calibration here read 0.43 GB/s where three
/// minutes-apart others read 1.41–1.65, and the cold steps `validate` then ran
/// (40–49 ms) matched the fast figure (predicted 48–64 ms at 1.47 GB/s, 114–159 at 0.43).
const FIRST_TOUCH_ROUNDS: usize = 3;

/// Copies `block_bytes` into an arena `repeats` times from each kind of source.
pub fn measure_copies(
    device: &Arc<dyn Device>,
    block_bytes: u64,
    repeats: usize,
) -> Result<CopyFigures, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| error.to_string())?;
    let arena = device
        .allocate_arena(block_bytes)
        .map_err(|error| format!("an arena of {block_bytes} bytes: {error}"))?;
    let copy = |buffer: HostBuffer, bytes: u64| -> Result<(HostBuffer, f64), String> {
        let started = Instant::now();
        let buffer = runtime
            .block_on(device.copy_to_device(buffer, 0, bytes, arena.base))
            .map_err(|(error, _)| error.to_string())?;
        Ok((buffer, started.elapsed().as_secs_f64()))
    };
    let rate = |mut buffer: HostBuffer, what: &str| -> Result<Measured, String> {
        if let Some(bytes) = buffer.as_mut_slice() {
            // Touch every page so the first copy does not pay for page faults.
            bytes.iter_mut().step_by(4096).for_each(|byte| *byte = 1);
        }
        let mut seconds = Vec::with_capacity(repeats);
        for round in 0..repeats + 1 {
            // The source comes from memory, as a run's does (a block pinned a step
            // or more ago, or read in by other threads): the same buffer copied
            // again would otherwise be read from the caches.
            if let Some(bytes) = buffer.as_slice() {
                crate::os::flush_from_caches(bytes);
            }
            let (returned, elapsed) = copy(buffer, block_bytes)?;
            buffer = returned;
            // The first copy warms the arena's pages and the copy thread.
            if round > 0 {
                seconds.push(elapsed);
            }
        }
        Ok(Measured::rate(
            block_bytes as f64,
            &seconds,
            format!(
                "{repeats} copies of {} from {what} into the device tier, one at a time, the source flushed from the CPU caches before each; median",
                stagehand_actors::Bytes(block_bytes)
            ),
        ))
    };
    let pinned_buffer = device
        .allocate_pinned(block_bytes)
        .map_err(|error| format!("a pinned buffer of {block_bytes} bytes: {error}"))?;
    let pinned = rate(pinned_buffer, "a buffer the device pinned")?;
    let pageable_buffer = HostBuffer::allocate(block_bytes as usize)
        .map_err(|error| format!("a host buffer of {block_bytes} bytes: {error}"))?;
    let pageable = rate(pageable_buffer, "plain (pageable) host memory")?;

    let mut probe = device
        .allocate_pinned(LATENCY_PROBE_BYTES)
        .map_err(|error| format!("a pinned probe buffer: {error}"))?;
    let mut latencies = Vec::with_capacity(LATENCY_PROBES);
    for _ in 0..LATENCY_PROBES {
        let (returned, elapsed) = copy(probe, LATENCY_PROBE_BYTES)?;
        probe = returned;
        latencies.push(elapsed);
    }
    device.free_arena(arena);
    let mut source = pinned_buffer_for(device, block_bytes)?;
    let mut rounds = Vec::with_capacity(FIRST_TOUCH_ROUNDS);
    for _ in 0..FIRST_TOUCH_ROUNDS {
        let (returned, round) = first_touch_round(device, &runtime, block_bytes, source)?;
        source = returned;
        rounds.push(round);
    }
    let first_touch = first_touch_of(&rounds, block_bytes);
    Ok(CopyFigures {
        first_touch,
        pinned,
        pageable,
        latency_seconds: median(&latencies),
        latency_how: format!(
            "{LATENCY_PROBES} copies of 4 KiB, issue to completion; median (includes the hand-off to the copy stream and back)"
        ),
    })
}

/// A pinned source buffer of `bytes` with every page already touched.
fn pinned_buffer_for(device: &Arc<dyn Device>, bytes: u64) -> Result<HostBuffer, String> {
    let mut buffer = device
        .allocate_pinned(bytes)
        .map_err(|error| format!("a pinned buffer of {bytes} bytes: {error}"))?;
    if let Some(slice) = buffer.as_mut_slice() {
        slice.iter_mut().step_by(4096).for_each(|byte| *byte = 1);
    }
    Ok(buffer)
}

/// One first-touch round: [`FIRST_TOUCH_CHUNKS`] copies of `chunk_bytes` from a warm
/// pinned buffer into a freshly allocated arena, each into places never written
/// (every page faulted in by the copy), then the same copies into the same places
/// again (warm); returns the source and the (fresh, warm) medians in seconds.
fn first_touch_round(
    device: &Arc<dyn Device>,
    runtime: &tokio::runtime::Runtime,
    chunk_bytes: u64,
    mut source: HostBuffer,
) -> Result<(HostBuffer, (f64, f64)), String> {
    let span = chunk_bytes * FIRST_TOUCH_CHUNKS as u64;
    let arena = device
        .allocate_arena(span)
        .map_err(|error| format!("a fresh arena of {span} bytes: {error}"))?;
    // Pass 0 writes fresh places, pass 1 the same places warm.
    let mut passes = [Vec::new(), Vec::new()];
    for seconds in &mut passes {
        for chunk in 0..FIRST_TOUCH_CHUNKS as u64 {
            let destination = arena.base.offset(chunk * chunk_bytes);
            let started = Instant::now();
            match runtime.block_on(device.copy_to_device(source, 0, chunk_bytes, destination)) {
                Ok(returned) => source = returned,
                Err((error, _)) => {
                    device.free_arena(arena);
                    return Err(format!("first-touch copies: {error}"));
                }
            }
            seconds.push(started.elapsed().as_secs_f64());
        }
    }
    device.free_arena(arena);
    Ok((source, (median(&passes[0]), median(&passes[1]))))
}

/// The first-touch rate from the rounds' (fresh, warm) medians: the extra seconds per
/// byte of the fresh copies, in the fastest round (see [`FIRST_TOUCH_ROUNDS`]); what a
/// run's first step pays for every byte of arena, pinned buffer and cast buffer it
/// writes for the first time. `None` when fresh pages cost nothing measurable.
fn first_touch_of(rounds: &[(f64, f64)], chunk_bytes: u64) -> Option<Measured> {
    let &(fresh, warm) = rounds
        .iter()
        .min_by(|a, b| (a.0 - a.1).total_cmp(&(b.0 - b.1)))?;
    let extra = fresh - warm;
    if !(extra.is_finite() && extra > warm * FIRST_TOUCH_NOISE) {
        return None;
    }
    let each: Vec<String> = rounds
        .iter()
        .map(|&(fresh, warm)| format!("{:.2}", chunk_bytes as f64 / (fresh - warm) / 1e9))
        .collect();
    Some(Measured::rate(
        chunk_bytes as f64,
        &[extra],
        format!(
            "{FIRST_TOUCH_CHUNKS} copies of {} into a freshly allocated arena ({:.2} ms each, median) against the same copies into the now warm places ({:.2} ms): the extra time per byte is the page faults; the fastest of {} fresh arenas (GB/s: {})",
            stagehand_actors::Bytes(chunk_bytes),
            fresh * 1e3,
            warm * 1e3,
            rounds.len(),
            each.join(", ")
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::first_touch_of;

    #[test]
    fn first_touch_is_the_fastest_rounds_and_none_without_a_cost() {
        // 16 MiB chunks: rounds whose fresh copies took 40, 10 and 12 ms against 1 ms
        // warm; the fastest round's 9 ms of faults give the rate.
        let chunk = 16u64 << 20;
        let rounds = [(0.040, 0.001), (0.010, 0.001), (0.012, 0.001)];
        let measured = first_touch_of(&rounds, chunk).unwrap();
        assert!((measured.per_second - chunk as f64 / 0.009).abs() < 1.0);
        assert!(measured.how.contains("fastest of 3"), "{}", measured.how);
        // Fresh copies within the noise of warm ones: no first-touch cost.
        assert!(first_touch_of(&[(0.00101, 0.001)], chunk).is_none());
    }
}
