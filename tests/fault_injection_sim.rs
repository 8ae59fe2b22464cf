//! Fault injection over many seeded simulator runs: read errors, short reads, slow
//! reads, failed pins and failed copies strike at random points of runs with random
//! budgets, depths, staging and policies. After every run: it ended cleanly (finished,
//! or failed with the error of a fault — never a panic, a stall or a starved block),
//! every budget is back at zero (the session's accounting and the device's own), and
//! no thread is left. A failure prints the seed that replays it:
//!
//!     FAULT_SEED=<seed> FAULT_RUNS=1 cargo test --test fault_injection_sim

mod common;

use common::threads::{is_ours, settled_threads, threads_named};

use std::sync::Arc;
use std::time::Duration;

use common::sim::{device, nvme};
use stagehand::actors::{
    BlockId, BlockLayout, Device, Extent, FileId, LocalSession, ModelLayout, NoObserver,
    ResidencyPolicy, SessionConfig, SessionError, Storage,
};
use stagehand::sim::{
    tokio_duration, virtual_time_system, ChaosCounts, ChaosDevice, ChaosPlan, ChaosStorage,
    FaultPlan, SimClock, SplitMix64,
};

const MIB: u64 = 1 << 20;
/// Runs per test invocation (CI); `FAULT_RUNS` overrides.
const RUNS: u64 = 1200;
/// The first seed; `FAULT_SEED` overrides.
const FIRST_SEED: u64 = 0x5EED_0000;

/// A model of 6 to 20 blocks of 8 to 64 MiB (virtual bytes), in one file.
fn layout(rng: &mut SplitMix64) -> ModelLayout {
    let blocks = 6 + rng.next_u64() % 15;
    let mut offset = 0;
    let blocks = (0..blocks)
        .map(|index| {
            let length = (8 + rng.next_u64() % 57) * MIB;
            let extent = Extent {
                file: FileId(0),
                offset,
                length,
            };
            offset += length;
            BlockLayout::new(format!("layers.{index}"), vec![extent])
        })
        .collect();
    ModelLayout { blocks }
}

fn config(rng: &mut SplitMix64, layout: &ModelLayout) -> SessionConfig {
    let total = layout.total_bytes();
    let largest = layout.largest_block_bytes();
    let depth = (rng.next_u64() % 4) as u32;
    let fraction = |rng: &mut SplitMix64, low: f64| low + rng.next_f64() * (1.0 - low);
    let vram = ((total as f64 * fraction(rng, 0.2)) as u64).max(largest * (u64::from(depth) + 2));
    let fast_disk = rng.next_u64() % 3 == 0;
    let staging_buffers = 2 + (rng.next_u64() % 3) as u32;
    // Room for whole-block staging, plus a share of the model for the pinned cache.
    let staging = u64::from(staging_buffers) * largest;
    SessionConfig {
        vram_budget_bytes: vram,
        pin_ceiling_bytes: staging + (total as f64 * fraction(rng, 0.0)) as u64,
        prefetch_depth: depth,
        staging_buffers,
        fast_disk_chunk_bytes: fast_disk.then_some(16 * MIB),
        policy: if rng.next_u64() % 4 == 0 {
            ResidencyPolicy::Lru
        } else {
            ResidencyPolicy::Planned
        },
        max_reads_in_flight: 2 + (rng.next_u64() % 4) as usize,
        activation_reserve_bytes: 0,
    }
}

/// What a run came to.
#[derive(Debug)]
enum Ending {
    Finished,
    /// Failed with the error of an injected fault.
    Failed(SessionError),
    /// The session could not start (a staging ring that could not be pinned).
    Refused(SessionError),
}

fn run_one(seed: u64) -> Result<(Ending, Arc<ChaosCounts>), String> {
    let mut rng = SplitMix64::new(seed);
    let layout = layout(&mut rng);
    let config = config(&mut rng, &layout);
    let steps = 2 + rng.next_u64() % 4;
    // The chaos adapter sleeps on tokio's clock: 1–20 ms of virtual time.
    let slow_read = tokio_duration(Duration::from_millis(1 + rng.next_u64() % 20));
    let plan = ChaosPlan::drawn(seed, slow_read);
    let counts = Arc::new(ChaosCounts::default());
    if std::env::var("FAULT_RUNS").as_deref() == Ok("1") {
        println!(
            "seed {seed}: {} blocks, {steps} steps\n{config:?}\n{plan:?}",
            layout.len()
        );
    }
    let system = virtual_time_system().map_err(|error| error.to_string())?;
    let moved_counts = counts.clone();
    let report_counts = counts.clone();
    let ending = system.block_on(async move {
        let counts = report_counts;
        let clock = SimClock::new().map_err(|error| error.to_string())?;
        let sim_device = Arc::new(device(&clock, &FaultPlan::default()));
        let sim_storage = Arc::new(nvme(&clock, &FaultPlan::default()));
        let chaos_device: Arc<dyn Device> = Arc::new(ChaosDevice::new(
            sim_device.clone(),
            plan,
            moved_counts.clone(),
        ));
        let storage: Arc<dyn Storage> =
            Arc::new(ChaosStorage::new(sim_storage, plan, moved_counts));
        let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
        let started = LocalSession::start(
            config.clone(),
            layout,
            order.clone(),
            chaos_device,
            storage,
            Arc::new(NoObserver),
        );
        let mut session = match started {
            Ok(session) => session,
            Err(error) => {
                if sim_device.pinned_bytes() != 0 || sim_device.allocated_bytes() != 0 {
                    return Err(format!("a refused start left memory held: {error}"));
                }
                return Ok(Ending::Refused(error));
            }
        };
        let drive = async {
            for _ in 0..steps {
                for &block in &order {
                    let handle = session.acquire(block).await?;
                    tokio::time::sleep(tokio_duration(Duration::from_micros(500))).await;
                    session.release(handle).await;
                }
                session.step_done().await;
            }
            Ok::<(), SessionError>(())
        };
        // Virtual time: an hour passes in no time when every task waits, so a stall is
        // caught at once.
        let outcome = tokio::time::timeout(tokio_duration(Duration::from_secs(3600)), drive)
            .await
            .map_err(|_| {
                format!("the run stalled (an hour of virtual time with no progress); injected {counts:?}")
            })?;
        let stats = session.finish().await;
        if stats.vram.used_bytes != 0 || stats.pinned.used_bytes != 0 {
            return Err(format!(
                "budgets not released: vram {} pinned {} bytes",
                stats.vram.used_bytes, stats.pinned.used_bytes
            ));
        }
        if sim_device.pinned_bytes() != 0 || sim_device.allocated_bytes() != 0 {
            return Err(format!(
                "the device still holds pinned {} and VRAM {} bytes",
                sim_device.pinned_bytes(),
                sim_device.allocated_bytes()
            ));
        }
        Ok(match outcome {
            Ok(()) => Ending::Finished,
            Err(error) => Ending::Failed(error),
        })
    })?;
    if let Ending::Failed(error) | Ending::Refused(error) = &ending {
        let from_a_fault = matches!(
            error,
            SessionError::ReadFailed { .. }
                | SessionError::CopyFailed { .. }
                | SessionError::PinFailed(_)
        );
        if !from_a_fault {
            return Err(format!("ended with an error no fault explains: {error}"));
        }
        if counts.total() == 0 {
            return Err(format!("failed with no fault injected: {error}"));
        }
    }
    Ok((ending, counts))
}

#[test]
fn every_seeded_run_ends_cleanly_with_every_budget_released_and_no_thread_left() {
    let first = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(FIRST_SEED);
    let runs = std::env::var("FAULT_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(RUNS);
    let threads = threads_named(is_ours).len();
    let (mut finished, mut failed, mut refused, mut faults) = (0u64, 0u64, 0u64, 0u64);
    for seed in first..first + runs {
        let (ending, counts) = run_one(seed).unwrap_or_else(|problem| {
            panic!("seed {seed}: {problem}\nreplay: FAULT_SEED={seed} FAULT_RUNS=1 cargo test --test fault_injection_sim")
        });
        assert_eq!(
            settled_threads(is_ours, threads).len(),
            threads,
            "seed {seed}: a thread outlived its run"
        );
        faults += counts.total();
        match ending {
            Ending::Finished => finished += 1,
            Ending::Failed(_) => failed += 1,
            Ending::Refused(_) => refused += 1,
        }
    }
    println!(
        "{runs} runs from seed {first}: {finished} finished, {failed} failed cleanly, {refused} refused at start; {faults} faults injected"
    );
    // The mix must exercise both endings, or the test proves little.
    if runs >= 100 {
        assert!(
            finished > 0 && failed > 0,
            "{finished} finished, {failed} failed"
        );
    }
}
