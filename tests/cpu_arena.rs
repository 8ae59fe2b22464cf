//! The CPU backend's "VRAM" costs host memory only as blocks land in it. One test per
//! binary on purpose: it reads this process's RSS, which other tests running on
//! other threads would move.

use stagehand::actors::Device;
use stagehand::device::host_memory::resident_bytes;
use stagehand::device::CpuDevice;

#[test]
fn an_8_gib_arena_costs_rss_only_for_the_pages_written() {
    // Proves the arena is reserved, not committed: asking the CPU device for 8 GiB
    // barely moves RSS, and writing 16 MiB of it commits about 16 MiB.
    let device = CpuDevice::new(8 << 30).expect("device");
    let before = resident_bytes().expect("VmRSS");
    let arena = device.allocate_arena(8 << 30).expect("an 8 GiB arena");
    let reserved = resident_bytes().expect("VmRSS");
    assert!(
        reserved < before + (4 << 20),
        "RSS grew from {before} to {reserved} B on an untouched 8 GiB arena"
    );
    // SAFETY: the first 16 MiB lie inside the arena, which nothing else uses.
    let head = unsafe { std::slice::from_raw_parts_mut(arena.base.0 as *mut u8, 16 << 20) };
    assert!(
        head.iter().all(|&byte| byte == 0),
        "fresh pages read as zero"
    );
    head.fill(1);
    let touched = resident_bytes().expect("VmRSS");
    assert!(
        touched >= reserved + (15 << 20),
        "RSS {touched} B after writing 16 MiB, {reserved} B before"
    );
    device.free_arena(arena);
}
