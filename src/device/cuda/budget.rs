//! VRAM budget arithmetic (DESIGN §2), a pure function so it is tested without a GPU.
//!
//! Two limits apply and the smaller wins:
//! - our own accounting: `total − reserve_vram − vram_headroom`;
//! - the driver's free figure: `free − vram_headroom`, because other processes (a
//!   desktop, another model) already hold part of the device and `vram_headroom` must
//!   stay free counting them too.

use serde::Serialize;
use stagehand_actors::Bytes;

/// The figures the budget is computed from, all in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetInputs {
    /// `cuMemGetInfo` total.
    pub total_bytes: u64,
    /// `cuMemGetInfo` free, counting other processes.
    pub free_bytes: u64,
    pub reserve_vram_bytes: u64,
    pub vram_headroom_bytes: u64,
    /// `--vram-budget`, when the user set one.
    pub configured_budget_bytes: Option<u64>,
}

/// Which limit decided the budget; logged so a user knows which knob to turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetLimit {
    /// `total − reserve_vram − vram_headroom`.
    Accounting,
    /// `free − vram_headroom`: other processes hold memory.
    DriverFree,
    /// The user's `--vram-budget`.
    Configured,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct VramBudget {
    pub budget_bytes: u64,
    pub accounting_limit_bytes: u64,
    pub driver_limit_bytes: u64,
    pub limited_by: BudgetLimit,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error(
        "reserve_vram ({reserve}) + vram_headroom ({headroom}) leave nothing of the device's \
         {total}: lower --reserve-vram or --vram-headroom"
    )]
    NothingLeftAfterReserve {
        total: Bytes,
        reserve: Bytes,
        headroom: Bytes,
    },
    #[error(
        "the driver reports only {free} free on the device (other processes hold the rest) \
         and vram_headroom ({headroom}) must stay free: free VRAM (see nvidia-smi) or lower \
         --vram-headroom"
    )]
    NothingFree { free: Bytes, headroom: Bytes },
    #[error("vram_budget is 0: set --vram-budget to a positive size such as \"8GiB\", or leave it unset")]
    ConfiguredZero,
    #[error(
        "vram_budget ({configured}) is more than this device can give ({limit}, limited by \
         {limited_by}): set --vram-budget {} or less, or leave it unset",
        limit.flag_value_at_most()
    )]
    ConfiguredTooLarge {
        configured: Bytes,
        limit: Bytes,
        limited_by: &'static str,
    },
}

/// The VRAM stagehand may use for weights, or why there is none.
pub fn vram_budget(inputs: BudgetInputs) -> Result<VramBudget, BudgetError> {
    let reserved_bytes = inputs
        .reserve_vram_bytes
        .saturating_add(inputs.vram_headroom_bytes);
    let accounting_limit_bytes = inputs.total_bytes.saturating_sub(reserved_bytes);
    if accounting_limit_bytes == 0 {
        return Err(BudgetError::NothingLeftAfterReserve {
            total: Bytes(inputs.total_bytes),
            reserve: Bytes(inputs.reserve_vram_bytes),
            headroom: Bytes(inputs.vram_headroom_bytes),
        });
    }
    let driver_limit_bytes = inputs.free_bytes.saturating_sub(inputs.vram_headroom_bytes);
    if driver_limit_bytes == 0 {
        return Err(BudgetError::NothingFree {
            free: Bytes(inputs.free_bytes),
            headroom: Bytes(inputs.vram_headroom_bytes),
        });
    }
    let (limit_bytes, limited_by) = if driver_limit_bytes < accounting_limit_bytes {
        (driver_limit_bytes, BudgetLimit::DriverFree)
    } else {
        (accounting_limit_bytes, BudgetLimit::Accounting)
    };
    let (budget_bytes, limited_by) = match inputs.configured_budget_bytes {
        None => (limit_bytes, limited_by),
        Some(0) => return Err(BudgetError::ConfiguredZero),
        Some(configured) if configured > limit_bytes => {
            return Err(BudgetError::ConfiguredTooLarge {
                configured: Bytes(configured),
                limit: Bytes(limit_bytes),
                limited_by: match limited_by {
                    BudgetLimit::DriverFree => "the driver's free memory − vram_headroom",
                    _ => "total − reserve_vram − vram_headroom",
                },
            })
        }
        Some(configured) => (configured, BudgetLimit::Configured),
    };
    Ok(VramBudget {
        budget_bytes,
        accounting_limit_bytes,
        driver_limit_bytes,
        limited_by,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn inputs(total: u64, free: u64, reserve: u64, headroom: u64) -> BudgetInputs {
        BudgetInputs {
            total_bytes: total,
            free_bytes: free,
            reserve_vram_bytes: reserve,
            vram_headroom_bytes: headroom,
            configured_budget_bytes: None,
        }
    }

    #[test]
    fn an_idle_device_is_limited_by_our_own_accounting() {
        // Proves budget = total − reserve − headroom when nobody else uses the device.
        let budget = vram_budget(inputs(24 * GIB, 24 * GIB, GIB / 4, GIB)).unwrap();
        assert_eq!(budget.budget_bytes, 24 * GIB - GIB / 4 - GIB);
        assert_eq!(budget.limited_by, BudgetLimit::Accounting);
        assert_eq!(budget.driver_limit_bytes, 23 * GIB);
    }

    #[test]
    fn other_processes_memory_lowers_the_budget() {
        // Proves the driver's free figure wins when other processes hold VRAM, and that
        // vram_headroom is taken off it too.
        let budget = vram_budget(inputs(24 * GIB, 10 * GIB, GIB / 4, 2 * GIB)).unwrap();
        assert_eq!(budget.budget_bytes, 8 * GIB);
        assert_eq!(budget.limited_by, BudgetLimit::DriverFree);
        assert_eq!(budget.accounting_limit_bytes, 24 * GIB - GIB / 4 - 2 * GIB);
    }

    #[test]
    fn reserve_and_headroom_above_total_is_a_clear_error() {
        // Proves an over-large reserve gives an error naming both knobs, not a wrap-around.
        let error = vram_budget(inputs(8 * GIB, 8 * GIB, 6 * GIB, 2 * GIB)).unwrap_err();
        assert!(matches!(error, BudgetError::NothingLeftAfterReserve { .. }));
        let message = error.to_string();
        assert!(message.contains("--reserve-vram") && message.contains("--vram-headroom"));
    }

    #[test]
    fn a_full_device_is_a_clear_error() {
        // Proves a device whose free memory is all inside the headroom gives no budget.
        let error = vram_budget(inputs(8 * GIB, GIB, 0, GIB)).unwrap_err();
        assert!(matches!(error, BudgetError::NothingFree { .. }));
        assert!(error.to_string().contains("nvidia-smi"));
    }

    #[test]
    fn a_configured_budget_is_used_when_it_fits_and_refused_when_not() {
        // Proves --vram-budget is honoured below the device limit and rejected above it.
        let mut fits = inputs(24 * GIB, 24 * GIB, 0, 0);
        fits.configured_budget_bytes = Some(8 * GIB);
        let budget = vram_budget(fits).unwrap();
        assert_eq!(budget.budget_bytes, 8 * GIB);
        assert_eq!(budget.limited_by, BudgetLimit::Configured);

        let mut too_large = inputs(24 * GIB, 12 * GIB, 0, GIB);
        too_large.configured_budget_bytes = Some(16 * GIB);
        let error = vram_budget(too_large).unwrap_err();
        assert!(error.to_string().contains("--vram-budget"), "{error}");
        assert!(error.to_string().contains("free memory"), "{error}");

        let mut zero = inputs(24 * GIB, 24 * GIB, 0, 0);
        zero.configured_budget_bytes = Some(0);
        assert_eq!(vram_budget(zero).unwrap_err(), BudgetError::ConfiguredZero);
    }

    #[test]
    fn the_budget_never_exceeds_either_limit() {
        // Proves, over a grid of inputs, that a granted budget respects both limits.
        let sizes = [0, 1, GIB / 2, GIB, 3 * GIB, 16 * GIB, u64::MAX];
        for total in sizes {
            for free in sizes.iter().copied().filter(|&free| free <= total) {
                for reserve in sizes {
                    for headroom in sizes {
                        let Ok(budget) = vram_budget(inputs(total, free, reserve, headroom)) else {
                            continue;
                        };
                        assert!(budget.budget_bytes > 0);
                        assert!(budget.budget_bytes + reserve.min(total) + headroom <= total);
                        assert!(budget.budget_bytes + headroom <= free);
                    }
                }
            }
        }
    }
}
