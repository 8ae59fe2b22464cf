//! Unit tests of the fit check's arithmetic.

use super::*;

const GIB: u64 = 1 << 30;

fn tiny_model(blocks: u64, bytes_per_block: u64) -> ModelDescription {
    let text = format!(
        "dtype = \"bf16\"\ntokens_per_step = 1000\nblock_count = {blocks}\nbytes_per_block = {bytes_per_block}\nflops_per_token_per_block = 1e9\n"
    );
    ModelDescription::parse("tiny", "test", &text).unwrap()
}

fn rtx4090() -> HardwareProfile {
    HardwareProfile::load("rtx4090").unwrap()
}

#[test]
fn a_model_that_fits_in_vram_moves_nothing_per_step() {
    // 10 × 1 GiB on a 24 GiB card: resident, no ring, no traffic.
    let check = FitCheck::new(&tiny_model(10, GIB), &rtx4090(), &FitSettings::default());
    assert!(check.fits);
    assert_eq!((check.ring_bytes, check.pcie_bytes_per_step), (0, 0));
    assert_eq!(check.disk_bytes_per_step, 0);
    assert_eq!(check.bottleneck, Bottleneck::Compute);
}

#[test]
fn streaming_moves_model_minus_budget_minus_ring() {
    // 40 × 1 GiB, budget 20 GiB, depth 2: ring 3 GiB, resident 17 GiB, 23 GiB over
    // PCIe. Pin ceiling 10 GiB − staging 3 GiB = 7 GiB cached: 16 GiB from disk.
    let settings = FitSettings {
        vram_budget_bytes: Some(20 * GIB),
        pin_ceiling_bytes: Some(10 * GIB),
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(40, GIB), &rtx4090(), &settings);
    assert!(check.fits, "{:?}", check.failures);
    assert_eq!(check.ring_bytes, 3 * GIB);
    assert_eq!(check.resident_bytes, 17 * GIB);
    assert_eq!(check.pcie_bytes_per_step, 23 * GIB);
    assert_eq!(check.pinned_cache_bytes, 7 * GIB);
    assert_eq!(check.disk_bytes_per_step, 16 * GIB);
    // 16 GiB at 7 GB/s ≈ 2.45 s dominates 23 GiB at 25 GB/s ≈ 0.99 s.
    assert_eq!(check.bottleneck, Bottleneck::Disk);
    assert!((check.bound_seconds - 16.0 * GIB as f64 / 7e9).abs() < 1e-9);
}

#[test]
fn each_failing_budget_is_named_with_its_shortfall() {
    let settings = FitSettings {
        vram_budget_bytes: Some(2 * GIB),
        pin_ceiling_bytes: Some(GIB),
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(40, GIB), &rtx4090(), &settings);
    assert!(!check.fits);
    assert_eq!(check.failures.len(), 2);
    assert_eq!(check.failures[0].budget(), "vram_budget");
    assert_eq!(check.failures[0].short_by_bytes(), GIB);
    assert_eq!(check.failures[1].budget(), "pin_ceiling");
    assert_eq!(check.failures[1].short_by_bytes(), 2 * GIB);
    let message = check.failures[0].to_string();
    assert!(
        message.contains("1 GiB short") && message.contains("--prefetch-depth"),
        "{message}"
    );
}

#[test]
fn budgets_above_the_hardware_are_failures() {
    let settings = FitSettings {
        vram_budget_bytes: Some(30 * GIB),
        pin_ceiling_bytes: Some(64 * GIB),
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(4, GIB), &rtx4090(), &settings);
    let budgets: Vec<_> = check.failures.iter().map(FitFailure::budget).collect();
    assert_eq!(budgets, ["vram_budget", "pin_ceiling"]);
    // 64 GiB host − 2 GiB floor = 62 GiB spare: 2 GiB over.
    assert_eq!(check.failures[1].short_by_bytes(), 2 * GIB);
}

#[test]
fn fast_disk_streams_chunks_through_a_ring_beside_the_ceiling() {
    // 40 × 1 GiB, budget 20 GiB: 23 GiB over PCIe. With --fast-disk the 3 × 64 MiB
    // ring sits beside the 10 GiB ceiling, which caches 10 GiB: 13 GiB from disk.
    let settings = FitSettings {
        vram_budget_bytes: Some(20 * GIB),
        pin_ceiling_bytes: Some(10 * GIB),
        fast_disk: true,
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(40, GIB), &rtx4090(), &settings);
    assert!(check.fits, "{:?}", check.failures);
    assert_eq!(check.staging_bytes, 3 * (64 << 20));
    assert_eq!(check.pinned_cache_bytes, 10 * GIB);
    assert_eq!(check.disk_bytes_per_step, 13 * GIB);
    // The default ceiling leaves the host room for the ring: 64 − 2 GiB − 192 MiB.
    let defaults = FitSettings {
        fast_disk: true,
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(40, GIB), &rtx4090(), &defaults);
    assert_eq!(check.pin_ceiling_bytes, 62 * GIB - 3 * (64 << 20));
}

#[test]
fn a_ring_of_one_buffer_is_refused() {
    let settings = FitSettings {
        staging_buffers: 1,
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(40, GIB), &rtx4090(), &settings);
    assert!(!check.fits);
    assert_eq!(check.failures[0].budget(), "staging_buffers");
    assert_eq!(check.failures[0].short_by_bytes(), GIB);
}

#[test]
fn the_staging_ring_has_the_buffers_the_session_allocates_at_its_depth() {
    // Proves the fit check stages through at most depth + 2 whole-block buffers, as the
    // session does: at depth 0, 2 of the 3 configured, and the third caches a block.
    // 40 × 1 GiB, budget 20 GiB: ring 1 GiB, 21 GiB over PCIe; ceiling 10 GiB − 2 GiB
    // staging = 8 GiB cached, 13 GiB from disk.
    let settings = FitSettings {
        vram_budget_bytes: Some(20 * GIB),
        pin_ceiling_bytes: Some(10 * GIB),
        prefetch_depth: 0,
        ..FitSettings::default()
    };
    let check = FitCheck::new(&tiny_model(40, GIB), &rtx4090(), &settings);
    assert!(check.fits, "{:?}", check.failures);
    assert_eq!(check.ring_bytes, GIB);
    assert_eq!(check.pcie_bytes_per_step, 21 * GIB);
    assert_eq!(check.staging_bytes, 2 * GIB);
    assert_eq!(check.pinned_cache_bytes, 8 * GIB);
    assert_eq!(check.disk_bytes_per_step, 13 * GIB);
    assert_eq!(whole_block_staging_buffers(3, 1), 3);
    assert_eq!(whole_block_staging_buffers(8, 2), 4);
}
