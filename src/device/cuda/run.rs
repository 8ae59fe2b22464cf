//! `stagehand run --device cuda`: the same session as the CPU backend
//! (`crate::run::execute`), with [`CudaDevice`] as the `Device` and the CUDA driver
//! loop ([`super::stepper`]) as the compute thread.
//!
//! Budget: with `--vram-budget` (or a budget the caller chose, as the bench and the
//! demo's 40 % default do) that figure, checked against the device; for any other
//! model without one, the device's own budget (total − reserve_vram − vram_headroom,
//! capped by the driver's free − vram_headroom). The step bound uses the pinned H2D
//! peak measured in the same process and the step's device compute time.

use std::sync::Arc;

use serde::Serialize;
use stagehand_actors::{BlockId, Device, Session};

use super::bench::{link_figures, LinkFigures};
use super::budget::VramBudget;
use super::device::CudaDevice;
use super::error::CudaError;
use super::stack::LinearStackGpu;
use super::stepper::{drive_cuda, GpuWork, OutputCheck, StepOptions};
use super::verify::StreamVerifyGpu;
use crate::run::{Budgets, Outcome, Prepared, RunError, RunPlan};
use crate::workload::bound::{measure_rates, LinkRates, StepBound};
use crate::workload::driver::Workload;

/// Smallest copy the run's link measurement uses, so small blocks still measure the
/// link and not the per-copy overhead.
const LINK_COPY_BYTES_MIN: u64 = 64 << 20;

/// Extra choices the bench makes; `Default` is what `stagehand run` uses.
#[derive(Default)]
pub struct CudaRunOptions {
    /// Share one device (one context) across runs; `None` opens device 0.
    pub device: Option<Arc<CudaDevice>>,
    /// Link figures measured already in this process; `None` measures them.
    pub link: Option<LinkFigures>,
    /// Check linear-stack steps against the first step's output instead of the CPU
    /// reference in `Prepared` (which may then be empty).
    pub check_first_step: bool,
    /// Skip the storage read-rate measurement (the bound then takes reads as free).
    pub skip_read_rate: bool,
}

/// The driver's memory figures of a run: what "VRAM in use never above budget +
/// headroom" is judged on.
#[derive(Debug, Clone, Serialize)]
pub struct VramFigures {
    pub total_bytes: u64,
    /// Driver used (total − free) after the context, kernels, cuBLAS workspace and
    /// activations exist, before the session's weight arena: everything but weights.
    pub baseline_used_bytes: u64,
    pub activation_bytes: u64,
    pub budget: VramBudget,
    pub reserve_vram_bytes: u64,
    pub vram_headroom_bytes: u64,
    /// Driver used at the end of each step.
    pub used_bytes_per_step: Vec<u64>,
    pub peak_used_bytes: u64,
    /// Peak used − baseline: the weights' share by the driver's figure.
    pub peak_over_baseline_bytes: u64,
    /// peak_over_baseline ≤ budget + vram_headroom.
    pub within_budget_and_headroom: bool,
}

impl VramFigures {
    fn new(
        total_bytes: u64,
        baseline_used_bytes: u64,
        activation_bytes: u64,
        budget: VramBudget,
        reserve_vram_bytes: u64,
        vram_headroom_bytes: u64,
        used_bytes_per_step: Vec<u64>,
    ) -> Self {
        let peak_used_bytes = used_bytes_per_step.iter().copied().max().unwrap_or(0);
        let peak_over_baseline_bytes = peak_used_bytes.saturating_sub(baseline_used_bytes);
        Self {
            total_bytes,
            baseline_used_bytes,
            activation_bytes,
            budget,
            reserve_vram_bytes,
            vram_headroom_bytes,
            used_bytes_per_step,
            peak_used_bytes,
            peak_over_baseline_bytes,
            within_budget_and_headroom: peak_over_baseline_bytes
                <= budget.budget_bytes.saturating_add(vram_headroom_bytes),
        }
    }
}

/// A CUDA run's outcome plus what only the CUDA path measures.
pub struct CudaOutcome {
    pub outcome: Outcome,
    pub link: LinkFigures,
    pub vram: VramFigures,
    pub normalised_errors: Vec<f32>,
    pub last_output: Option<Vec<f32>>,
}

/// `crate::run::execute` on the GPU. Without a usable CUDA device this is a
/// `RunError::BadInput` that names `--device cpu`.
pub fn execute_cuda(prepared: &Prepared, plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    let run = execute_cuda_with(prepared, plan, CudaRunOptions::default())?;
    let vram = &run.vram;
    tracing::info!(
        "VRAM in use (driver figure): peak {} MiB, {} MiB over the {} MiB baseline; budget {} MiB + headroom {} MiB: {}",
        vram.peak_used_bytes >> 20,
        vram.peak_over_baseline_bytes >> 20,
        vram.baseline_used_bytes >> 20,
        vram.budget.budget_bytes >> 20,
        vram.vram_headroom_bytes >> 20,
        if vram.within_budget_and_headroom { "within" } else { "ABOVE" }
    );
    Ok(run.outcome)
}

/// Setup failures the user can fix (no device, missing toolkit libraries, budgets that
/// do not fit) are bad input; the rest are run failures.
fn cuda_error(error: CudaError) -> RunError {
    match error {
        CudaError::LibraryMissing { .. } | CudaError::NoDevice(_) | CudaError::Budget(_) => {
            RunError::BadInput(format!("--device cuda: {error}"))
        }
        other => RunError::Failed(format!("cuda: {other}")),
    }
}

fn open_device(options: &CudaRunOptions) -> Result<Arc<CudaDevice>, RunError> {
    match &options.device {
        Some(device) => Ok(device.clone()),
        None => CudaDevice::open(0).map(Arc::new).map_err(cuda_error),
    }
}

/// The weight budget for this run (see the module docs).
fn weight_budget(
    device: &CudaDevice,
    prepared: &Prepared,
    plan: &RunPlan<'_>,
) -> Result<VramBudget, RunError> {
    let settings = plan.settings;
    let configured = if settings.vram_budget.is_none() && !prepared.is_demo {
        None
    } else {
        Some(plan.budgets.vram_budget_bytes)
    };
    let mut budget = device
        .vram_budget(
            settings.reserve_vram.as_u64(),
            settings.vram_headroom.as_u64(),
            configured,
        )
        .map_err(cuda_error)?;
    budget.budget_bytes = arena_bytes(budget.budget_bytes);
    Ok(budget)
}

/// The driver backs `cuMemAlloc` with 2 MiB pages: the weight arena is rounded down
/// to whole pages so the driver's used figure for it never exceeds the budget.
const DRIVER_PAGE_BYTES: u64 = 2 << 20;

fn arena_bytes(budget_bytes: u64) -> u64 {
    if budget_bytes < DRIVER_PAGE_BYTES {
        return budget_bytes;
    }
    budget_bytes / DRIVER_PAGE_BYTES * DRIVER_PAGE_BYTES
}

pub fn execute_cuda_with(
    prepared: &Prepared,
    plan: RunPlan<'_>,
    options: CudaRunOptions,
) -> Result<CudaOutcome, RunError> {
    let device = open_device(&options)?;
    let settings = plan.settings;
    let index = &prepared.index;
    let layout = index.layout();
    let mut work = match &prepared.workload {
        Workload::LinearStack {
            model,
            reference,
            lora,
        } if lora.is_empty() => GpuWork::LinearStack {
            stack: LinearStackGpu::new(device.clone(), model, index).map_err(cuda_error)?,
            check: if options.check_first_step {
                OutputCheck::FirstStep
            } else {
                OutputCheck::Reference(reference.clone())
            },
        },
        Workload::StreamVerify { names, .. } => GpuWork::StreamVerify {
            verify: StreamVerifyGpu::new(device.clone(), index).map_err(cuda_error)?,
            names: names.clone(),
        },
        _ => {
            return Err(RunError::BadInput(
                "--device cuda runs the linear-stack (without LoRA) and stream-verify \
                 workloads; LoRA and MoE runs need --device cpu for now"
                    .to_string(),
            ))
        }
    };
    let activation_bytes = match &work {
        GpuWork::LinearStack { stack, .. } => {
            stack.warm_up().map_err(cuda_error)?;
            stack.activation_bytes()
        }
        GpuWork::StreamVerify { .. } => 0,
    };
    let baseline = device.memory().map_err(cuda_error)?;
    let budget = weight_budget(&device, prepared, &plan)?;
    let budgets = Budgets {
        vram_budget_bytes: budget.budget_bytes,
        pin_ceiling_bytes: plan.budgets.pin_ceiling_bytes,
    };
    tracing::info!(
        "cuda: {} ({}), weight budget {} MiB (limited by {:?}), activations {} MiB",
        device.name(),
        device.device_name(),
        budget.budget_bytes >> 20,
        budget.limited_by,
        activation_bytes >> 20
    );

    let storage = crate::run::open_model_storage(index, settings, plan.fail_after_reads)?;
    let config = crate::run::session_config(settings, budgets, plan.prefetch_depth, plan.policy);
    let device_port: Arc<dyn Device> = device.clone();
    let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
    let session = Session::start(
        config,
        layout.clone(),
        order,
        device_port.clone(),
        storage.clone(),
        plan.observer,
    )
    .map_err(|error| RunError::BadInput(error.to_string()))?;
    let (report, figures) = drive_cuda(
        session,
        &device,
        &mut work,
        StepOptions {
            steps: plan.steps,
            stop: plan.stop,
            on_step: plan.on_step,
        },
    )
    .map_err(|failure| {
        let (error, stats) = *failure;
        crate::run::failed_run(error, &stats)
    })?;
    drop(work);

    let link = match options.link {
        Some(link) => link,
        None => link_figures(
            &device,
            layout.largest_block_bytes().max(LINK_COPY_BYTES_MIN),
        )
        .map_err(cuda_error)?,
    };
    let read_bytes_per_second = if options.skip_read_rate {
        f64::INFINITY
    } else {
        measure_rates(&device_port, &storage, &layout, |_| true)
            .map_err(RunError::Failed)?
            .read_bytes_per_second
    };
    let rates = LinkRates {
        copy_bytes_per_second: link.pinned_h2d_bytes_per_second,
        read_bytes_per_second,
    };
    let bound = StepBound::new(
        report.steady_compute_seconds(),
        report.plan.vram.streamed_bytes_per_step as f64,
        report.plan.pins.disk_bytes_per_step as f64,
        rates,
    );
    let vram = VramFigures::new(
        baseline.total_bytes,
        baseline.total_bytes - baseline.free_bytes,
        activation_bytes,
        budget,
        settings.reserve_vram.as_u64(),
        settings.vram_headroom.as_u64(),
        figures.used_bytes_per_step,
    );
    Ok(CudaOutcome {
        outcome: Outcome {
            report,
            rates,
            bound,
            budgets,
            model_bytes: layout.total_bytes(),
            device: format!("{} ({})", device.name(), device.device_name()),
            storage: storage.name(),
        },
        link,
        vram,
        normalised_errors: figures.normalised_errors,
        last_output: figures.last_output,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::BudgetLimit;

    fn budget(budget_bytes: u64) -> VramBudget {
        VramBudget {
            budget_bytes,
            accounting_limit_bytes: budget_bytes,
            driver_limit_bytes: budget_bytes,
            limited_by: BudgetLimit::Configured,
        }
    }

    #[test]
    fn vram_use_is_judged_over_the_baseline_against_budget_plus_headroom() {
        // Proves the check takes the peak driver figure, subtracts what existed before
        // the weights, and allows exactly budget + headroom on top.
        let mib = 1u64 << 20;
        let within = VramFigures::new(
            1000 * mib,
            300 * mib,
            8 * mib,
            budget(100 * mib),
            0,
            10 * mib,
            vec![390 * mib, 410 * mib, 400 * mib],
        );
        assert_eq!(within.peak_used_bytes, 410 * mib);
        assert_eq!(within.peak_over_baseline_bytes, 110 * mib);
        assert!(within.within_budget_and_headroom);
        let above = VramFigures::new(
            1000 * mib,
            300 * mib,
            8 * mib,
            budget(100 * mib),
            0,
            10 * mib,
            vec![411 * mib],
        );
        assert!(!above.within_budget_and_headroom);
    }

    #[test]
    fn the_weight_arena_is_whole_driver_pages_never_above_the_budget() {
        // Proves the rounding only ever lowers the budget, to a 2 MiB multiple.
        let mib = 1u64 << 20;
        assert_eq!(arena_bytes(102 * mib + 400 * 1024), 102 * mib);
        assert_eq!(arena_bytes(103 * mib), 102 * mib);
        assert_eq!(arena_bytes(64 * mib), 64 * mib);
        assert_eq!(arena_bytes(mib), mib);
    }

    #[test]
    fn setup_errors_the_user_can_fix_are_bad_input() {
        // Proves a missing GPU or toolkit is exit 2 with the way out, a driver failure
        // mid-run is exit 1.
        let missing = cuda_error(CudaError::NoDevice(
            "the driver sees no GPU; run with --device cpu".to_string(),
        ));
        assert!(
            matches!(&missing, RunError::BadInput(message) if message.contains("--device cpu"))
        );
        let failed = cuda_error(CudaError::InvalidArgument("bad".to_string()));
        assert!(matches!(failed, RunError::Failed(_)));
    }
}
