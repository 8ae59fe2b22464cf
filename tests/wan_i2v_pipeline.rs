//! An image to a video against diffusers' WanImageToVideoPipeline: a tiny Wan 2.2
//! I2V-A14B-shaped pipeline (tests/fixtures/wan_i2v_pipeline: two experts of 36
//! input channels switched at boundary_ratio 0.9, umT5 and the WAN VAE linked from
//! the umt5 and wan_vae fixtures; scripts/make-wan-i2v-fixtures.py) makes the same
//! video from the same image and starting latent: 3 UniPC steps with guidance 3.5
//! then 2.0 — and the same with a last image.

mod common;

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::pipeline::{
    generate_video, png_rgb, PipelineError, PipelineRun, VideoRequest, WanParts,
};
use stagehand::settings::Settings;

use common::reference::relative_difference;

/// Relative to the largest magnitude: f32 on both sides through the VAE's encoder,
/// umT5, 3 guided steps of two experts and the VAE's decoder.
const TOLERANCE: f32 = 1e-4;

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_i2v_pipeline")
}

fn expected(name: &str) -> Vec<f32> {
    read_tensors(&folder().join("expected.safetensors"))
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .2
}

/// The fixture's PNG `name` as `[3, 64, 48]` in [−1, 1], as VaeImageProcessor
/// normalises it (the reader `--image` and the server's `input_reference` use).
fn image(name: &str) -> Vec<f32> {
    let file = std::fs::File::open(folder().join(name)).expect("the image");
    png_rgb(std::io::BufReader::new(file), [48, 64]).expect("a 48×64 PNG")
}

fn request() -> VideoRequest {
    VideoRequest {
        prompt: "the fox turns its head towards the camera".into(),
        negative_prompt: "blurry, static".into(),
        width: 48,
        height: 64,
        frames: 9,
        steps: 3,
        guidance: 3.5,
        guidance_2: Some(2.0),
        seed: 0,
        latents: Some(expected("latent")),
        max_sequence_length: 512,
        image: Some(image("first.png")),
        last_image: None,
        vae_tile: None,
        hand_over_prefetch: true,
    }
}

#[test]
fn an_image_becomes_wanimagetovideopipelines_video() {
    // Proves image-to-video end to end: the image encoded by the VAE before the
    // steps, the experts split at the boundary (2 steps at or above 900, 1 below),
    // the final latent and every frame's values as diffusers', the 8-bit pixels
    // within one level, every stage within its budget, the encoder's and the
    // experts' first steps checked.
    let parts = WanParts::folder(&folder()).expect("a Wan I2V pipeline");
    assert!(parts.image_to_video);
    assert_eq!(
        (parts.latent_channels, parts.boundary_ratio),
        (16, Some(0.9))
    );
    let settings = Settings::default();
    let video =
        generate_video(&parts, &request(), &PipelineRun::quiet(&settings)).expect("makes a video");
    let names: Vec<&str> = video.stages.iter().map(|stage| stage.name).collect();
    assert_eq!(
        names,
        ["umt5", "vae-encoder", "transformer", "transformer_2", "vae"]
    );
    let steps: Vec<u64> = (video.stages.iter())
        .map(|stage| stage.outcome.report.steps)
        .collect();
    assert_eq!(
        steps[1..4],
        [3, 2, 1],
        "3 latent frames encoded; 2 + 1 steps"
    );
    let latent_error = relative_difference(&video.latent, &expected("final"));
    let values: Vec<f32> = (video.frames.iter())
        .flat_map(|frame| frame.values.iter().copied())
        .collect();
    let frames = expected("frames");
    let frame_error = relative_difference(&values, &frames);
    eprintln!("wan i2v pipeline: final latent {latent_error:e}, frames {frame_error:e} of the largest magnitude from WanImageToVideoPipeline's");
    assert!(latent_error < TOLERANCE, "latent off by {latent_error}");
    assert!(frame_error < TOLERANCE, "frames off by {frame_error}");
    let levels = (video.frames.iter())
        .flat_map(|frame| frame.pixels.iter().copied())
        .zip(&frames)
        .map(|(got, &want)| (f32::from(got) - (want * 255.0).round()).abs())
        .fold(0f32, f32::max);
    assert!(levels <= 1.0, "a pixel {levels} levels off");
    for stage in &video.stages {
        let report = &stage.outcome.report;
        // A stage of several steps (the encoder's chunks, the experts' steps) has its
        // first recomputed from resident blocks: the pipeline's cheap check.
        if report.steps > 1 {
            assert!(report.verified_steps >= 1, "{}: unchecked", stage.name);
        }
        let budget = stage.outcome.budgets.vram_budget_bytes;
        let peak = report.stats.vram.peak_used_bytes;
        assert!(peak <= budget, "{}: over its budget", stage.name);
    }
}

#[test]
fn a_first_and_a_last_image_give_diffusers_interpolation() {
    // Proves `last_image`: the last frame placed last in the encoded video and marked
    // in the mask's 4th channel of the last latent frame, as diffusers does.
    let parts = WanParts::folder(&folder()).expect("a Wan I2V pipeline");
    let request = VideoRequest {
        last_image: Some(image("last.png")),
        ..request()
    };
    let settings = Settings::default();
    let video =
        generate_video(&parts, &request, &PipelineRun::quiet(&settings)).expect("makes a video");
    let error = relative_difference(&video.latent, &expected("final_last"));
    eprintln!("wan i2v pipeline with a last image: final latent {error:e}");
    assert!(error < TOLERANCE, "latent off by {error}");
    let first_only = relative_difference(&video.latent, &expected("final"));
    assert!(
        first_only > 100.0 * TOLERANCE,
        "the last image changed nothing"
    );
}

#[test]
fn images_the_pipeline_cannot_take_are_refused_by_name() {
    // Proves an image-to-video pipeline without its image, an image of the wrong
    // size, an image given to a text-to-video pipeline and a Wan 2.1 folder with a
    // CLIP image encoder are refused before any model runs, saying what to give.
    let settings = Settings::default();
    let parts = WanParts::folder(&folder()).expect("a Wan I2V pipeline");
    let refused = |parts: &WanParts, request: VideoRequest| match generate_video(
        parts,
        &request,
        &PipelineRun::quiet(&settings),
    ) {
        Err(PipelineError::BadField { message, .. }) => message,
        other => panic!("not refused as a bad request: {:?}", other.err()),
    };
    let without = refused(
        &parts,
        VideoRequest {
            image: None,
            ..request()
        },
    );
    assert!(without.contains("--image"), "{without}");
    let small = VideoRequest {
        image: Some(vec![0.0; 3 * 16 * 16]),
        ..request()
    };
    assert!(refused(&parts, small).contains("48×64"));
    let text_to_video = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_pipeline");
    let t2v = WanParts::folder(&text_to_video).expect("a Wan pipeline");
    let latents = Some(vec![0.0; 16 * 3 * 8 * 6]);
    let given = refused(
        &t2v,
        VideoRequest {
            latents,
            ..request()
        },
    );
    assert!(given.contains("WanImageToVideoPipeline"), "{given}");

    let dir = tempfile::tempdir().expect("a temporary folder");
    for entry in std::fs::read_dir(folder()).expect("the fixture") {
        let entry = entry.expect("an entry");
        if entry.file_name() != "model_index.json" {
            let target = std::fs::canonicalize(entry.path()).expect("resolves");
            std::os::unix::fs::symlink(target, dir.path().join(entry.file_name())).expect("links");
        }
    }
    let index = std::fs::read_to_string(folder().join("model_index.json")).expect("reads");
    let wan21 = index.replace(
        r#""image_encoder": [
    null,
    null
  ]"#,
        r#""image_encoder": ["transformers", "CLIPVisionModel"]"#,
    );
    assert_ne!(wan21, index, "the fixture names no image encoder");
    std::fs::write(dir.path().join("model_index.json"), wan21).expect("writes");
    let error = WanParts::folder(dir.path()).expect_err("refused");
    assert!(error.to_string().contains("image_encoder"), "{error}");
}
