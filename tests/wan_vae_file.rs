//! The WAN VAE's single file, as ComfyUI users have it (`vae/wan_2.1_vae.safetensors`,
//! `vae/wan2.2_vae.safetensors`, in Wan-AI's original names), against the diffusers
//! folder of the same weights: `tests/fixtures/wan_vae_file`
//! (`scripts/make-wan-vae-file-fixtures.py`, which checks that diffusers' own
//! `convert_vae`/`convert_vae_22` read each file back as its folder's tensors) holds a
//! tiny 2.1 VAE and a tiny 2.2 VAE with the published latents' means and stds, each as
//! a folder and as a file. `--vae FILE` makes the folder's video, bit for bit.

use std::path::{Path, PathBuf};

use stagehand::compute::DType;
use stagehand::model::generated::{write_single, TensorSpec};
use stagehand::pipeline::{generate_video, PipelineRun, Video, VideoFiles, VideoRequest, WanParts};
use stagehand::settings::Settings;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn vae_file(version: &str, file: &str) -> PathBuf {
    fixtures().join("wan_vae_file").join(version).join(file)
}

fn request(width: usize, height: usize, image: bool) -> VideoRequest {
    VideoRequest {
        prompt: "a red fox runs through the snow at sunset".into(),
        negative_prompt: "blurry, static".into(),
        width,
        height,
        frames: 5,
        steps: 2,
        guidance: 4.0,
        guidance_2: Some(2.5),
        seed: 3,
        latents: None,
        max_sequence_length: 16,
        // A first frame of its own, so TI2V's image goes through the VAE's encoder.
        image: image.then(|| {
            (0..3 * width * height)
                .map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0)
                .collect()
        }),
        last_image: None,
        vae_tile: None,
        hand_over_prefetch: true,
    }
}

/// The video of `pipeline` with `vae` in place of its own.
fn video(pipeline: &Path, vae: PathBuf, request: &VideoRequest) -> (WanParts, Video) {
    let files = VideoFiles {
        vae: Some(vae),
        ..VideoFiles::default()
    };
    let parts = WanParts::locate(pipeline, &files).expect("the parts");
    let settings = Settings::default();
    let video = generate_video(&parts, request, &PipelineRun::quiet(&settings)).expect("a video");
    (parts, video)
}

fn frames(video: &Video) -> Vec<f32> {
    (video.frames.iter())
        .flat_map(|frame| frame.values.iter().copied())
        .collect()
}

/// The folder's and the file's videos of `version`'s VAE in `pipeline`: equal.
fn file_makes_the_folders_video(pipeline: &str, version: &str, file: &str, request: VideoRequest) {
    let pipeline = fixtures().join(pipeline);
    let (folder_parts, want) = video(&pipeline, vae_file(version, "vae"), &request);
    let (file_parts, got) = video(&pipeline, vae_file(version, file), &request);
    assert!(folder_parts.vae.part.is_none() && file_parts.vae.part.is_some());
    assert_eq!(file_parts.vae_scale, folder_parts.vae_scale);
    assert_eq!(got.latent, want.latent, "the same latent, bit for bit");
    assert!(!want.frames.is_empty());
    assert_eq!(frames(&got), frames(&want), "the same frames, bit for bit");
}

#[test]
fn wan21_vae_file_makes_the_folders_video_bit_for_bit() {
    // Proves Wan 2.1's VAE read from Wan-AI's names (up levels regrouped, the config
    // from the shapes, the published 16 means and stds) decodes the A14B pipeline's
    // latent to the folder's frames exactly.
    file_makes_the_folders_video(
        "wan_pipeline",
        "wan21",
        "wan_2.1_vae_tiny.safetensors",
        request(48, 64, false),
    );
}

#[test]
fn wan22_vae_file_makes_the_folders_video_bit_for_bit() {
    // Proves Wan 2.2's VAE read from Wan-AI's nested names (residual levels, 2 × 2
    // patches, the published 48 means and stds) encodes TI2V-5B's first frame and
    // decodes its latent as the folder does, exactly.
    file_makes_the_folders_video(
        "wan_ti2v",
        "wan22",
        "wan2.2_vae_tiny.safetensors",
        request(64, 32, true),
    );
}

/// The error of giving `vae` to the tiny A14B pipeline.
fn refusal(vae: &Path) -> String {
    let files = VideoFiles {
        vae: Some(vae.to_path_buf()),
        ..VideoFiles::default()
    };
    let error = WanParts::locate(&fixtures().join("wan_pipeline"), &files);
    error.expect_err("refused").to_string()
}

/// A file of tensors `names` (shapes `shape`), in `dir`.
fn written(dir: &Path, file: &str, tensors: &[(&str, &[usize])]) -> PathBuf {
    let path = dir.join(file);
    let specs: Vec<TensorSpec> = (tensors.iter().enumerate())
        .map(|(seed, (name, shape))| {
            TensorSpec::uniform(name.to_string(), shape.to_vec(), seed as u64, 0.0, 0.1)
        })
        .collect();
    write_single(&path, &specs, DType::Bf16, &Default::default()).expect("writes");
    path
}

#[test]
fn a_bad_vae_file_is_refused_by_name() {
    // Proves a VAE file of a latent size no published VAE has, one with a tensor the
    // conversion does not know, a truncated one and a file that is no VAE are each
    // refused naming what is wrong, never misread.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let marker: (&str, &[usize]) = ("decoder.middle.0.residual.0.gamma", &[8, 1, 1, 1]);
    let z8 = written(
        dir.path(),
        "z8.safetensors",
        &[marker, ("conv2.weight", &[8, 8, 1, 1, 1])],
    );
    let error = refusal(&z8);
    assert!(error.contains("z_dim 8") && error.contains("16"), "{error}");
    let unknown = written(
        dir.path(),
        "unknown.safetensors",
        &[marker, ("decoder.middle.1.q.weight", &[8, 8])],
    );
    let error = refusal(&unknown);
    assert!(
        error.contains("decoder.middle.1.q.weight") && error.contains("Wan-AI's VAE"),
        "{error}"
    );
    let whole = std::fs::read(vae_file("wan21", "wan_2.1_vae_tiny.safetensors")).expect("reads");
    let truncated = dir.path().join("truncated.safetensors");
    std::fs::write(&truncated, &whole[..whole.len() / 2]).expect("writes");
    let error = refusal(&truncated);
    assert!(error.contains("truncated.safetensors"), "{error}");
    let transformer = fixtures().join("wan_comfy/wan2.2_t2v_low_noise_tiny.safetensors");
    let error = refusal(&transformer);
    assert!(error.contains("is not a WAN VAE"), "{error}");
}
