//! Two loaded models in one shared budget, used in turn (issue 24): a tiny BERT
//! encoder and a tiny Llama decoder under a VRAM budget and pin ceiling that hold
//! about one and a half of them. Each answer equals the model's answer alone with
//! the whole budget, bit for bit; the two models together never hold more than the
//! shared budget (checked at every report either makes); the idle one gives way when
//! the other is used; one unloaded while the other runs gives its room back; after
//! shutdown each holds vram 0 B and pinned 0 B.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use stagehand::compute::DType;
use stagehand::families::llama::DecoderArch;
use stagehand::families::llama::{ExpertHint, Sampling};
use stagehand::families::{DecoderInput, EncoderInput, Extras, PromptInput, WorkloadKind};
use stagehand::run::loaded::{
    open_shared_budget, serve_jobs, BatchLimits, Cancel, EmbedJob, GenerateJob, Job, LoadedOptions,
    NoBatchObserver, SharedMember, TokenEvent,
};
use stagehand::run::{prepare_with, Prepared};
use stagehand::settings::Settings;
use stagehand_actors::{Observer, SharedBudget, StatsSnapshot, Tier, TierUsage};

/// Every tier report of every model, checked against the shared totals as it comes.
struct Ledger {
    totals: (u64, u64),
    latest: Mutex<HashMap<(String, bool), u64>>,
}

struct ModelObserver {
    name: String,
    ledger: Arc<Ledger>,
    /// Bytes this model moved (disk → pinned, pinned → VRAM, disk → VRAM).
    moved: Arc<std::sync::atomic::AtomicU64>,
}

impl Observer for ModelObserver {
    fn transfer(
        &self,
        _link: stagehand_actors::Link,
        _owner: stagehand_actors::Owner,
        bytes: u64,
        _seconds: f64,
    ) {
        self.moved
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    fn tier_usage(&self, tier: Tier, usage: TierUsage) {
        let used = usage.model_bytes + usage.lora_bytes + usage.other_bytes;
        let vram = tier == Tier::Vram;
        let mut latest = self.ledger.latest.lock().unwrap();
        latest.insert((self.name.clone(), vram), used);
        let held: u64 = latest
            .iter()
            .filter(|((_, is_vram), _)| *is_vram == vram)
            .map(|(_, bytes)| bytes)
            .sum();
        let total = if vram {
            self.ledger.totals.0
        } else {
            self.ledger.totals.1
        };
        assert!(held <= total, "{tier:?}: {held} held of a shared {total}");
    }
}

fn prepared(folder: &Path) -> Prepared {
    let extras = Extras::default()
        .with(DecoderInput {
            prompt: PromptInput::TokenIds(vec![0]),
            sampling: Sampling::default(),
            hint: ExpertHint::NextLayer,
        })
        .with(EncoderInput::TokenIds(vec![vec![0]]));
    prepare_with(
        folder,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .unwrap()
}

/// A model's thread answering jobs until its queue closes.
struct Running {
    jobs: flume::Sender<Job>,
    worker: std::thread::JoinHandle<StatsSnapshot>,
}

fn start(
    folder: &Path,
    settings: Settings,
    shared: Option<SharedMember>,
    observer: Arc<dyn Observer>,
) -> Running {
    let prepared = prepared(folder);
    let (jobs, queue) = flume::bounded(4);
    let (ready, started) = flume::bounded(1);
    let worker = std::thread::spawn(move || {
        let options = LoadedOptions {
            settings: &settings,
            limits: BatchLimits {
                max_sequences: 1,
                max_batch_tokens: 4096,
                max_sequence_tokens: 64,
            },
            observer,
            batches: Box::new(NoBatchObserver),
            shared,
        };
        serve_jobs(prepared, options, queue, |info| {
            let _ = ready.send(info.map(|_| ()).map_err(|error| error.to_string()));
        })
        .unwrap()
    });
    started.recv().unwrap().unwrap();
    Running { jobs, worker }
}

fn embed(model: &Running) -> Vec<Vec<u32>> {
    let (reply, answer) = flume::bounded(1);
    let input = EncoderInput::TokenIds(vec![vec![1, 5, 9, 2], vec![3, 4]]);
    let job = EmbedJob {
        input,
        adapter: None,
        reply,
        cancel: Cancel::new(),
    };
    model.jobs.send(Job::Embed(job)).unwrap();
    let embedded = answer.recv().unwrap().unwrap();
    let bits = |row: &Vec<f32>| row.iter().map(|value| value.to_bits()).collect();
    embedded.embeddings.iter().map(bits).collect()
}

fn generate(model: &Running) -> Vec<u32> {
    let (events, tokens) = flume::unbounded();
    let job = GenerateJob {
        prompt: vec![1, 2, 3],
        adapter: None,
        sampling: Sampling::default(),
        max_tokens: 6,
        stop_tokens: Vec::new(),
        events,
        cancel: Cancel::new(),
    };
    model.jobs.send(Job::Generate(job)).unwrap();
    let mut generated = Vec::new();
    for event in tokens.iter() {
        match event {
            TokenEvent::Token(token) => generated.push(token),
            TokenEvent::Finished(_) => break,
            other => panic!("{other:?}"),
        }
    }
    generated
}

fn finish(model: Running) -> StatsSnapshot {
    drop(model.jobs);
    model.worker.join().unwrap()
}

/// A model alone with the whole shared budget.
fn alone_settings(totals: (u64, u64)) -> Settings {
    Settings {
        vram_budget: Some(bytesize::ByteSize::b(totals.0)),
        pin_ceiling: Some(bytesize::ByteSize::b(totals.1)),
        ..Settings::default()
    }
}

#[test]
fn two_models_in_turn_under_one_and_a_half_of_them_answer_as_each_alone() {
    // Proves the load test: outputs equal each model alone, the shared
    // budget is never exceeded, the idle model gives way, and both end at 0 B.
    let dir = tempfile::tempdir().unwrap();
    let bert = common::encoder::tiny_bert(&dir.path().join("bert"), DType::F32);
    let llama =
        common::decoder::tiny_decoder(&dir.path().join("llama"), DecoderArch::Llama, DType::F32, 7);
    let sizes: Vec<u64> = [&bert, &llama]
        .iter()
        .map(|folder| prepared(folder).facts().layout().total_bytes())
        .collect();
    // About one and a half models: three quarters of both.
    let vram = (sizes[0] + sizes[1]) * 3 / 4;
    let totals = (vram, vram);
    let ledger = Arc::new(Ledger {
        totals,
        latest: Mutex::new(HashMap::new()),
    });
    let observer = |name: &str| -> Arc<dyn Observer> {
        Arc::new(ModelObserver {
            name: name.to_string(),
            ledger: Arc::clone(&ledger),
            moved: Default::default(),
        })
    };

    let each_alone = |folder: &Path, name: &str| {
        let model = start(folder, alone_settings(totals), None, observer(name));
        let answers = if name.starts_with("bert") {
            (embed(&model), Vec::new())
        } else {
            (Vec::new(), generate(&model))
        };
        let stats = finish(model);
        assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
        answers
    };
    let bert_alone = each_alone(&bert, "bert-alone").0;
    let llama_alone = each_alone(&llama, "llama-alone").1;
    ledger.latest.lock().unwrap().clear();

    let pool: SharedBudget = open_shared_budget(totals.0, totals.1).unwrap();
    let member = |name: &str| {
        Some(SharedMember {
            pool: pool.clone(),
            name: name.to_string(),
        })
    };
    let encoder = start(&bert, Settings::default(), member("bert"), observer("bert"));
    let decoder = start(
        &llama,
        Settings::default(),
        member("llama"),
        observer("llama"),
    );
    for _turn in 0..3 {
        assert_eq!(embed(&encoder), bert_alone, "the encoder's answer changed");
        let leases = pool.snapshot();
        let held: u64 = leases.iter().map(|member| member.lease.vram_bytes).sum();
        assert!(held <= totals.0, "{leases:?}");
        assert_eq!(
            leases.iter().find(|member| member.rank == 0).unwrap().name,
            "bert"
        );
        assert_eq!(
            generate(&decoder),
            llama_alone,
            "the decoder's answer changed"
        );
        let leases = pool.snapshot();
        let idle = leases.iter().find(|member| member.name == "bert").unwrap();
        // The idle encoder gave way, but only part of it: a partial unload.
        assert!(
            idle.lease.vram_bytes < idle.ask.want.vram_bytes,
            "{leases:?}"
        );
        assert!(
            idle.lease.vram_bytes >= idle.ask.floor.vram_bytes,
            "{leases:?}"
        );
    }
    // Unloading a model while the other runs: the encoder leaves, and the decoder's
    // next job grows into the room it gave back, with the same answer.
    let lease_of = |name: &str| {
        let leases = pool.snapshot();
        leases
            .into_iter()
            .find(|member| member.name == name)
            .map(|member| member.lease)
    };
    let before = lease_of("llama").unwrap();
    let encoder_stats = finish(encoder);
    assert_eq!(lease_of("bert"), None, "the encoder left the shared budget");
    assert_eq!(
        generate(&decoder),
        llama_alone,
        "the decoder's answer changed"
    );
    let after = lease_of("llama").unwrap();
    assert!(
        after.vram_bytes > before.vram_bytes,
        "{before:?} → {after:?}"
    );
    assert!(after.vram_bytes <= totals.0);
    let decoder_stats = finish(decoder);
    for stats in [encoder_stats, decoder_stats] {
        assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
    }
    assert!(
        pool.snapshot().is_empty(),
        "both models left the shared budget"
    );
}

/// Seconds of a job and the bytes it moved.
type Timed = (f64, u64);

/// Seconds of `job`, and the bytes `moved` grew by during it.
fn timed(moved: &std::sync::atomic::AtomicU64, job: impl FnOnce()) -> Timed {
    let before = moved.load(std::sync::atomic::Ordering::Relaxed);
    let started = std::time::Instant::now();
    job();
    let seconds = started.elapsed().as_secs_f64();
    (
        seconds,
        moved.load(std::sync::atomic::Ordering::Relaxed) - before,
    )
}

/// A generated Llama of the small preset (tens of MiB), seeded with `seed`.
fn small_decoder(dir: &Path, seed: u64) -> std::path::PathBuf {
    let demo = stagehand::families::llama::DecoderDemo {
        arch: DecoderArch::Llama,
        preset: stagehand::families::llama::DecoderPreset::Small,
        dtype: DType::F32,
        seed,
        shard_bytes: 1 << 30,
    };
    stagehand::families::llama::write_decoder_folder(dir, &demo).unwrap()
}

#[test]
#[ignore = "a measurement for BENCHMARKS.md, run in release with --ignored --nocapture"]
fn measure_two_models_in_turn_against_each_alone() {
    // Measures (asserts nothing on time): two small generated decoders, each job 6
    // tokens; each model's job alone with the whole budget, the same in turn in a
    // shared budget of three quarters of both, and the first job after a switch (its
    // extra time and bytes over the next job are the switch's cost).
    let dir = tempfile::tempdir().unwrap();
    let folders = [
        small_decoder(&dir.path().join("a"), 7),
        small_decoder(&dir.path().join("b"), 11),
    ];
    let size = |folder: &Path| prepared(folder).facts().layout().total_bytes();
    let vram = (size(&folders[0]) + size(&folders[1])) * 3 / 4;
    let totals = (vram, vram);
    let ledger = Arc::new(Ledger {
        totals,
        latest: Mutex::new(HashMap::new()),
    });
    let rounds = 10;
    let observed = |name: &str| {
        let moved: Arc<std::sync::atomic::AtomicU64> = Default::default();
        let observer: Arc<dyn Observer> = Arc::new(ModelObserver {
            name: name.to_string(),
            ledger: Arc::clone(&ledger),
            moved: Arc::clone(&moved),
        });
        (observer, moved)
    };
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    // Every measured job is interleaved with the others, so load from other work on
    // the machine falls on all of them alike: in each round, each model alone (its own
    // session with the whole budget, checked by a ledger of its own), then each in
    // the shared budget twice.
    let apart = Arc::new(Ledger {
        totals: (u64::MAX / 4, u64::MAX / 4),
        latest: Mutex::new(HashMap::new()),
    });
    let mut alone = Vec::new();
    for (index, folder) in folders.iter().enumerate() {
        let moved: Arc<std::sync::atomic::AtomicU64> = Default::default();
        let observer: Arc<dyn Observer> = Arc::new(ModelObserver {
            name: format!("alone-{index}"),
            ledger: Arc::clone(&apart),
            moved: Arc::clone(&moved),
        });
        alone.push((start(folder, alone_settings(totals), None, observer), moved));
    }
    let pool = open_shared_budget(totals.0, totals.1).unwrap();
    let mut models = Vec::new();
    for (index, folder) in folders.iter().enumerate() {
        let (observer, moved) = observed(&format!("m{index}"));
        let member = Some(SharedMember {
            pool: pool.clone(),
            name: format!("m{index}"),
        });
        models.push((start(folder, Settings::default(), member, observer), moved));
    }
    let mut alone_runs = [Vec::new(), Vec::new()];
    let mut figures = [Vec::new(), Vec::new()];
    for _round in 0..rounds {
        for (index, (model, moved)) in alone.iter().enumerate() {
            alone_runs[index].push(timed(moved, || drop(generate(model))));
        }
        for (index, (model, moved)) in models.iter().enumerate() {
            let first = timed(moved, || drop(generate(model)));
            let again = timed(moved, || drop(generate(model)));
            figures[index].push((first, again));
        }
    }
    let leases = pool.snapshot();
    for (model, _) in models.into_iter().chain(alone) {
        finish(model);
    }
    let alone: Vec<(f64, f64)> = alone_runs
        .iter()
        .map(|runs| {
            let seconds = median(runs.iter().map(|run| run.0).collect());
            (
                seconds,
                median(runs.iter().map(|run| run.1 as f64).collect()),
            )
        })
        .collect();
    println!(
        "shared budget {vram} B (vram and pin); models {} and {} B; leases at the end {leases:?}",
        size(&folders[0]),
        size(&folders[1])
    );
    for (index, runs) in figures.iter().enumerate() {
        let pick = |f: &dyn Fn(&(Timed, Timed)) -> f64| median(runs.iter().map(f).collect());
        let (first_seconds, first_bytes) = (pick(&|run| run.0 .0), pick(&|run| run.0 .1 as f64));
        let (steady_seconds, steady_bytes) = (pick(&|run| run.1 .0), pick(&|run| run.1 .1 as f64));
        println!(
            "model {index}: alone {:.2} ms, {:.0} B moved per job; shared steady {:.2} ms ({:.2}x alone), {steady_bytes:.0} B per job; first job after a switch {:.2} ms ({:.2} ms more), {first_bytes:.0} B ({:.0} B more)",
            alone[index].0 * 1e3,
            alone[index].1,
            steady_seconds * 1e3,
            steady_seconds / alone[index].0,
            first_seconds * 1e3,
            (first_seconds - steady_seconds) * 1e3,
            first_bytes - steady_bytes,
        );
    }
}
