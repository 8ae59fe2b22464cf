//! `stagehand run --device cuda`: the one run path ([`execute_on`]) with the CUDA
//! adapters — [`CudaDevice`] as the `Device` port and [`CudaCompute`] on the same
//! context as the compute port — plus what only a GPU run measures.
//!
//! Budget: with `--vram-budget` (or a budget the caller chose, as the bench and the
//! demo's 40 % default do) that figure, checked against the device; for any other
//! model without one, the device's own budget (total − reserve_vram − vram_headroom,
//! capped by the driver's free − vram_headroom), of which reserve_vram is also kept
//! out of the driver's free memory (the compute's activations are allocated after the
//! session's weight arena) and never more than the model needs, rounded down to the
//! driver's 2 MiB pages. The step bound uses the pinned H2D peak measured in the same process and
//! the step's device compute time (the fences' segments: on a GPU the host only
//! queues, so its own timing of a block says nothing about compute).
//!
//! VRAM: the driver's used figure is sampled after every step; what the compute
//! adapter holds beside the weights (activations, cast buffer, blocks loaded for the
//! reference) is taken off it, and the rest, over the figure before the session
//! started, must stay within budget + vram_headroom.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use stagehand_actors::{Bytes, Device};

use super::{execute_on, Budgets, Outcome, Prepared, RunError, RunPlan};
use crate::compute::ComputeDtype;
use crate::device::cuda::bench::{link_figures, LinkFigures};
use crate::device::cuda::{CudaCompute, CudaDevice, CudaError, VramBudget};
use crate::run::bound::{LinkRates, StepBound};

/// Smallest copy the run's link measurement uses, so small blocks still measure the
/// link and not the per-copy overhead.
const LINK_COPY_BYTES_MIN: u64 = 64 << 20;
/// The driver backs `cuMemAlloc` with 2 MiB pages.
const DRIVER_PAGE_BYTES: u64 = 2 << 20;
/// What the driver may allocate for itself after the baseline: the code of cuBLAS
/// kernels it loads lazily on their first launch (the warm-up cannot launch every
/// kernel cuBLAS will pick for the model's shapes). Four driver pages.
pub const DRIVER_CODE_ALLOWANCE_BYTES: u64 = 4 * DRIVER_PAGE_BYTES;

/// Extra choices the bench makes; `Default` is what `stagehand run` uses.
#[derive(Default)]
pub struct CudaRunOptions {
    /// Share one device (one context) across runs; `None` opens device 0.
    pub device: Option<Arc<CudaDevice>>,
    /// Link figures measured already in this process; `None` measures them.
    pub link: Option<LinkFigures>,
}

/// The driver's memory figures of a run: what "VRAM in use never above budget +
/// headroom" is judged on.
#[derive(Debug, Clone, Serialize)]
pub struct VramFigures {
    pub total_bytes: u64,
    /// Driver used (total − free) once the context, kernels and cuBLAS exist, before
    /// the run allocates anything, less the compute adapter's buffers then.
    pub baseline_used_bytes: u64,
    pub budget: VramBudget,
    pub reserve_vram_bytes: u64,
    pub vram_headroom_bytes: u64,
    /// Driver used at the end of each step.
    pub used_bytes_per_step: Vec<u64>,
    /// What the compute adapter held at the end of each step (activations, cast
    /// buffer, reference blocks), in whole driver pages.
    pub compute_bytes_per_step: Vec<u64>,
    pub peak_used_bytes: u64,
    /// Peak of used − compute − baseline: the weights' share by the driver's figure.
    pub peak_weights_bytes: u64,
    /// What the driver may load for itself after the baseline (kernel code).
    pub driver_allowance_bytes: u64,
    /// peak_weights ≤ budget + vram_headroom + driver_allowance.
    pub within_budget_and_headroom: bool,
}

impl VramFigures {
    fn new(
        total_bytes: u64,
        baseline_used_bytes: u64,
        budget: VramBudget,
        reserve_vram_bytes: u64,
        vram_headroom_bytes: u64,
        samples: StepSamples,
    ) -> Self {
        let peak_used_bytes = samples.used_bytes.iter().copied().max().unwrap_or(0);
        let peak_weights_bytes = samples
            .used_bytes
            .iter()
            .zip(&samples.compute_bytes)
            .map(|(used, compute)| {
                used.saturating_sub(*compute)
                    .saturating_sub(baseline_used_bytes)
            })
            .max()
            .unwrap_or(0);
        Self {
            total_bytes,
            baseline_used_bytes,
            budget,
            reserve_vram_bytes,
            vram_headroom_bytes,
            used_bytes_per_step: samples.used_bytes,
            compute_bytes_per_step: samples.compute_bytes,
            peak_used_bytes,
            peak_weights_bytes,
            driver_allowance_bytes: DRIVER_CODE_ALLOWANCE_BYTES,
            within_budget_and_headroom: peak_weights_bytes
                <= budget
                    .budget_bytes
                    .saturating_add(vram_headroom_bytes)
                    .saturating_add(DRIVER_CODE_ALLOWANCE_BYTES),
        }
    }
}

/// A CUDA run's outcome plus what only the CUDA path measures.
pub struct CudaOutcome {
    pub outcome: Outcome,
    pub link: LinkFigures,
    pub vram: VramFigures,
}

/// What the step callback samples after each step.
#[derive(Debug, Default)]
struct StepSamples {
    used_bytes: Vec<u64>,
    compute_bytes: Vec<u64>,
    device_seconds: Vec<f64>,
    /// The first failure to sample, reported after the run.
    error: Option<String>,
}

/// `crate::run::execute` on the GPU. Without a usable CUDA device this is a
/// [`RunError::MissingCapability`] that names `--device cpu`.
pub fn execute_cuda(prepared: &Prepared, plan: RunPlan<'_>) -> Result<Outcome, RunError> {
    let run = execute_cuda_with(prepared, plan, CudaRunOptions::default())?;
    let vram = &run.vram;
    tracing::info!(
        "VRAM in use (driver figure): peak {}; weights {} over the {} baseline \
         (compute buffers taken off); budget {} + headroom {} (+ {} of kernel \
         code the driver may load): {}",
        Bytes(vram.peak_used_bytes),
        Bytes(vram.peak_weights_bytes),
        Bytes(vram.baseline_used_bytes),
        Bytes(vram.budget.budget_bytes),
        Bytes(vram.vram_headroom_bytes),
        Bytes(vram.driver_allowance_bytes),
        if vram.within_budget_and_headroom {
            "within"
        } else {
            "ABOVE"
        }
    );
    Ok(run.outcome)
}

/// Setup failures the user can fix (no device, missing toolkit libraries, budgets that
/// do not fit) are bad input; the rest are device failures.
fn cuda_error(error: CudaError) -> RunError {
    match error {
        CudaError::LibraryMissing { .. } | CudaError::NoDevice(_) => RunError::MissingCapability {
            capability: "cuda".to_string(),
            message: format!("--device cuda: {error}"),
            source: Some(Box::new(error)),
        },
        CudaError::Budget(_) => RunError::setting("vram_budget", format!("--device cuda: {error}")),
        other => RunError::Device {
            message: format!("cuda: {other}"),
            source: Some(Box::new(other)),
        },
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
    let reserve_vram_bytes = settings.reserve_vram.as_u64();
    let mut budget = device
        .vram_budget(
            reserve_vram_bytes,
            settings.vram_headroom.as_u64(),
            configured,
        )
        .map_err(cuda_error)?;
    if configured.is_none() {
        let room = budget.driver_limit_bytes.saturating_sub(reserve_vram_bytes);
        budget.budget_bytes = budget
            .budget_bytes
            .min(room)
            .min(super::resident_need_bytes(prepared, plan.prefetch_depth));
    }
    let asked_bytes = budget.budget_bytes;
    budget.budget_bytes = arena_bytes(asked_bytes);
    let (minimum_bytes, _) = prepared.plan_minimum_bytes(plan.prefetch_depth, plan.policy);
    if budget.budget_bytes < minimum_bytes && asked_bytes >= minimum_bytes {
        // The budget met the plan's minimum until it was cut to whole driver pages:
        // name the figure that survives the cut, not the minimum that does not.
        let paged_minimum = Bytes(minimum_bytes.next_multiple_of(DRIVER_PAGE_BYTES));
        return Err(RunError::budget(
            super::Budget::Vram,
            asked_bytes,
            paged_minimum.0,
            format!(
            "vram_budget {}: on CUDA the weight arena is whole {} driver pages, so it holds {}, below the {} this model needs at prefetch depth {}: set --vram-budget {} or more",
            Bytes(asked_bytes),
            Bytes(DRIVER_PAGE_BYTES),
            Bytes(budget.budget_bytes),
            Bytes(minimum_bytes),
            plan.prefetch_depth,
            paged_minimum.flag_value_at_least(),
        ),
        ));
    }
    Ok(budget)
}

/// The weight arena in whole driver pages, so the driver's used figure for it never
/// exceeds the budget.
fn arena_bytes(budget_bytes: u64) -> u64 {
    if budget_bytes < DRIVER_PAGE_BYTES {
        return budget_bytes;
    }
    budget_bytes / DRIVER_PAGE_BYTES * DRIVER_PAGE_BYTES
}

pub fn execute_cuda_with(
    prepared: &Prepared,
    mut plan: RunPlan<'_>,
    options: CudaRunOptions,
) -> Result<CudaOutcome, RunError> {
    if plan.settings.compute_dtype != ComputeDtype::F32 {
        return Err(RunError::capability(
            "compute_dtype",
            format!(
                "compute_dtype = \"{}\" is implemented on the CPU backend only; on --device cuda \
                 set compute_dtype = \"f32\" (cuBLAS multiplies the widened f32 weights)",
                plan.settings.compute_dtype.name()
            ),
        ));
    }
    let device = match &options.device {
        Some(device) => device.clone(),
        None => CudaDevice::open(0).map(Arc::new).map_err(cuda_error)?,
    };
    let compute = CudaCompute::new(&device).map_err(cuda_error)?;
    compute.warm_up().map_err(|error| RunError::Device {
        message: format!("cuda: warming up the compute: {error}"),
        source: Some(Box::new(error)),
    })?;
    let baseline = device.memory().map_err(cuda_error)?;
    // Everything but the compute adapter's own buffers, which are counted per step.
    let baseline_used_bytes =
        (baseline.total_bytes - baseline.free_bytes).saturating_sub(compute.footprint().bytes());
    let budget = weight_budget(&device, prepared, &plan)?;
    let budgets = Budgets {
        vram_budget_bytes: budget.budget_bytes,
        pin_ceiling_bytes: plan.budgets.pin_ceiling_bytes,
    };
    tracing::info!(
        "cuda: {} ({}), weight budget {} (limited by {:?})",
        device.name(),
        device.device_name(),
        Bytes(budget.budget_bytes),
        budget.limited_by,
    );
    let settings = plan.settings;
    plan.budgets = budgets;
    let samples = Arc::new(Mutex::new(StepSamples::default()));
    plan.on_step = sampling(plan.on_step, device.clone(), &compute, Arc::clone(&samples));
    let device_port: Arc<dyn Device> = device.clone();
    let mut outcome = execute_on(prepared, plan, device_port, &compute)?;
    drop(compute);
    let samples = std::mem::take(&mut *samples.lock().unwrap_or_else(|poison| poison.into_inner()));
    if let Some(error) = &samples.error {
        return Err(RunError::Device {
            message: format!("cuda: sampling the run's device figures: {error}"),
            source: None,
        });
    }

    let link = match options.link {
        Some(link) => link,
        None => link_figures(
            &device,
            prepared
                .workload
                .layout()
                .largest_block_bytes()
                .max(LINK_COPY_BYTES_MIN),
        )
        .map_err(cuda_error)?,
    };
    let report = &mut outcome.report;
    if samples.device_seconds.len() == report.compute_seconds.len() {
        report.compute_seconds = samples.device_seconds.clone();
    }
    let rates = LinkRates {
        copy_bytes_per_second: link.pinned_h2d_bytes_per_second,
        read_bytes_per_second: outcome.rates.read_bytes_per_second,
    };
    outcome.bound = StepBound::new(
        report.steady_compute_seconds(),
        report.plan.vram.streamed_bytes_per_step as f64,
        report.plan.pins.disk_bytes_per_step as f64,
        rates,
    );
    outcome.rates = rates;
    outcome.budgets = budgets;
    outcome.device = format!("{} ({})", device.name(), device.device_name());
    let vram = VramFigures::new(
        baseline.total_bytes,
        baseline_used_bytes,
        budget,
        settings.reserve_vram.as_u64(),
        settings.vram_headroom.as_u64(),
        samples,
    );
    Ok(CudaOutcome {
        outcome,
        link,
        vram,
    })
}

/// The run's step callback, sampling after each step: the driver's used memory, what
/// the compute adapter holds, and the step's device compute time.
///
/// Only the step's own work counts: anything the run loop queues on the same stream
/// between a step and its callback (a check, a reference pass) is told apart by when
/// its segments opened. The step started after the previous callback returned and
/// lasted `seconds`, so segments opened later than that are not the step's. (The
/// first step takes everything queued since the warm-up; it is the cold step, left out
/// of steady figures.)
fn sampling(
    mut inner: Box<dyn FnMut(u64, f64) + Send>,
    device: Arc<CudaDevice>,
    compute: &CudaCompute,
    samples: Arc<Mutex<StepSamples>>,
) -> Box<dyn FnMut(u64, f64) + Send> {
    let footprint = compute.footprint();
    let time = compute.device_time();
    let mut step_may_start = Instant::now();
    Box::new(move |step, seconds| {
        {
            let mut samples = samples.lock().unwrap_or_else(|poison| poison.into_inner());
            let step_ended_by = step_may_start + Duration::from_secs_f64(seconds.max(0.0));
            let cutoff = if step == 0 {
                Instant::now()
            } else {
                step_ended_by
            };
            match (device.memory(), time.take_seconds_split(cutoff)) {
                (Ok(memory), Ok((device_seconds, _reference_seconds))) => {
                    samples
                        .used_bytes
                        .push(memory.total_bytes - memory.free_bytes);
                    samples.compute_bytes.push(footprint.bytes());
                    samples.device_seconds.push(device_seconds);
                }
                (Err(error), _) | (_, Err(error)) => {
                    samples.error.get_or_insert(error.to_string());
                }
            }
        }
        inner(step, seconds);
        step_may_start = Instant::now();
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

    fn samples(used: &[u64], compute: &[u64]) -> StepSamples {
        StepSamples {
            used_bytes: used.to_vec(),
            compute_bytes: compute.to_vec(),
            device_seconds: vec![0.0; used.len()],
            error: None,
        }
    }

    #[test]
    fn vram_use_is_judged_without_compute_buffers_against_budget_plus_headroom() {
        // Proves the check takes, per step, the driver figure less what the compute
        // adapter held and less the baseline, and allows exactly budget + headroom +
        // the driver's kernel-code allowance.
        let mib = 1u64 << 20;
        let within = VramFigures::new(
            1000 * mib,
            300 * mib,
            budget(100 * mib),
            0,
            10 * mib,
            samples(
                &[420 * mib, 440 * mib + 8 * mib, 400 * mib],
                &[10 * mib, 30 * mib, 0],
            ),
        );
        assert_eq!(within.peak_used_bytes, 448 * mib);
        assert_eq!(within.peak_weights_bytes, 118 * mib);
        assert!(
            within.within_budget_and_headroom,
            "8 MiB of kernel code allowed"
        );
        let above = VramFigures::new(
            1000 * mib,
            300 * mib,
            budget(100 * mib),
            0,
            10 * mib,
            samples(&[429 * mib], &[10 * mib]),
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
    fn a_model_needs_its_aligned_blocks_and_a_ring() {
        // Proves the cap on an automatic budget: every block at the arena's 256-byte
        // alignment plus one largest block per prefetch slot, nothing more.
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::model::demo::DemoSpec {
            blocks: 3,
            layers_per_block: 1,
            dim: 10,
            seed: 1,
        };
        let model = crate::model::demo::write_linear_stack(dir.path(), &spec).unwrap();
        let settings = crate::settings::Settings::default();
        let prepared = crate::run::prepare(
            &model,
            crate::run::WorkloadKind::LinearStack,
            1,
            &settings,
            true,
        )
        .unwrap();
        // Each block is one 10 × 10 f32 layer: 400 bytes, 512 aligned.
        assert_eq!(
            crate::run::resident_need_bytes(&prepared, 2),
            3 * 512 + 3 * 512
        );
        assert_eq!(crate::run::resident_need_bytes(&prepared, 0), 3 * 512 + 512);
    }

    #[test]
    fn setup_errors_the_user_can_fix_are_bad_input() {
        // Proves a missing GPU or toolkit is exit 2 with the way out, a driver failure
        // mid-run is exit 1.
        let missing = cuda_error(CudaError::NoDevice(
            "the driver sees no GPU; run with --device cpu".to_string(),
        ));
        assert!(
            matches!(&missing, RunError::MissingCapability { capability, message, .. } if capability == "cuda" && message.contains("--device cpu") && message.contains("--device cuda"))
        );
        assert_eq!(missing.exit_code(), 2);
        let failed = cuda_error(CudaError::InvalidArgument("bad".to_string()));
        assert!(matches!(failed, RunError::Device { .. }));
        assert_eq!(failed.exit_code(), 1);
    }
}
