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
        decoder: Some(DecoderInput {
            prompt: PromptInput::TokenIds(vec![0]),
            sampling: Sampling::default(),
            hint: ExpertHint::NextLayer,
        }),
        encoder: Some(EncoderInput::TokenIds(vec![vec![0]])),
        ..Extras::default()
    };
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
            observer: std::sync::Arc::new(NoObserver),
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
    let (events, tokens) = flume::unbounded();
    let job = GenerateJob {
        prompt: vec![1, 2, 3],
        adapter: adapter.map(str::to_string),
        sampling: Sampling::default(),
        max_tokens: 6,
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
