//! A run's automatic budgets are budgets the run can use.
//!
//! Without `--vram-budget` the CPU backend takes 40 % of the model as its "VRAM", so
//! the demo really streams. A real checkpoint may have blocks that cannot stream
//! (an embedding table far larger than a layer is kept resident) or a largest block
//! so large that a ring of `prefetch_depth + 1` of them is more than 40 %: the plan
//! then refused the budget stagehand had picked itself. An automatic budget is
//! therefore raised to the plan's minimum; a budget the user set is left as set (and
//! refused with the flag and a value that works).

use stagehand_actors::{BlockId, ResidencyPolicy, StepOrder, VramPlan};

use super::{resolve_budgets, Budgets, Prepared};
use crate::settings::Settings;
use crate::workload::driver::Workload;

/// [`resolve_budgets`], with an automatic VRAM budget raised to the least the plan of
/// this model takes at the configured depth and policy.
pub fn resolve_for_run(
    settings: &Settings,
    prepared: &Prepared,
    policy: ResidencyPolicy,
) -> Budgets {
    let model_bytes = prepared.index.total_bytes();
    let mut budgets = resolve_budgets(settings, model_bytes, prepared.is_demo);
    if settings.vram_budget.is_some() {
        return budgets;
    }
    // The MoE run plans its dense blocks beside an expert cache sized from the budget;
    // its demo model is generated to fit the default.
    if matches!(prepared.workload, Workload::Moe(_)) {
        return budgets;
    }
    let layout = prepared.index.layout();
    let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
    let Ok(order) = StepOrder::new(order, layout.len()) else {
        return budgets;
    };
    let minimum =
        VramPlan::minimum_capacity_bytes(&layout, &order, settings.prefetch_depth, policy);
    if budgets.vram_budget_bytes < minimum {
        tracing::info!(
            "vram_budget: 40 % of the model ({}) is below what its plan needs; using {} (set --vram-budget to choose)",
            stagehand_actors::Bytes(budgets.vram_budget_bytes),
            stagehand_actors::Bytes(minimum)
        );
        budgets.vram_budget_bytes = minimum;
    }
    budgets
}
