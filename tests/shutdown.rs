//! A run leaves nothing behind: after it ends — normally or failed half-way — no
//! stagehand thread (actors, copy engine, disk readers) is still running.
//! One test per binary, so no other test's threads are counted.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use common::threads::{is_ours, settled_threads};

use stagehand::actors::ResidencyPolicy;
use stagehand::model::demo::{write_linear_stack, DemoSpec};
use stagehand::run::{execute, no_observer, prepare, Budgets, RunPlan, WorkloadKind};
use stagehand::settings::{DeviceKind, Settings};

/// Names of this process's stagehand threads once joined ones have left.
fn stagehand_threads() -> Vec<String> {
    settled_threads(is_ours, 0)
}

fn run(fail_after_reads: Option<u64>) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let spec = DemoSpec {
        blocks: 8,
        layers_per_block: 2,
        dim: 128,
        seed: 3,
    };
    let model = write_linear_stack(dir.path(), &spec).unwrap();
    let settings = Settings {
        device: DeviceKind::Cpu,
        ..Settings::default()
    };
    let prepared = prepare(&model, WorkloadKind::Auto, 2, &settings, false).unwrap();
    let block = 2 * 128 * 128 * 4;
    execute(
        &prepared,
        RunPlan {
            settings: &settings,
            budgets: Budgets {
                vram_budget_bytes: 5 * block,
                pin_ceiling_bytes: 4 * block,
            },
            prefetch_depth: 2,
            policy: ResidencyPolicy::Planned,
            steps: 4,
            stop: Arc::new(AtomicBool::new(false)),
            observer: no_observer(),
            on_step: Box::new(|_, _| {}),
            fail_after_reads,
            keep_outputs: false,
            on_token: None,
            measure_links: false,
            shared: None,
        },
    )
    .is_ok()
}

#[test]
fn no_thread_outlives_a_run_whether_it_succeeds_or_fails() {
    assert!(stagehand_threads().is_empty());
    assert!(run(None), "the clean run must succeed");
    assert_eq!(
        stagehand_threads(),
        Vec::<String>::new(),
        "after a clean run"
    );
    assert!(
        !run(Some(10)),
        "the injected read failure must fail the run"
    );
    assert_eq!(
        stagehand_threads(),
        Vec::<String>::new(),
        "after a failed run"
    );
}
