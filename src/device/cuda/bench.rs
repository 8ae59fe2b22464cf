//! Link measurements for `stagehand bench --device cuda`, all in one process so their
//! ratios are comparable: (a) pinned host→device bandwidth of a plain copy loop, the
//! link's practical peak; (b) the same copies from pageable memory; (c) what
//! `cuMemHostRegister` (and unregistering) costs per GiB.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::sys;
use serde::Serialize;
use stagehand_actors::{Device, DeviceArena, HostBuffer};

use super::device::CudaDevice;
use super::error::CudaError;
use super::pinned::register_buffer;

const GIB: f64 = (1u64 << 30) as f64;
/// Smallest copy measured: below this, launch overhead dominates the link.
pub const LINK_COPY_BYTES_MIN: u64 = 1 << 20;
/// Bytes each loop moves in total, so the figure does not rest on one copy.
const LOOP_TARGET_BYTES: u64 = 4 << 30;
/// Bounds on copies per loop: at least a few to average, at most enough to keep a
/// small buffer's loop short.
const LOOP_COPIES_MIN: u64 = 3;
const LOOP_COPIES_MAX: u64 = 256;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkFigures {
    /// "cuda:0 (NVIDIA H200)".
    pub device: String,
    /// Size of each copy.
    pub copy_bytes: u64,
    /// Copies per measured loop (after one warm-up copy).
    pub copies_per_loop: u64,
    /// (a) Pinned H2D: the link's peak for this process.
    pub pinned_h2d_bytes_per_second: f64,
    /// (b) Pageable H2D from the same (unregistered) buffer.
    pub pageable_h2d_bytes_per_second: f64,
    /// (b) / (a).
    pub pageable_over_pinned: f64,
    /// (c) `cuMemHostRegister` of already-touched memory, seconds per GiB.
    pub register_seconds_per_gib: f64,
    /// (c) `cuMemHostUnregister`, seconds per GiB.
    pub unregister_seconds_per_gib: f64,
}

impl LinkFigures {
    /// A Markdown table for BENCHMARKS.md and the GPU check's report.
    pub fn to_markdown(&self) -> String {
        let gb_per_second = |bytes_per_second: f64| bytes_per_second / 1e9;
        format!(
            "| link figure ({device}, {copy_mib} MiB copies × {copies}) | value |\n\
             |---|---|\n\
             | (a) pinned H2D | {pinned:.2} GB/s |\n\
             | (b) pageable H2D | {pageable:.2} GB/s ({ratio:.0} % of pinned) |\n\
             | (c) cuMemHostRegister | {register:.3} s/GiB |\n\
             | (c) cuMemHostUnregister | {unregister:.3} s/GiB |\n",
            device = self.device,
            copy_mib = self.copy_bytes >> 20,
            copies = self.copies_per_loop,
            pinned = gb_per_second(self.pinned_h2d_bytes_per_second),
            pageable = gb_per_second(self.pageable_h2d_bytes_per_second),
            ratio = self.pageable_over_pinned * 100.0,
            register = self.register_seconds_per_gib,
            unregister = self.unregister_seconds_per_gib,
        )
    }
}

/// Measures (a)–(c) with copies of `bytes` (rounded down to whole pages, at least
/// [`LINK_COPY_BYTES_MIN`]). Needs `bytes` of free VRAM and of host RAM.
pub fn link_figures(device: &CudaDevice, bytes: u64) -> Result<LinkFigures, CudaError> {
    let page_bytes = stagehand_actors::HOST_BUFFER_ALIGN as u64;
    let copy_bytes = bytes / page_bytes * page_bytes;
    if copy_bytes < LINK_COPY_BYTES_MIN {
        return Err(CudaError::InvalidArgument(format!(
            "link copies of {bytes} bytes are too small to measure the link; use at least \
             {LINK_COPY_BYTES_MIN}"
        )));
    }
    let len = usize::try_from(copy_bytes).map_err(|_| {
        CudaError::InvalidArgument(format!("{copy_bytes} bytes do not fit in memory"))
    })?;
    let copies = (LOOP_TARGET_BYTES / copy_bytes).clamp(LOOP_COPIES_MIN, LOOP_COPIES_MAX);

    let mut host = HostBuffer::allocate(len)?;
    // Touch every page first, so (c) times pinning alone and (b) reads real pages,
    // not the shared zero page a fresh allocation maps.
    if let Some(slice) = host.as_mut_slice() {
        for (index, byte) in slice.iter_mut().enumerate().step_by(512) {
            *byte = index as u8;
        }
    }
    let arena = device
        .allocate_arena(copy_bytes)
        .map_err(|error| CudaError::InvalidArgument(format!("link benchmark arena: {error}")))?;
    let result = measure(device, &mut host, &arena, copies);
    device.free_arena(arena);
    let measured = result?;
    let gib = copy_bytes as f64 / GIB;
    let moved_bytes = (copy_bytes * copies) as f64;
    let pinned = moved_bytes / measured.pinned_seconds;
    let pageable = moved_bytes / measured.pageable_seconds;
    Ok(LinkFigures {
        device: format!("{} ({})", device.name(), device.device_name()),
        copy_bytes,
        copies_per_loop: copies,
        pinned_h2d_bytes_per_second: pinned,
        pageable_h2d_bytes_per_second: pageable,
        pageable_over_pinned: pageable / pinned,
        register_seconds_per_gib: measured.register_seconds / gib,
        unregister_seconds_per_gib: measured.unregister_seconds / gib,
    })
}

struct Measured {
    register_seconds: f64,
    pinned_seconds: f64,
    unregister_seconds: f64,
    pageable_seconds: f64,
}

fn measure(
    device: &CudaDevice,
    host: &mut HostBuffer,
    arena: &DeviceArena,
    copies: u64,
) -> Result<Measured, CudaError> {
    let started = Instant::now();
    register_buffer(device.context(), host)?;
    let register_seconds = started.elapsed().as_secs_f64();

    let pinned_seconds = copy_loop(device, host, arena, copies)?;

    let started = Instant::now();
    host.clear_registration();
    let unregister_seconds = started.elapsed().as_secs_f64();

    let pageable_seconds = copy_loop(device, host, arena, copies)?;
    Ok(Measured {
        register_seconds,
        pinned_seconds,
        unregister_seconds,
        pageable_seconds,
    })
}

/// Seconds for `copies` back-to-back copies of the whole buffer on the copy stream,
/// after one warm-up copy.
fn copy_loop(
    device: &CudaDevice,
    host: &HostBuffer,
    arena: &DeviceArena,
    copies: u64,
) -> Result<f64, CudaError> {
    device.bind()?;
    let stream = device.copy_stream();
    let enqueue = || {
        // SAFETY: `host` is borrowed for the whole loop, which ends with a stream
        // synchronize, so the source outlives every copy; the arena holds `len` bytes.
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                arena.base.0,
                host.as_ptr() as *const c_void,
                host.len(),
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyHtoDAsync"))
    };
    let synchronize = || {
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))
    };
    enqueue()?;
    synchronize()?;
    let started = Instant::now();
    for _ in 0..copies {
        enqueue()?;
    }
    synchronize()?;
    Ok(started.elapsed().as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_markdown_table_shows_every_figure_in_its_unit() {
        // Proves the report carries (a)-(c) with units and the pageable ratio.
        let figures = LinkFigures {
            device: "cuda:0 (Test GPU)".to_string(),
            copy_bytes: 1 << 30,
            copies_per_loop: 4,
            pinned_h2d_bytes_per_second: 25e9,
            pageable_h2d_bytes_per_second: 12.5e9,
            pageable_over_pinned: 0.5,
            register_seconds_per_gib: 0.125,
            unregister_seconds_per_gib: 0.0625,
        };
        let table = figures.to_markdown();
        assert!(table.contains("1024 MiB copies × 4"), "{table}");
        assert!(table.contains("| (a) pinned H2D | 25.00 GB/s |"), "{table}");
        assert!(table.contains("12.50 GB/s (50 % of pinned)"), "{table}");
        assert!(table.contains("0.125 s/GiB"), "{table}");
        let json = serde_json::to_value(&figures).unwrap();
        assert_eq!(json["pinned_h2d_bytes_per_second"], 25e9);
    }
}
