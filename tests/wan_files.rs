//! A Wan pipeline from the files ComfyUI users have, against the diffusers folder of
//! the same weights: the two experts in Wan-AI's original names
//! (`tests/fixtures/wan_comfy`, written by `scripts/make-wan-comfy-fixtures.py`, which
//! checks diffusers' own single-file conversion reads them back as the folder's
//! tensors; the high-noise one under ComfyUI's `model.diffusion_model.`, the low-noise
//! one bare), umT5 as a bare file, its tokenizer's folder, the VAE's folder and the
//! scheduler's config: the same latent and frames, bit for bit.

mod common;

use std::path::{Path, PathBuf};

use stagehand::pipeline::{generate_video, PipelineError, PipelineRun, VideoFiles, WanParts};
use stagehand::settings::Settings;

use common::wan::{fixtures, pipeline, seeded_request as request};

fn comfy(name: &str) -> PathBuf {
    fixtures().join("wan_comfy").join(name)
}

/// umT5's weights as a file with no `config.json` beside it (ComfyUI's
/// `text_encoders/`), in `dir`.
fn bare_umt5(dir: &Path) -> PathBuf {
    let file = dir.join("umt5_xxl_tiny.safetensors");
    std::fs::copy(pipeline().join("text_encoder/model.safetensors"), &file).expect("copies");
    file
}

fn files(dir: &Path) -> VideoFiles {
    VideoFiles {
        model_2: Some(comfy("wan2.2_t2v_low_noise_tiny.safetensors")),
        umt5: Some(bare_umt5(dir)),
        umt5_tokenizer: Some(pipeline().join("tokenizer")),
        vae: Some(pipeline().join("vae")),
        scheduler: Some(pipeline().join("scheduler/scheduler_config.json")),
    }
}

#[test]
fn comfyui_files_make_the_folders_video_bit_for_bit() {
    // Proves the experts read from Wan-AI's names (prefixed and bare), their config
    // inferred from the shapes, and umT5 from a bare file make the folder's latent
    // and frames exactly, both experts taking their steps of the boundary 0.875.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let settings = Settings::default();
    let run = PipelineRun::quiet(&settings);
    let folder = WanParts::folder(&pipeline()).expect("the folder");
    let high = comfy("wan2.2_t2v_high_noise_tiny.safetensors");
    let parts = WanParts::locate(&high, &files(dir.path())).expect("the files");
    assert!(parts.transformer.part.is_some() && parts.transformer_2.is_some());
    assert_eq!(
        (parts.boundary_ratio, parts.latent_channels),
        (folder.boundary_ratio, folder.latent_channels)
    );
    let want = generate_video(&folder, &request(), &run).expect("the folder's video");
    let got = generate_video(&parts, &request(), &run).expect("the files' video");
    let steps = |video: &stagehand::pipeline::Video| -> Vec<u64> {
        (video.stages.iter())
            .map(|stage| stage.outcome.report.steps)
            .collect()
    };
    assert_eq!(steps(&got), steps(&want));
    assert_eq!(got.latent, want.latent, "the same latent, bit for bit");
    let values = |video: &stagehand::pipeline::Video| -> Vec<f32> {
        (video.frames.iter())
            .flat_map(|frame| frame.values.iter().copied())
            .collect()
    };
    assert_eq!(values(&got), values(&want), "the same frames, bit for bit");
}

#[test]
fn a_part_no_file_gives_is_refused_by_its_flag() {
    // Proves the transformer's file alone names each missing part's flag, and a file
    // given as the VAE that is none is refused by name rather than misread.
    let dir = tempfile::tempdir().expect("a temporary folder");
    let high = comfy("wan2.2_t2v_high_noise_tiny.safetensors");
    let full = files(dir.path());
    let cases = [
        (
            "--umt5",
            VideoFiles {
                umt5: None,
                ..full.clone()
            },
        ),
        (
            "--umt5-tokenizer",
            VideoFiles {
                umt5_tokenizer: None,
                ..full.clone()
            },
        ),
        (
            "--vae",
            VideoFiles {
                vae: None,
                ..full.clone()
            },
        ),
        (
            "--scheduler",
            VideoFiles {
                scheduler: None,
                ..full.clone()
            },
        ),
    ];
    for (flag, given) in cases {
        let error = WanParts::locate(&high, &given).expect_err(flag);
        assert!(
            matches!(&error, PipelineError::MissingFile { flag: named, .. } if *named == flag),
            "{flag}: {error}"
        );
    }
    let not_a_vae = VideoFiles {
        vae: Some(comfy("wan2.2_t2v_low_noise_tiny.safetensors")),
        ..full
    };
    let error = WanParts::locate(&high, &not_a_vae)
        .expect_err("a transformer as the VAE")
        .to_string();
    assert!(error.contains("is not a WAN VAE"), "{error}");
}
