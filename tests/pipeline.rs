//! The prompt-to-image pipeline against diffusers: `tests/fixtures/pipeline` holds a
//! tiny `FluxPipeline` of the real classes (CLIPTextModel, T5EncoderModel,
//! FluxTransformer2DModel, AutoencoderKL; seeded bf16-valued weights, tokenizers
//! trained by the script) saved by `save_pretrained`, and what diffusers and
//! transformers computed from it (`scripts/make-pipeline-fixtures.py`). Each model
//! streams under part of its size, checked step by step against its fully-resident
//! pass, and agrees with the reference within the stated tolerance; the whole
//! pipeline from the same prompt and starting noise gives diffusers' image.

use std::path::{Path, PathBuf};

use bytesize::ByteSize;
use stagehand::families::flux::read_tensors;
use stagehand::families::prompt_tokens::PromptTokenizer;
use stagehand::families::vae::LatentInput;
use stagehand::families::PromptLength;
use stagehand::pipeline::{generate, FluxParts, ImageRequest, PipelineRun};
use stagehand::run::driver::Model;
use stagehand::run::{
    execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;
use stagehand::telemetry::{exposition, PrometheusObserver};
use stagehand::EncoderInput;

#[path = "pipeline/layouts.rs"]
mod layouts;

/// Largest difference allowed relative to the reference's largest magnitude: f32 on
/// both sides in other summation orders.
const TEXT_TOLERANCE: f32 = 1e-5;
const IMAGE_TOLERANCE: f32 = 1e-4;

const PROMPT: &str = "A photo of a red fox sitting in the snow, highly detailed!";
const MAX_SEQUENCE_LENGTH: usize = 16;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pipeline")
}

fn pipeline() -> PathBuf {
    fixtures().join("flux-tiny")
}

fn expected(name: &str) -> Vec<f32> {
    read_tensors(&fixtures().join("expected.safetensors"))
        .expect("reads the expected outputs")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("expected.safetensors has no {name}"))
        .2
}

/// Largest |a − b| over the largest |b|.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths");
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn prompt_extras() -> Extras {
    Extras::default()
        .with(EncoderInput::Texts(vec![PROMPT.to_string()]))
        .with(PromptLength(MAX_SEQUENCE_LENGTH))
}

fn prepare(model: &Path, extras: &Extras) -> Prepared {
    prepare_with(
        model,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        extras,
    )
    .expect("opens")
}

/// Runs `steps` streamed under a budget a block short of the model's and its
/// activations (the text encoders' token table is most of them), each step checked
/// against the fully-resident pass.
fn streamed(prepared: &Prepared, steps: u64) -> Outcome {
    let layout = prepared.facts().layout();
    let smallest = layout
        .blocks
        .iter()
        .map(|block| block.bytes)
        .min()
        .unwrap_or(0);
    let vram = layout.total_bytes() - smallest + prepared.activation_bytes(steps);
    let settings = Settings::default();
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(
            &settings,
            Budgets {
                vram_budget_bytes: vram,
                pin_ceiling_bytes: 64 << 20,
            },
            steps,
        )
    };
    let outcome = execute(prepared, plan).expect("runs");
    assert_eq!(outcome.report.verified_steps, steps, "streamed = resident");
    assert!(
        outcome
            .report
            .plan
            .vram
            .resident
            .iter()
            .any(|resident| !resident),
        "some block streams"
    );
    outcome
}

/// A pipeline's stages under `settings`, unobserved and quiet.
fn pipeline_run(settings: &Settings) -> PipelineRun<'_> {
    PipelineRun {
        settings,
        observer: stagehand::run::no_observer(),
        progress: std::sync::Arc::new(|_, _, _| {}),
        stop: stagehand::signals::stop_flag(),
        shared: None,
        stages: None,
    }
}

fn first_output(outcome: &Outcome) -> Vec<f32> {
    outcome
        .report
        .outputs
        .values()
        .next()
        .cloned()
        .expect("an output")
}

#[test]
fn clip_gives_transformers_pooled_vector_and_states_streamed() {
    // Proves the CLIP family (causal mask, quick GELU, final norm, pooled at the
    // end-of-text token) computes CLIPTextModel's outputs from the pipeline folder,
    // tokenized as FluxPipeline tokenizes, streamed bit-exactly.
    let prepared = prepare(&pipeline().join("text_encoder"), &prompt_extras());
    assert_eq!(prepared.family.name, "clip");
    let output = first_output(&streamed(&prepared, 1));
    let pooled = expected("clip_pooled");
    let hidden = expected("clip_hidden");
    assert_eq!(output.len(), pooled.len() + hidden.len());
    let pooled_error = relative_difference(&output[..pooled.len()], &pooled);
    let hidden_error = relative_difference(&output[pooled.len()..], &hidden);
    assert!(
        pooled_error < TEXT_TOLERANCE,
        "pooled off by {pooled_error}"
    );
    assert!(
        hidden_error < TEXT_TOLERANCE,
        "states off by {hidden_error}"
    );
}

#[test]
fn t5_gives_transformers_states_streamed() {
    // Proves the T5 family (RMS norms, the shared relative position bias, unscaled
    // scores, gated tanh GELU) computes T5EncoderModel's states of the padded prompt.
    let prepared = prepare(&pipeline().join("text_encoder_2"), &prompt_extras());
    assert_eq!(prepared.family.name, "t5");
    let output = first_output(&streamed(&prepared, 1));
    let error = relative_difference(&output, &expected("t5_states"));
    assert!(error < TEXT_TOLERANCE, "states off by {error}");
}

#[test]
fn both_tokenizers_give_the_ids_flux_pipeline_gave() {
    // Proves CLIP's ids (77, padded with <|endoftext|>) from tokenizer.json and from
    // the published vocab.json + merges.txt, and T5's (16, padded with <pad>), equal
    // the ids diffusers fed its encoders.
    let ids = |name: &str| -> Vec<u32> { expected(name).iter().map(|&id| id as u32).collect() };
    let clip = PromptTokenizer::for_encoder(&pipeline().join("text_encoder"), 77, "<|endoftext|>")
        .expect("CLIP tokenizer");
    assert!(clip.source.ends_with("tokenizer"));
    assert_eq!(clip.encode(PROMPT).expect("encodes").ids, ids("clip_ids"));
    let copy = tempfile::tempdir().expect("temp dir");
    let published = copy.path().join("tokenizer");
    std::fs::create_dir(&published).expect("folder");
    for name in ["vocab.json", "merges.txt", "tokenizer_config.json"] {
        std::fs::copy(
            pipeline().join("tokenizer").join(name),
            published.join(name),
        )
        .expect("copies");
    }
    std::fs::create_dir(copy.path().join("text_encoder")).expect("folder");
    let from_vocab =
        PromptTokenizer::for_encoder(&copy.path().join("text_encoder"), 77, "<|endoftext|>")
            .expect("CLIP from vocab.json + merges.txt");
    assert_eq!(
        from_vocab.encode(PROMPT).expect("encodes").ids,
        ids("clip_ids")
    );
    let t5 = PromptTokenizer::for_encoder(
        &pipeline().join("text_encoder_2"),
        MAX_SEQUENCE_LENGTH,
        "<pad>",
    )
    .expect("T5 tokenizer");
    let encoded = t5.encode(PROMPT).expect("encodes");
    assert_eq!(encoded.ids, ids("t5_ids"));
    assert!(
        encoded.truncated,
        "the fixture's prompt is longer than 16 tokens"
    );
}

#[test]
fn the_vae_decodes_as_diffusers_decodes_streamed() {
    // Proves the VAE family (un-scaling by 0.3611 and 0.1159, ResNet blocks, the mid
    // attention, nearest upsampling, GroupNorm) gives AutoencoderKL.decode's image.
    decodes_as_diffusers(&pipeline().join("vae"));
}

/// The VAE at `model` decodes the fixture's latent into diffusers' image, streamed
/// bit-exactly.
fn decodes_as_diffusers(model: &Path) {
    let latent = expected("vae_latent");
    let extras = Extras::default().with(LatentInput {
        latents: vec![latent],
        height: 8,
        width: 6,
        tile: None,
    });
    let prepared = prepare(model, &extras);
    assert_eq!(prepared.family.name, "vae");
    let output = first_output(&streamed(&prepared, 1));
    let error = relative_difference(&output, &expected("vae_image"));
    assert!(error < IMAGE_TOLERANCE, "image off by {error}");
}

#[test]
fn a_prompt_becomes_diffusers_image() {
    // Proves the whole pipeline — CLIP, T5, three denoising steps, the VAE — from the
    // prompt and the same starting noise gives FluxPipeline's latent and image, and
    // PNG bytes within one level of its PIL image, each stage checked as it ran.
    let request = ImageRequest {
        prompt: PROMPT.to_string(),
        width: 48,
        height: 64,
        steps: 3,
        guidance: Some(3.5),
        seed: 0,
        count: 1,
        max_sequence_length: MAX_SEQUENCE_LENGTH,
        latents: Some(expected("noise")),
        vae_tile: None,
        init: None,
    };
    let settings = Settings::default();
    let metrics = std::sync::Arc::new(PrometheusObserver::in_process().expect("a recorder"));
    let run = PipelineRun {
        observer: metrics.clone(),
        stages: Some(metrics.clone()),
        ..pipeline_run(&settings)
    };
    let parts = FluxParts::open(&pipeline()).expect("a Flux pipeline");
    let generated = generate(&parts, &request, &run).expect("makes an image");
    let names: Vec<&str> = generated.stages.iter().map(|stage| stage.name).collect();
    assert_eq!(names, ["clip", "t5", "transformer", "vae"]);
    stage_series_count_every_stage(&metrics.render(), &generated);
    // The default check: every stage's blocks against the file as they land; the
    // transformer's first step (of three) recomputed from resident blocks too, while
    // a one-step stage is not computed twice.
    for stage in &generated.stages {
        let report = &stage.outcome.report;
        assert!(report.landings_checked > 0, "{} checked", stage.name);
        let recomputed = u64::from(stage.name == "transformer");
        assert_eq!(report.verified_steps, recomputed, "{}", stage.name);
    }
    let latent_error = relative_difference(&generated.latents[0], &expected("latent"));
    assert!(
        latent_error < IMAGE_TOLERANCE,
        "latent off by {latent_error}"
    );
    let picture = &generated.pictures[0];
    let error = relative_difference(&picture.values, &expected("image"));
    assert!(error < IMAGE_TOLERANCE, "image off by {error}");
    let levels = expected("pixels");
    let worst = picture
        .pixels
        .iter()
        .zip(&levels)
        .map(|(&ours, &theirs)| (f32::from(ours) - theirs).abs())
        .fold(0f32, f32::max);
    assert!(worst <= 1.0, "a pixel is {worst} levels off");
}

/// Each stage's series: one run timed, its bytes over the links (every stage read its
/// weights from disk), its peaks within the budgets it ran under; one image.
fn stage_series_count_every_stage(exposition: &str, generated: &stagehand::pipeline::Generated) {
    let samples = exposition::parse(exposition).expect("an exposition");
    let value = |name: &str, labels: &[(&str, &str)]| exposition::sum(&samples, name, labels);
    for stage in &generated.stages {
        let at = [("stage", stage.name)];
        let runs = value("stagehand_pipeline_stage_duration_seconds_count", &at);
        assert_eq!(runs, 1.0, "{}: one run timed", stage.name);
        let read = value("stagehand_pipeline_stage_transferred_bytes_total", &at);
        let figures = stage.figures();
        assert_eq!(read as u64, figures.transferred_bytes.iter().sum::<u64>());
        assert!(read > 0.0, "{} moved its weights", stage.name);
        for tier in ["vram", "pinned"] {
            let at = [("stage", stage.name), ("tier", tier)];
            let peak = value("stagehand_pipeline_stage_peak_bytes", &at);
            let budget = value("stagehand_pipeline_stage_budget_bytes", &at);
            assert!(
                peak > 0.0 && peak <= budget,
                "{} {tier}: peak {peak} of {budget}",
                stage.name
            );
        }
    }
    assert_eq!(value("stagehand_pipeline_images_total", &[]), 1.0);
}

#[test]
fn a_tiled_decode_blends_as_diffusers_tiled_decode() {
    // Proves decoding in tiles of 4 latent positions (32 pixels) overlapping by a
    // quarter, each tile a step, blended and cropped, gives diffusers'
    // `tiled_decode` of the same 12 × 10 latent.
    let extras = Extras::default().with(LatentInput {
        latents: vec![expected("tiled_latent")],
        height: 12,
        width: 10,
        tile: Some(4),
    });
    let prepared = prepare(&pipeline().join("vae"), &extras);
    let Model::Vae(vae) = &prepared.workload.model else {
        panic!("opened as a VAE");
    };
    assert_eq!(vae.steps_per_image(), 16, "tiles start every 3 positions");
    let outcome = streamed(&prepared, 16);
    let tiles: Vec<&[f32]> = outcome.report.outputs.values().map(Vec::as_slice).collect();
    let image = vae.assemble(&tiles);
    let error = relative_difference(&image, &expected("tiled_image"));
    assert!(error < IMAGE_TOLERANCE, "tiled image off by {error}");
}

#[test]
fn a_budget_too_small_for_a_whole_decode_decodes_in_tiles() {
    // Proves the pipeline tiles the VAE when its activations do not fit beside the
    // weights' ring, keeps every stage's peak within the budget, and still makes the
    // image (close to the whole decode's: tiles blend, they are not the same bits).
    let budget = 4 << 20;
    let settings = Settings {
        vram_budget: Some(ByteSize::b(budget)),
        ..Settings::default()
    };
    let run = pipeline_run(&settings);
    let request = ImageRequest {
        prompt: PROMPT.to_string(),
        width: 256,
        height: 256,
        steps: 1,
        guidance: None,
        seed: 3,
        count: 1,
        max_sequence_length: MAX_SEQUENCE_LENGTH,
        latents: None,
        vae_tile: None,
        init: None,
    };
    let parts = FluxParts::open(&pipeline()).expect("a Flux pipeline");
    let generated = generate(&parts, &request, &run).expect("makes an image");
    let vae = generated.stages.last().expect("a VAE stage");
    assert!(vae.outcome.report.steps > 1, "decoded in tiles");
    for stage in &generated.stages {
        let peak = stage.outcome.report.stats.vram.peak_used_bytes;
        assert!(
            peak <= budget,
            "{} peaked at {peak} of {budget}",
            stage.name
        );
    }
    assert_eq!(generated.pictures[0].pixels.len(), 256 * 256 * 3);
}

#[test]
fn the_vae_encoder_gives_diffusers_latent_and_an_image_starts_from_it() {
    // Proves the VAE's encoder (stride-2 downsampling padded bottom and right, the
    // mid block, the distribution's mode, scaled) gives what AutoencoderKL.encode
    // gives, streamed bit-exactly, and that a pipeline starts image-to-image from it.
    let encoder = |name: &str| -> Vec<f32> {
        read_tensors(&fixtures().join("expected-encoder.safetensors"))
            .expect("reads")
            .into_iter()
            .find(|(found, ..)| found == name)
            .expect("a tensor")
            .2
    };
    let image = encoder("image");
    let extras = Extras::default().with(stagehand::families::vae::ImageInput {
        images: vec![image.clone()],
        height: 64,
        width: 48,
    });
    let prepared = prepare_with(
        &pipeline().join("vae"),
        WorkloadKind::ImageEncoder,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .expect("opens the encoder");
    assert_eq!(prepared.family.name, "vae-encoder");
    let latent = first_output(&streamed(&prepared, 1));
    let error = relative_difference(&latent, &encoder("latent"));
    assert!(error < IMAGE_TOLERANCE, "latent off by {error}");
    let settings = Settings::default();
    let run = pipeline_run(&settings);
    let request = ImageRequest {
        prompt: PROMPT.to_string(),
        width: 48,
        height: 64,
        steps: 4,
        guidance: None,
        seed: 1,
        count: 1,
        max_sequence_length: MAX_SEQUENCE_LENGTH,
        latents: None,
        vae_tile: None,
        init: Some(stagehand::pipeline::InitImage {
            pixels: image,
            strength: 0.5,
        }),
    };
    let parts = FluxParts::open(&pipeline()).expect("a Flux pipeline");
    let generated = generate(&parts, &request, &run).expect("makes an image");
    let names: Vec<&str> = generated.stages.iter().map(|stage| stage.name).collect();
    assert_eq!(names, ["clip", "t5", "vae-encoder", "transformer", "vae"]);
    let transformer = &generated.stages[3];
    assert_eq!(
        transformer.outcome.report.steps, 2,
        "strength 0.5 of 4 steps runs the last 2"
    );
}
