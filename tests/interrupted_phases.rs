//! Every long phase polls the process-wide stop flag a first SIGINT or SIGTERM sets:
//! with a stop requested, each returns (or ends its loop) at its next unit of work,
//! leaves no partial file behind and releases every budget.
//!
//! One test in its own binary: the flag is process-wide, so nothing else may run
//! beside it.

mod common;

use std::sync::Arc;

use stagehand::actors::{Device, ResidencyPolicy, Session};
use stagehand::device::CpuDevice;
use stagehand::families::stream_verify::StreamVerify;
use stagehand::families::FamilyError;
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::model::{BlockReader, ModelIndex};
use stagehand::run::bound::measure_rates;
use stagehand::run::driver::{drive_cpu, DriverOptions};
use stagehand::run::{
    execute, no_observer, open_model_storage, prepare, session_config, Budgets, RunPlan,
    WorkloadKind,
};
use stagehand::settings::Settings;
use stagehand::signals;

fn entries(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|listing| {
            listing
                .map(|entry| {
                    entry
                        .expect("entry")
                        .file_name()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_long_phase_stops_at_its_next_unit_of_work_once_a_stop_is_requested() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let index = ModelIndex::open(&model, None).expect("indexes");
    let settings = Settings::default();
    // Prepared before the stop: the run below must stop inside its own phases.
    let prepared = prepare(&model, WorkloadKind::Auto, 4, &settings, true).expect("prepares");

    signals::request_stop(libc::SIGTERM);
    let interrupted = "interrupted by SIGTERM";

    // The reads a reference or the stream-verify checksums are computed from.
    let reader = BlockReader::open(&index).expect("opens");
    let error = reader.read(0).expect_err("a read after the stop");
    assert!(error.to_string().contains(interrupted), "{error}");
    let Err(error) = StreamVerify::new(&index) else {
        panic!("checksums after the stop must fail");
    };
    assert!(
        matches!(
            error,
            FamilyError::Session(stagehand::actors::SessionError::Interrupted)
        ),
        "{error}"
    );

    // Writing a model: no partial file, no model.
    let out = dir.path().join("written");
    let spec = DemoSpec {
        blocks: 2,
        layers_per_block: 1,
        dim: 64,
        seed: 1,
    };
    let error = write_linear_stack(&out, &spec).expect_err("a write after the stop");
    assert!(error.to_string().contains(interrupted), "{error}");
    assert_eq!(entries(&out), Vec::<String>::new(), "nothing left behind");

    // Filling the cache: the same.
    let cache = dir.path().join("cache");
    let error = stagehand::model::cache::ensure_demo_model(&cache, &spec)
        .expect_err("a cache fill after the stop");
    assert!(error.to_string().contains(interrupted), "{error}");
    assert!(
        entries(&cache).iter().all(|name| name.ends_with(".lock")),
        "only the lock file: {:?}",
        entries(&cache)
    );

    // A run: no step starts, the session drains, both budgets come back; the
    // calibration after it is cut short but still reports a rate.
    let plan = RunPlan {
        settings: &settings,
        budgets: Budgets {
            vram_budget_bytes: 2560 * 1024,
            pin_ceiling_bytes: 2048 * 1024,
        },
        prefetch_depth: 2,
        policy: ResidencyPolicy::Planned,
        steps: 0,
        stop: signals::stop_flag(),
        observer: no_observer(),
        on_step: Box::new(|_, _| {}),
        fail_after_reads: None,
        keep_outputs: false,
        on_token: None,
        measure_links: false,
        shared: None,
    };
    let outcome = execute(&prepared, plan).expect("a stopped run still reports");
    assert_eq!(outcome.report.steps, 0);
    assert_eq!(
        (
            outcome.report.stats.vram.used_bytes,
            outcome.report.stats.pinned.used_bytes
        ),
        (0, 0)
    );
    assert!(outcome.rates.copy_bytes_per_second > 0.0);

    // Driving a session: no step starts, the session drains, both budgets come back.
    let layout = prepared.workload.layout().clone();
    let budget = layout.total_bytes();
    let device: Arc<dyn Device> = Arc::new(CpuDevice::new(budget).expect("device"));
    let storage = open_model_storage(&prepared.index, &settings, None).expect("storage");
    let config = session_config(
        &settings,
        Budgets {
            vram_budget_bytes: budget,
            pin_ceiling_bytes: budget,
        },
        2,
        ResidencyPolicy::Planned,
    );
    let session = Session::start(
        config,
        layout.clone(),
        prepared.workload.order(),
        device.clone(),
        storage.clone(),
        no_observer(),
    )
    .expect("session");
    let options = DriverOptions {
        steps: 0,
        stop: signals::stop_flag(),
        ..DriverOptions::steps(0)
    };
    let report = drive_cpu(session, &prepared.workload, &prepared.index, options)
        .unwrap_or_else(|failure| panic!("a stopped drive still reports: {}", failure.0));
    assert_eq!(report.steps, 0);
    assert_eq!(
        (report.stats.vram.used_bytes, report.stats.pinned.used_bytes),
        (0, 0)
    );

    // The calibration after a run is cut short but still reports a rate.
    let rates = measure_rates(&device, &storage, &layout, |_| true).expect("rates");
    assert!(rates.copy_bytes_per_second > 0.0);
    assert_eq!(signals::received(), Some(libc::SIGTERM));
}
