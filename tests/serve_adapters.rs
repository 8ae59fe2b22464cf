//! Per-request LoRA adapters on a kept-loaded model (issue 24, `"model":
//! "NAME:ADAPTER"`): a tiny Llama decoder and a tiny BERT encoder, each loaded once
//! with two (or one) adapters it switches between per job, streamed under a VRAM
//! budget below the model. Every answer equals the same job on a model opened with
//! that adapter as its own `--lora` (or with none) — decoders bit for bit, encoders
//! within the ulps a larger step moves — whether its job ran alone or beside jobs of
//! other adapters; a job naming an adapter the model does not
//! have is refused with the names it has; after shutdown nothing is held.

mod common;
mod serve_support;

use std::path::{Path, PathBuf};

use stagehand::families::llama::{ExpertHint, Sampling};
use stagehand::families::{DecoderInput, EncoderInput, Extras, PromptInput, WorkloadKind};
use stagehand::lora::LoraSpec;
use stagehand::run::loaded::{
    serve_jobs, BatchLimits, Cancel, EmbedJob, GenerateJob, Job, LoadedOptions, NoBatchObserver,
    TokenEvent,
};
use stagehand::run::{prepare_with, Prepared, RunError};
use stagehand::settings::Settings;
use stagehand_actors::{NoObserver, StatsSnapshot};

/// `folder` with `own` as its `--lora` and `adapters` to choose per job.
fn prepared(folder: &Path, own: Option<&Path>, adapters: &[(&str, &Path)]) -> Prepared {
    let spec = |path: &Path| LoraSpec {
        path: path.to_path_buf(),
        strength: 1.0,
    };
    let extras = Extras {
        loras: own.map(spec).into_iter().collect(),
        ..Extras::default()
    }
    .with(DecoderInput {
        prompt: PromptInput::TokenIds(vec![0]),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    })
    .with(EncoderInput::TokenIds(vec![vec![0]]));
    let mut prepared = prepare_with(
        folder,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .unwrap();
    for (name, path) in adapters {
        prepared.add_adapter(name, &[spec(path)]).unwrap();
    }
    prepared
}

/// A model's thread answering jobs until its queue closes.
struct Running {
    jobs: flume::Sender<Job>,
    worker: std::thread::JoinHandle<StatsSnapshot>,
}

/// Streams under `vram` bytes (below the model), `sequences` decoded together.
fn start(prepared: Prepared, vram: u64, sequences: usize) -> Running {
    start_observed(prepared, vram, sequences, std::sync::Arc::new(NoObserver))
}

/// [`start`], the session reporting to `observer`.
fn start_observed(
    prepared: Prepared,
    vram: u64,
    sequences: usize,
    observer: std::sync::Arc<dyn stagehand_actors::Observer>,
) -> Running {
    let (jobs, queue) = flume::bounded(16);
    let (ready, started) = flume::bounded(1);
    let worker = std::thread::spawn(move || {
        let settings = Settings {
            vram_budget: Some(bytesize::ByteSize::b(vram)),
            ..Settings::default()
        };
        let options = LoadedOptions {
            settings: &settings,
            limits: BatchLimits {
                max_sequences: sequences,
                max_batch_tokens: 4096,
                max_sequence_tokens: 64,
            },
            observer,
            batches: Box::new(NoBatchObserver),
            shared: None,
        };
        serve_jobs(prepared, options, queue, |info| {
            let _ = ready.send(info.map(|_| ()).map_err(|error| error.to_string()));
        })
        .unwrap()
    });
    started.recv().unwrap().unwrap();
    Running { jobs, worker }
}

/// Stops the model; every budget is released.
fn finish(model: Running) {
    drop(model.jobs);
    let stats = model.worker.join().unwrap();
    assert_eq!((stats.vram.used_bytes, stats.pinned.used_bytes), (0, 0));
}

fn submit_generation(model: &Running, adapter: Option<&str>) -> flume::Receiver<TokenEvent> {
    submit_tokens(model, adapter, 6)
}

fn submit_tokens(
    model: &Running,
    adapter: Option<&str>,
    max_tokens: u64,
) -> flume::Receiver<TokenEvent> {
    let (events, tokens) = flume::unbounded();
    let job = GenerateJob {
        prompt: vec![1, 2, 3],
        adapter: adapter.map(str::to_string),
        sampling: Sampling::default(),
        max_tokens,
        stop_tokens: Vec::new(),
        events,
        cancel: Cancel::new(),
    };
    model.jobs.send(Job::Generate(job)).unwrap();
    tokens
}

/// The tokens of a generation, or why it was refused.
fn tokens(events: flume::Receiver<TokenEvent>) -> Result<Vec<u32>, String> {
    let mut generated = Vec::new();
    for event in events.iter() {
        match event {
            TokenEvent::Token(token) => generated.push(token),
            TokenEvent::Finished(_) => return Ok(generated),
            TokenEvent::Refused(why) | TokenEvent::Failed(why) => return Err(why),
        }
    }
    panic!("the model stopped mid-generation");
}

fn submit_embedding(
    model: &Running,
    adapter: Option<&str>,
) -> flume::Receiver<Result<stagehand::run::loaded::Embedded, RunError>> {
    let (reply, answer) = flume::bounded(1);
    let job = EmbedJob {
        input: EncoderInput::TokenIds(vec![vec![1, 5, 9, 2], vec![3, 4, 7, 8]]),
        adapter: adapter.map(str::to_string),
        reply,
        cancel: Cancel::new(),
    };
    model.jobs.send(Job::Embed(job)).unwrap();
    answer
}

type Answer = flume::Receiver<Result<stagehand::run::loaded::Embedded, RunError>>;

/// The embeddings, or why they were refused.
fn embeddings(answer: Answer) -> Result<Vec<Vec<f32>>, String> {
    let embedded = answer.recv().unwrap().map_err(|error| error.to_string())?;
    Ok(embedded.embeddings)
}

/// The largest difference between two sets of embeddings of the same texts.
fn distance(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Bytes of the weights in `folder`.
fn weights(folder: &Path) -> u64 {
    std::fs::read_dir(folder)
        .unwrap()
        .flatten()
        .filter(|entry| {
            entry
                .path()
                .extension()
                .is_some_and(|ext| ext == "safetensors")
        })
        .map(|entry| entry.metadata().unwrap().len())
        .sum()
}

fn setup() -> (tempfile::TempDir, PathBuf, PathBuf, [(PathBuf, PathBuf); 2]) {
    let dir = tempfile::tempdir().unwrap();
    let (bert, llama) = serve_support::models(dir.path());
    let first = serve_support::adapters(dir.path(), 1);
    let second = serve_support::adapters(dir.path(), 2);
    (dir, bert, llama, [first, second])
}

#[test]
fn a_decoder_answers_each_job_with_its_adapter_alone_or_beside_other_adapters() {
    // Proves a job naming an adapter decodes what a model with that adapter as its
    // own LoRA decodes, bit for bit, while jobs of the base and of another adapter
    // share the model (grouped into a step per adapter each round), streamed.
    let (_dir, _, llama, [(_, a), (_, b)]) = setup();
    let vram = weights(&llama) / 2;
    let alone = |own: Option<&Path>| {
        let model = start(prepared(&llama, own, &[]), vram, 1);
        let answer = tokens(submit_generation(&model, None)).unwrap();
        finish(model);
        answer
    };
    let (plain, with_a, with_b) = (alone(None), alone(Some(&a)), alone(Some(&b)));
    assert_ne!(plain, with_a, "adapter a changes the greedy answer");
    assert_ne!(plain, with_b, "adapter b changes the greedy answer");
    assert_ne!(with_a, with_b, "the two adapters differ");

    let served = start(prepared(&llama, None, &[("a", &a), ("b", &b)]), vram, 8);
    let asked = [None, Some("a"), Some("b"), Some("a"), None, Some("b")];
    let pending: Vec<_> = asked
        .iter()
        .map(|adapter| submit_generation(&served, *adapter))
        .collect();
    for (adapter, events) in asked.iter().zip(pending) {
        let expected = match adapter {
            None => &plain,
            Some("a") => &with_a,
            _ => &with_b,
        };
        assert_eq!(&tokens(events).unwrap(), expected, "{adapter:?}");
    }
    // One at a time too (the switch between two jobs, not within a round).
    for (adapter, expected) in [(Some("b"), &with_b), (None, &plain), (Some("a"), &with_a)] {
        let answer = tokens(submit_generation(&served, adapter)).unwrap();
        assert_eq!(&answer, expected, "{adapter:?} alone");
    }
    let refused = tokens(submit_generation(&served, Some("zzz"))).unwrap_err();
    assert!(
        refused.contains("no adapter `zzz`") && refused.contains("a, b"),
        "{refused}"
    );
    finish(served);
}

#[test]
fn an_encoder_embeds_each_job_with_its_adapter_and_never_mixes_two_in_a_step() {
    // Proves embeddings with an adapter equal a model with that adapter as its own
    // LoRA when base and adapter jobs queue together (each step gathers jobs of one
    // adapter only), and that an unknown adapter is refused by name. Not bit for bit:
    // jobs of one adapter share a step, and the GEMM blocks its rows by the step's
    // row count (tests/serve_batching.rs), so a value moves by an ulp or so — 1e-6
    // bounds it, against the adapter's own effect of more than 1e-3.
    let (_dir, bert, _, [(a, _), _]) = setup();
    let vram = weights(&bert) / 2;
    let alone = |own: Option<&Path>| {
        let model = start(prepared(&bert, own, &[]), vram, 1);
        let answer = embeddings(submit_embedding(&model, None)).unwrap();
        finish(model);
        answer
    };
    let (plain, with_a) = (alone(None), alone(Some(&a)));
    let effect = distance(&plain, &with_a);
    assert!(
        effect > 1e-3,
        "the adapter changes the embeddings by {effect}"
    );

    let served = start(prepared(&bert, None, &[("a", &a)]), vram, 1);
    let asked = [Some("a"), None, None, Some("a"), Some("a"), None];
    let pending: Vec<_> = asked
        .iter()
        .map(|adapter| submit_embedding(&served, *adapter))
        .collect();
    for (adapter, answer) in asked.iter().zip(pending) {
        let expected = if adapter.is_some() { &with_a } else { &plain };
        let difference = distance(&embeddings(answer).unwrap(), expected);
        assert!(difference <= 1e-6, "{adapter:?}: {difference} from alone");
    }
    let refused = embeddings(submit_embedding(&served, Some("zzz"))).unwrap_err();
    assert!(refused.contains("no adapter `zzz`"), "{refused}");
    finish(served);
}

/// Counts the bytes every link moves.
#[derive(Default)]
struct Moved(std::sync::atomic::AtomicU64);

impl stagehand_actors::Observer for Moved {
    fn transfer(
        &self,
        _link: stagehand_actors::Link,
        _owner: stagehand_actors::Owner,
        bytes: u64,
        _seconds: f64,
    ) {
        self.0
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A rank-`rank` PEFT adapter on q_proj and v_proj of every layer of the decoder in
/// `folder` (its sizes from `config.json`), seeded with `seed`.
fn decoder_adapter(folder: &Path, rank: usize, seed: usize) -> PathBuf {
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder.join("config.json")).unwrap())
            .unwrap();
    let number = |key: &str| config[key].as_u64().unwrap() as usize;
    let hidden = number("hidden_size");
    let heads = number("num_attention_heads");
    let kv = number("num_key_value_heads") * (hidden / heads);
    let ramp = |count: usize, scale: f32, salt: usize| -> Vec<f32> {
        (0..count)
            .map(|i| (((i + salt) * 7919 % 97) as f32 / 97.0 - 0.5) * scale)
            .collect()
    };
    let mut tensors = Vec::new();
    for layer in 0..number("num_hidden_layers") {
        for (target, out) in [("q_proj", hidden), ("v_proj", kv)] {
            let module = format!("base_model.model.model.layers.{layer}.self_attn.{target}");
            let salt = seed * 13 + layer;
            tensors.push((
                format!("{module}.lora_A.weight"),
                vec![rank, hidden],
                ramp(rank * hidden, 0.1, salt),
            ));
            tensors.push((
                format!("{module}.lora_B.weight"),
                vec![out, rank],
                ramp(out * rank, 0.5, salt + 5),
            ));
        }
    }
    let named: Vec<(&str, Vec<usize>, Vec<f32>)> = tensors
        .iter()
        .map(|(name, shape, values)| (name.as_str(), shape.clone(), values.clone()))
        .collect();
    let path = folder.with_file_name(format!("adapter-{seed}.safetensors"));
    common::lora::write_f32_tensors(&path, &named);
    path
}

#[test]
#[ignore = "a measurement for BENCHMARKS.md, run in release with --ignored --nocapture"]
fn measure_what_an_adapter_per_request_costs() {
    // Measures (asserts nothing on time): a generated small Llama (f32) streamed at
    // 40 % of its weights, loaded once with two rank-16 adapters. Jobs of 16 tokens
    // one at a time: the base, adapter a every time, a and b in turn (each job pays
    // a switch); then 4 concurrent jobs of one adapter against 2 + 2 of two.
    let dir = tempfile::tempdir().unwrap();
    let demo = stagehand::families::llama::DecoderDemo {
        arch: stagehand::families::llama::DecoderArch::Llama,
        preset: stagehand::families::llama::DecoderPreset::Small,
        dtype: stagehand::compute::DType::F32,
        seed: 7,
        shard_bytes: 1 << 30,
    };
    let folder =
        stagehand::families::llama::write_decoder_folder(&dir.path().join("llama"), &demo).unwrap();
    let (a, b) = (
        decoder_adapter(&folder, 16, 1),
        decoder_adapter(&folder, 16, 2),
    );
    let vram = weights(&folder) * 2 / 5;
    let moved = std::sync::Arc::new(Moved::default());
    let observer = std::sync::Arc::clone(&moved) as std::sync::Arc<dyn stagehand_actors::Observer>;
    let model = start_observed(
        prepared(&folder, None, &[("a", &a), ("b", &b)]),
        vram,
        8,
        observer,
    );
    let bytes = || moved.0.load(std::sync::atomic::Ordering::Relaxed);
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values[values.len() / 2]
    };
    let tokens = 16;
    let one_at_a_time = |adapters: &[Option<&str>]| {
        let mut seconds = Vec::new();
        let mut moved = Vec::new();
        for _round in 0..3 {
            for adapter in adapters {
                let (before, started) = (bytes(), std::time::Instant::now());
                tokens_of(submit_tokens(&model, *adapter, tokens));
                seconds.push(started.elapsed().as_secs_f64());
                moved.push((bytes() - before) as f64);
            }
        }
        (median(seconds), median(moved))
    };
    one_at_a_time(&[None, Some("a")]); // warm every path once
    let rows = [
        ("adapter a every job", one_at_a_time(&[Some("a"); 3])),
        ("base, one job at a time", one_at_a_time(&[None; 3])),
        (
            "a and b in turn (a switch each job)",
            one_at_a_time(&[Some("a"), Some("b")]),
        ),
        ("base again", one_at_a_time(&[None; 3])),
    ];
    for (what, (seconds, moved)) in rows {
        eprintln!(
            "{what}: {:.1} ms a job of {tokens} tokens, {:.2} MiB moved a job",
            seconds * 1e3,
            moved / f64::from(1 << 20)
        );
    }
    let together = |adapters: &[Option<&str>]| {
        let mut seconds = Vec::new();
        for _round in 0..3 {
            let started = std::time::Instant::now();
            let pending: Vec<_> = adapters
                .iter()
                .map(|adapter| submit_tokens(&model, *adapter, tokens))
                .collect();
            pending.into_iter().for_each(tokens_of);
            seconds.push(started.elapsed().as_secs_f64());
        }
        median(seconds)
    };
    let same = together(&[Some("a"); 4]);
    let mixed = together(&[Some("a"), Some("b"), Some("a"), Some("b")]);
    eprintln!(
        "4 concurrent jobs: one adapter {:.1} ms, two adapters (2 + 2) {:.1} ms ({:.2}x)",
        same * 1e3,
        mixed * 1e3,
        mixed / same
    );
    finish(model);
}

/// The tokens of a generation that must succeed.
fn tokens_of(events: flume::Receiver<TokenEvent>) {
    tokens(events).unwrap();
}
