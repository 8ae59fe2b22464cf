//! The tiny Wan 2.2 A14B-shaped pipeline of `tests/fixtures/wan_pipeline`
//! (`scripts/make-wan-pipeline-fixtures.py`) as the WAN tests use it: the fixture,
//! its diffusers outputs, a copy a test may change, and the requests made of it.

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::pipeline::VideoRequest;

pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The pipeline folder itself (read only).
pub fn pipeline() -> PathBuf {
    fixtures().join("wan_pipeline")
}

/// What diffusers' WanPipeline computed, by name (`expected.safetensors`).
pub fn expected(name: &str) -> Vec<f32> {
    read_tensors(&pipeline().join("expected.safetensors"))
        .expect("reads")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .2
}

fn copy_folder(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("a folder");
    for entry in std::fs::read_dir(from).expect("reads the folder") {
        let entry = entry.expect("an entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_folder(&entry.path(), &target);
        } else if entry.file_name() != "expected.safetensors" {
            std::fs::copy(entry.path(), target).expect("copies");
        }
    }
}

/// A copy of the pipeline folder in `dir` (its umT5, tokenizer and VAE are links to
/// the umt5 and wan_vae fixtures; the copy holds their files).
pub fn assemble(dir: &Path) -> PathBuf {
    let folder = dir.join("wan");
    copy_folder(&pipeline(), &folder);
    folder
}

/// A request of seeded noise (5 frames of 48 × 64, 4 steps guided at 4.0 then 2.5,
/// 16 text tokens), for comparing two ways of giving the same parts.
pub fn seeded_request() -> VideoRequest {
    VideoRequest {
        prompt: "a red fox runs through the snow at sunset".into(),
        negative_prompt: "blurry, static".into(),
        width: 48,
        height: 64,
        frames: 5,
        steps: 4,
        guidance: 4.0,
        guidance_2: Some(2.5),
        seed: 3,
        latents: None,
        max_sequence_length: 16,
        image: None,
        last_image: None,
        vae_tile: None,
        hand_over_prefetch: true,
    }
}

/// The request diffusers made its video of: 9 frames from the fixture's starting
/// latent, 512 text tokens, the rest as [`seeded_request`].
pub fn reference_request() -> VideoRequest {
    VideoRequest {
        frames: 9,
        seed: 0,
        latents: Some(expected("latent")),
        max_sequence_length: 512,
        ..seeded_request()
    }
}
