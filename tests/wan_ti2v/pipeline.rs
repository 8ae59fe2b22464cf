//! TI2V-5B's transformer with a timestep per token, and the pipeline end to end
//! (text to video, and image to video with the image as the first latent frame).

use stagehand::families::wan::{FirstFrame, WanInput};
use stagehand::pipeline::{generate_video, png_rgb, PipelineRun, VideoRequest, WanParts};
use stagehand::run::{Extras, WorkloadKind};
use stagehand::settings::Settings;

use super::TOLERANCE;
use super::{expected, fixtures, largest_difference, prepare, streamed_equal_to_resident};

/// The largest magnitude of `values`.
fn largest(values: &[f32]) -> f32 {
    values.iter().fold(0f32, |m, v| m.max(v.abs()))
}

#[test]
fn ti2v_velocity_with_a_timestep_per_token_matches_diffusers() {
    // Proves the per-token modulation: the first latent frame's tokens at timestep
    // 0 and the others at 700 (diffusers' timestep of shape [batch, seq]) give
    // WanTransformer3DModel's velocity, streamed under half the model as resident.
    let (shape, latent) = expected("tr_latent");
    let (_, timesteps) = expected("tr_timestep");
    let (frames, height, width) = (shape[2], shape[3], shape[4]);
    let first_tokens = height / 2 * width / 2;
    let later = timesteps[first_tokens];
    assert!(timesteps[..first_tokens].iter().all(|&t| t == 0.0));
    assert!(timesteps[first_tokens..].iter().all(|&t| t == later) && later > 0.0);
    // The first frame given as the latent's own: the input is the fixture's latent.
    let plane = height * width;
    let first: Vec<f32> = (latent.chunks_exact(frames * plane))
        .flat_map(|channel| channel[..plane].to_vec())
        .collect();
    let input = WanInput {
        latent: latent.clone(),
        frames,
        height,
        width,
        timestep: later,
        context: expected("tr_context").1,
        guidance: None,
        condition: None,
        first_frame: Some(FirstFrame { latent: first }),
    };
    let extras = Extras::default().with(input);
    let prepared = prepare("transformer", WorkloadKind::Auto, &extras);
    let outputs = streamed_equal_to_resident(&prepared, 1, "transformer");
    let (_, velocity) = expected("tr_velocity");
    let difference = largest_difference(&outputs[0], &velocity);
    eprintln!(
        "ti2v transformer: velocity {difference:e} max abs from diffusers' (largest {})",
        largest(&velocity)
    );
    assert!(difference < TOLERANCE, "velocity differs by {difference}");
}

fn request(image: Option<Vec<f32>>) -> VideoRequest {
    let (steps, guidance) = match image {
        None => (4, 4.0),
        Some(_) => (3, 3.5),
    };
    VideoRequest {
        prompt: "a paper boat drifts down a rainy street".into(),
        negative_prompt: "blurry, static".into(),
        width: 96,
        height: 64,
        frames: 9,
        steps,
        guidance,
        guidance_2: None,
        seed: 0,
        latents: Some(expected("latent").1),
        max_sequence_length: 512,
        image,
        last_image: None,
        vae_tile: None,
        hand_over_prefetch: true,
    }
}

/// Makes `request`'s video with the fixture pipeline and checks its final latent
/// and its pixels against diffusers' (`name`: t2v or i2v).
fn makes_diffusers_video(request: &VideoRequest, name: &str, stages: &[&str]) {
    let parts = WanParts::folder(&fixtures()).expect("a Wan pipeline");
    assert!(parts.expand_timesteps);
    assert_eq!((parts.vae_scale, parts.latent_channels), (16, 48));
    let settings = Settings::default();
    let video =
        generate_video(&parts, request, &PipelineRun::quiet(&settings)).expect("makes a video");
    let names: Vec<&str> = video.stages.iter().map(|stage| stage.name).collect();
    assert_eq!(names, stages);
    let (_, final_latent) = expected(&format!("{name}_final"));
    let latent_error = largest_difference(&video.latent, &final_latent);
    let (_, frames) = expected(&format!("{name}_frames"));
    let pixels: Vec<u8> = (video.frames.iter())
        .flat_map(|frame| frame.pixels.iter().copied())
        .collect();
    assert_eq!(pixels.len(), frames.len(), "9 frames of 96×64 RGB");
    let levels = (pixels.iter().zip(&frames))
        .map(|(&got, &want)| (f32::from(got) - (want * 255.0).round()).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "ti2v {name}: final latent {latent_error:e} max abs from diffusers' (largest {}), pixels within {levels} levels",
        largest(&final_latent)
    );
    assert!(latent_error < TOLERANCE, "latent off by {latent_error}");
    assert!(levels <= 1.0, "a pixel {levels} levels off");
}

#[test]
fn a_prompt_becomes_wanpipelines_ti2v_video() {
    // Proves text to video with expand_timesteps (every token at the step's
    // timestep) and the 48-channel VAE: WanPipeline's final latent and frames.
    makes_diffusers_video(&request(None), "t2v", &["umt5", "transformer", "vae"]);
}

#[test]
fn an_image_becomes_the_ti2v_videos_first_frame() {
    // Proves TI2V image to video as WanImageToVideoPipeline computes it with
    // expand_timesteps: the image encoded alone as the first latent frame, its
    // tokens at timestep 0, put back after the steps; final latent and frames.
    let file = std::fs::File::open(fixtures().join("first.png")).expect("the image");
    let image = png_rgb(std::io::BufReader::new(file), [96, 64]).expect("a 96×64 PNG");
    let stages = ["umt5", "vae-encoder", "transformer", "vae"];
    makes_diffusers_video(&request(Some(image)), "i2v", &stages);
}
