//! The real side of a case: `stagehand run`'s path, repeated, with the bytes per
//! link counted at each step's end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stagehand_actors::{BlockId, Link, Observer, ResidencyPolicy};

use super::{read_path, Case};
use crate::model::ShardFile;
use crate::run::{Budgets, Prepared, RunPlan};
use crate::settings::Settings;
use crate::sim::ReadPath;
use crate::simulate::LinkBytes;

/// Model bytes over each link so far, counted from the session's observer.
#[derive(Default)]
struct LinkCounter {
    bytes: [AtomicU64; 3],
}

impl LinkCounter {
    fn snapshot(&self) -> LinkBytes {
        let read = |index: usize| self.bytes[index].load(Ordering::Relaxed);
        LinkBytes {
            disk_to_pinned: read(0),
            pinned_to_vram: read(1),
            disk_to_vram: read(2),
        }
    }
}

impl Observer for LinkCounter {
    fn block_transfer(&self, link: Link, _block: BlockId, bytes: u64, _seconds: f64) {
        let index = match link {
            Link::DiskToPinned => 0,
            Link::PinnedToVram => 1,
            Link::DiskToVram => 2,
        };
        self.bytes[index].fetch_add(bytes, Ordering::Relaxed);
    }
}

/// What one real run measured.
pub(super) struct Measured {
    pub(super) step_seconds: Vec<f64>,
    /// Link counters at the start and at each step's end.
    pub(super) boundaries: Vec<LinkBytes>,
    pub(super) plan_streamed_bytes: u64,
    pub(super) plan_disk_bytes: u64,
    pub(super) peak_vram_bytes: u64,
    pub(super) peak_pinned_bytes: u64,
    pub(super) verified: bool,
    pub(super) budgets: Budgets,
    pub(super) rates: crate::run::bound::LinkRates,
}

fn run_real(
    case: &Case,
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
) -> Result<Measured, String> {
    let counter = Arc::new(LinkCounter::default());
    let boundaries = Arc::new(Mutex::new(vec![LinkBytes::default()]));
    let on_step = {
        let counter = Arc::clone(&counter);
        let boundaries = Arc::clone(&boundaries);
        Box::new(move |_step: u64, _seconds: f64| {
            if let Ok(mut boundaries) = boundaries.lock() {
                boundaries.push(counter.snapshot());
            }
        })
    };
    let plan = RunPlan {
        settings,
        budgets,
        prefetch_depth: case.prefetch_depth,
        policy: ResidencyPolicy::Planned,
        steps: case.steps,
        stop: Arc::new(AtomicBool::new(false)),
        observer: Arc::clone(&counter) as Arc<dyn Observer>,
        on_step,
        fail_after_reads: None,
        keep_outputs: false,
        on_token: None,
        measure_links: true,
        shared: None,
    };
    let outcome = if case.cuda {
        crate::run::execute_cuda(prepared, plan)
    } else {
        crate::run::execute(prepared, plan)
    }
    .map_err(|error| error.to_string())?;
    let report = &outcome.report;
    let boundaries = boundaries
        .lock()
        .map(|boundaries| boundaries.clone())
        .unwrap_or_default();
    Ok(Measured {
        step_seconds: report.step_seconds.clone(),
        boundaries,
        plan_streamed_bytes: report.plan.vram.streamed_bytes_per_step,
        plan_disk_bytes: report.plan.pins.disk_bytes_per_step,
        peak_vram_bytes: report.stats.vram.peak_used_bytes,
        peak_pinned_bytes: report.stats.pinned.peak_used_bytes,
        verified: report.verified_steps == report.steps,
        budgets: outcome.budgets,
        rates: outcome.rates,
    })
}

/// The case's real runs, `repeats` of them. A page-cache row reads its model through
/// the page cache before each: the premise of the row (an earlier run dropped the
/// pages of what it pinned).
pub(super) fn run_repeats(
    case: &Case,
    prepared: &Prepared,
    settings: &Settings,
    budgets: Budgets,
) -> Result<Vec<Measured>, String> {
    let mut runs = Vec::new();
    for _ in 0..case.repeats.max(1) {
        if read_path(case) == ReadPath::PageCache {
            warm_page_cache(&prepared.index.files)
                .map_err(|error| format!("reading the model into the page cache: {error}"))?;
        }
        runs.push(
            run_real(case, prepared, settings, budgets)
                .map_err(|reason| format!("real run: {reason}"))?,
        );
    }
    Ok(runs)
}

/// Reads every file of the model once through the page cache.
fn warm_page_cache(files: &[ShardFile]) -> std::io::Result<()> {
    use std::io::Read;
    let mut buffer = vec![0u8; 8 << 20];
    for file in files {
        let (mut reader, _) = crate::model::open_regular(&file.path)?;
        while reader.read(&mut buffer)? > 0 {}
    }
    Ok(())
}
