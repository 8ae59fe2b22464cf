//! Fault injection on the CPU backend, where threads, files and bytes are real: seeded
//! read errors, short reads, slow reads, failed pins and failed copies strike the
//! demo workload (verified bit for bit) at random points. After every run: it ended
//! cleanly (verified, or failed with the error of a fault), both budgets are back at
//! zero, every thread it started has been joined, and no temporary file is left. The
//! cache's writes get the same treatment: a write that fails at a random byte leaves
//! neither a temporary file nor a partial model. A failure prints the seed:
//!
//!     FAULT_SEED=<seed> FAULT_RUNS=1 cargo test --test fault_injection_cpu

mod common;

use common::threads::{is_ours, settled_threads, threads_named};

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use stagehand::actors::{BlockId, Device, NoObserver, ResidencyPolicy, Session, SessionError};
use stagehand::device::CpuDevice;
use stagehand::families::FamilyError;
use stagehand::model::cache::write_atomically;
use stagehand::run::driver::{drive_cpu, DriverOptions};
use stagehand::run::{open_model_storage, prepare, session_config, Budgets, WorkloadKind};
use stagehand::settings::Settings;
use stagehand::sim::{ChaosCounts, ChaosDevice, ChaosPlan, ChaosStorage, SplitMix64};

const KIB: u64 = 1024;
const RUNS: u64 = 60;
const FIRST_SEED: u64 = 0xC0DE_0000;

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("listable")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| name.ends_with(".tmp"))
        .collect()
}

fn seeds() -> std::ops::Range<u64> {
    let first = std::env::var("FAULT_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or(FIRST_SEED);
    let runs: u64 = std::env::var("FAULT_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(RUNS);
    first..first + runs
}

fn fault_error(error: &FamilyError) -> bool {
    matches!(
        error,
        FamilyError::Session(
            SessionError::ReadFailed { .. }
                | SessionError::CopyFailed { .. }
                | SessionError::PinFailed(_)
        )
    )
}

#[test]
fn seeded_faults_on_the_cpu_backend_end_cleanly_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = common::demo::small_demo_model(dir.path());
    let threads = threads_named(is_ours).len();
    let (mut verified, mut failed, mut refused) = (0, 0, 0);
    for seed in seeds() {
        let mut rng = SplitMix64::new(seed);
        let mut settings = Settings {
            fast_disk: rng.next_u64() % 3 == 0,
            ..Settings::default()
        };
        settings.staging_buffer_size = bytesize::ByteSize::kib(256);
        let prepared = prepare(&model, WorkloadKind::Auto, 4, &settings, true).expect("prepares");
        // Blocks of 512 KiB: the ring needs depth + 1 of them, the rest is resident.
        let depth = 1 + (rng.next_u64() % 3) as u32;
        let budgets = Budgets {
            vram_budget_bytes: (u64::from(depth) + 1 + rng.next_u64() % 5) * 512 * KIB,
            pin_ceiling_bytes: (2048 + (rng.next_u64() % 4) * 512) * KIB,
        };
        let config = session_config(&settings, budgets, depth, ResidencyPolicy::Planned);
        let plan = ChaosPlan::drawn(seed, Duration::from_millis(1 + rng.next_u64() % 3));
        let counts = Arc::new(ChaosCounts::default());
        let layout = prepared.index.layout();
        let device: Arc<dyn Device> = Arc::new(ChaosDevice::new(
            Arc::new(CpuDevice::new(budgets.vram_budget_bytes).expect("device")),
            plan,
            counts.clone(),
        ));
        let storage = Arc::new(ChaosStorage::new(
            open_model_storage(&prepared.index, &settings, None).expect("storage"),
            plan,
            counts.clone(),
        ));
        let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
        let started = Session::start(config, layout, order, device, storage, Arc::new(NoObserver));
        match started {
            Err(SessionError::PinFailed(_)) => refused += 1,
            Err(error) => panic!("seed {seed}: the start failed with {error}"),
            Ok(session) => {
                let options = DriverOptions::steps(2 + rng.next_u64() % 3);
                let stats = match drive_cpu(session, &prepared.workload, &prepared.index, options) {
                    Ok(report) => {
                        verified += 1;
                        report.stats
                    }
                    Err(failure) => {
                        let (error, stats) = *failure;
                        assert!(
                            fault_error(&error) && counts.total() > 0,
                            "seed {seed}: failed with {error} ({counts:?})"
                        );
                        failed += 1;
                        stats
                    }
                };
                assert_eq!(
                    (stats.vram.used_bytes, stats.pinned.used_bytes),
                    (0, 0),
                    "seed {seed}: budgets released"
                );
            }
        }
        assert_eq!(
            settled_threads(is_ours, threads).len(),
            threads,
            "seed {seed}: every thread joined"
        );
        assert_eq!(temporaries(dir.path()), Vec::<String>::new(), "seed {seed}");
    }
    println!("{verified} verified, {failed} failed cleanly, {refused} refused at start");
    if seeds().count() >= 20 {
        assert!(
            verified > 0 && failed > 0,
            "{verified} verified, {failed} failed"
        );
    }
}

#[test]
fn a_cache_write_that_fails_at_a_random_byte_leaves_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("model.safetensors");
    for seed in seeds() {
        let mut rng = SplitMix64::new(seed);
        let total = 1 + rng.next_u64() % (1 << 20);
        let fail_at = rng.next_u64() % (total + 1);
        let written = write_atomically(&path, |mut file| {
            let chunk = vec![7u8; 4096];
            let mut done = 0;
            while done < total {
                let length = (total - done).min(chunk.len() as u64);
                if done + length > fail_at {
                    return Err(std::io::Error::other("injected write failure"));
                }
                file.write_all(&chunk[..length as usize])?;
                done += length;
            }
            Ok(())
        });
        assert_eq!(written.is_ok(), fail_at >= total, "seed {seed}");
        assert_eq!(temporaries(dir.path()), Vec::<String>::new(), "seed {seed}");
        if written.is_ok() {
            assert_eq!(std::fs::metadata(&path).expect("written").len(), total);
            std::fs::remove_file(&path).expect("removed");
        } else {
            assert!(!path.exists(), "seed {seed}: no partial model");
        }
    }
}
