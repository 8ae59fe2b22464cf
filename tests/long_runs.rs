//! What a run keeps grows with its length only up to a fixed bound, so a run of
//! `--steps 0` holds the same memory after days as after minutes: the step times of
//! the report (the reference outputs, one per token for MoE — the soak saw 60 KiB a
//! token without end — are bounded in `workload::reference`'s unit test).

mod common;

use std::sync::Arc;

use stagehand::actors::{BlockId, NoObserver, ResidencyPolicy, Session};
use stagehand::device::CpuDevice;
use stagehand::run::driver::{drive_cpu, DriverOptions, REPORT_STEP_HISTORY};
use stagehand::run::{open_model_storage, prepare, session_config, Budgets, WorkloadKind};
use stagehand::settings::Settings;

#[test]
fn the_step_history_of_a_long_run_is_bounded() {
    // Proves a run longer than REPORT_STEP_HISTORY steps keeps that many step times
    // (the first, cold one and the latest) and counts every step.
    let dir = tempfile::tempdir().expect("temp dir");
    let model = stagehand::model::demo::write_linear_stack(
        dir.path(),
        &stagehand::model::demo::DemoSpec {
            blocks: 2,
            layers_per_block: 1,
            dim: 8,
            seed: 5,
        },
    )
    .expect("model");
    let settings = Settings::default();
    let prepared = prepare(&model, WorkloadKind::Auto, 1, &settings, true).expect("prepares");
    let layout = prepared.workload.layout().clone();
    let budget = layout.total_bytes() * 4;
    let budgets = Budgets {
        vram_budget_bytes: budget.max(64 * 1024),
        pin_ceiling_bytes: budget.max(64 * 1024),
    };
    let session = Session::start(
        session_config(&settings, budgets, 1, ResidencyPolicy::Planned),
        layout.clone(),
        (0..layout.len() as u32).map(BlockId).collect(),
        Arc::new(CpuDevice::new(budgets.vram_budget_bytes).expect("device")),
        open_model_storage(&prepared.index, &settings, None).expect("storage"),
        Arc::new(NoObserver),
    )
    .expect("session");
    let steps = REPORT_STEP_HISTORY as u64 + 50;
    let options = DriverOptions::steps(steps);
    let report = drive_cpu(session, &prepared.workload, &prepared.index, options)
        .unwrap_or_else(|failure| panic!("{}", failure.0));
    assert_eq!(report.steps, steps);
    assert_eq!(report.verified_steps, steps);
    assert_eq!(report.step_seconds.len(), REPORT_STEP_HISTORY);
    assert_eq!(report.compute_seconds.len(), REPORT_STEP_HISTORY);
    assert_eq!(report.stats.steps, steps);
    assert_eq!(
        report.stats.step_seconds.len(),
        stagehand::actors::STEP_HISTORY
    );
}
