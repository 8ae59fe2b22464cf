//! Checks that what a user sized fits in RAM, before it is allocated.
//!
//! An allocation the allocator cannot satisfy aborts the process (SIGABRT), with no
//! message a user can act on and no budget released. So every buffer whose size comes
//! from a flag (`--batch`, `--lora-rank`, the staging ring) is sized here first, with
//! checked arithmetic, against what the kernel says it can give (`MemAvailable`) less
//! the RAM floor: over that is bad input, and the message states the limit.

use bytesize::ByteSize;

use super::{available_ram_bytes, RunError};
use crate::settings::Settings;

/// Activation buffers a workload keeps per row of its batch: input, output and the
/// scratch of the LoRA and MoE paths, with the reference's own copy.
const ACTIVATION_BUFFERS: u64 = 4;

/// What the settings and the machine leave for buffers: `MemAvailable` less the RAM
/// floor. `None` when the kernel does not say (then nothing is refused here).
pub fn spare_ram_bytes(settings: &Settings) -> Option<u64> {
    available_ram_bytes().map(|available| available.saturating_sub(settings.ram_floor.as_u64()))
}

/// Refuses `what` of `bytes` (`None`: the size overflowed) if it cannot fit in
/// `spare_bytes`; `hint` says which flag to change.
pub fn check_fits(
    what: &str,
    bytes: Option<u64>,
    spare_bytes: Option<u64>,
    hint: &str,
) -> Result<(), RunError> {
    let Some(bytes) = bytes else {
        return Err(RunError::NotEnoughMemory {
            needed_bytes: None,
            spare_bytes,
            message: format!("{what} is larger than this machine can address; {hint}"),
        });
    };
    match spare_bytes {
        Some(spare) if bytes > spare => Err(RunError::NotEnoughMemory {
            needed_bytes: Some(bytes),
            spare_bytes: Some(spare),
            message: format!(
                "{what} needs {} but this machine can spare {} (MemAvailable less ram_floor); {hint}",
                ByteSize::b(bytes).display().iec(),
                ByteSize::b(spare).display().iec(),
            ),
        }),
        _ => Ok(()),
    }
}

/// The activations of a batch of `batch` rows of `dim` f32 values.
pub fn activation_bytes(batch: usize, dim: u64) -> Option<u64> {
    u64::try_from(batch)
        .ok()?
        .checked_mul(dim)?
        .checked_mul(4 * ACTIVATION_BUFFERS)
}

/// The largest batch whose activations fit in `spare_bytes`.
pub fn largest_batch(dim: u64, spare_bytes: u64) -> u64 {
    spare_bytes / (dim.max(1) * 4 * ACTIVATION_BUFFERS)
}

/// Checks `--batch` for a model of width `dim`.
pub fn check_batch(batch: usize, dim: u64, settings: &Settings) -> Result<(), RunError> {
    let spare = spare_ram_bytes(settings);
    let hint = match spare {
        Some(spare) => format!("use --batch {} or less", largest_batch(dim, spare).max(1)),
        None => "use a smaller --batch".to_string(),
    };
    check_fits(
        &format!("--batch {batch} (x width {dim})"),
        activation_bytes(batch, dim),
        spare,
        &hint,
    )
}

/// Checks that the largest block fits in memory: the reference or the checksums are
/// computed from plain reads of one block at a time.
pub fn check_largest_block(
    index: &crate::model::ModelIndex,
    settings: &Settings,
) -> Result<(), RunError> {
    let Some(block) = index.largest_block() else {
        return Ok(());
    };
    check_fits(
        &format!("block `{}` (the largest)", block.name),
        Some(block.bytes),
        spare_ram_bytes(settings),
        "the reference is computed a block at a time; this model's blocks are too large for this machine",
    )
}

/// The fast-disk staging ring the settings ask for (`None`: it overflowed; 0 without
/// `fast_disk`, where whole-block staging sits inside the pin ceiling).
pub fn staging_ring_bytes(settings: &Settings) -> Option<u64> {
    if !settings.fast_disk {
        return Some(0);
    }
    u64::from(settings.staging_buffers).checked_mul(settings.staging_buffer_size.as_u64())
}

/// What the pin ceiling may take of `available_bytes`: all of it less the RAM floor
/// and less the fast-disk staging ring, which is pinned beside the ceiling — every
/// pinned byte counts against the floor.
pub fn pinnable_bytes(available_bytes: u64, settings: &Settings) -> u64 {
    available_bytes
        .saturating_sub(settings.ram_floor.as_u64())
        .saturating_sub(staging_ring_bytes(settings).unwrap_or(u64::MAX))
}

/// Checks the fast-disk staging ring against the RAM the floor leaves.
pub fn check_staging_ring(settings: &Settings) -> Result<(), RunError> {
    check_fits(
        &format!(
            "the fast-disk staging ring ({} x {})",
            settings.staging_buffers,
            ByteSize::b(settings.staging_buffer_size.as_u64())
                .display()
                .iec()
        ),
        staging_ring_bytes(settings),
        spare_ram_bytes(settings),
        "lower staging_buffer_size or staging_buffers",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_that_overflow_or_exceed_the_spare_ram_are_refused_with_the_limit() {
        // Proves a size is refused before any allocation when it overflows or is over
        // what is spare, and that the message names the limit and the way out.
        assert_eq!(activation_bytes(usize::MAX, 1024), None);
        let overflow = check_fits("x", None, Some(1 << 30), "lower it").unwrap_err();
        assert!(overflow.to_string().contains("lower it"), "{overflow}");
        let too_big = check_fits("--batch 9", Some(2 << 30), Some(1 << 30), "use --batch 4")
            .unwrap_err()
            .to_string();
        assert!(
            too_big.contains("2.0 GiB") && too_big.contains("1.0 GiB"),
            "{too_big}"
        );
        assert!(too_big.contains("use --batch 4"), "{too_big}");
        assert!(check_fits("x", Some(1 << 30), Some(1 << 30), "").is_ok());
        assert!(
            check_fits("x", Some(u64::MAX), None, "").is_ok(),
            "unknown RAM"
        );
        assert_eq!(largest_batch(1024, 16 << 20), 1024);
    }

    #[test]
    fn the_staging_ring_counts_against_the_ram_floor() {
        // Proves the pin ceiling's room is MemAvailable less the floor less the
        // fast-disk ring (the ring sits beside the ceiling), so ring + ceiling never
        // push free RAM under the floor; without fast disk there is no ring.
        let gib = 1u64 << 30;
        let mut settings = Settings {
            ram_floor: ByteSize::b(2 * gib),
            staging_buffers: 3,
            staging_buffer_size: ByteSize::b(gib),
            fast_disk: true,
            ..Settings::default()
        };
        assert_eq!(staging_ring_bytes(&settings), Some(3 * gib));
        assert_eq!(pinnable_bytes(10 * gib, &settings), 5 * gib);
        assert_eq!(pinnable_bytes(4 * gib, &settings), 0);
        settings.fast_disk = false;
        assert_eq!(pinnable_bytes(10 * gib, &settings), 8 * gib);
    }
}
