//! An image-to-video pipeline's condition: what `WanImageToVideoPipeline.prepare_latents`
//! makes from the image (Wan 2.2 I2V-A14B, no image encoder, `expand_timesteps`
//! false). The video of the image followed by black frames — the last image last,
//! when given — is encoded by the VAE (the posterior's mode, normalised by
//! `latents_mean`/`latents_std`), and put behind a mask of 4 channels saying which of
//! each latent frame's 4 video frames were given. The result, `[4 + z_dim, latent
//! frames, H/8, W/8]`, is what every step's transformer input carries after the noise.

use super::{VideoRequest, WanParts};
use crate::families::wan::FirstFrame;
use crate::families::wan_vae::VideoInput;
use crate::families::{Extras, WorkloadKind};
use crate::pipeline::{outputs, PipelineError, PipelineRun, Stage};

/// Video frames a latent frame after the first folds (the VAE's temporal scale).
const FRAMES_PER_LATENT: usize = 4;

/// The request's images against the pipeline: an image-to-video pipeline needs the
/// first frame, a text-to-video one takes none, each image is `[3, height, width]`.
pub(super) fn check(request: &VideoRequest, parts: &WanParts) -> Result<(), PipelineError> {
    let bad = |field, message: String| Err(PipelineError::field(field, message));
    if parts.expand_timesteps && request.last_image.is_some() {
        return bad("last_image", "this is a TI2V pipeline (expand_timesteps): it makes a video from its first frame only (diffusers' WanImageToVideoPipeline ignores last_image there); leave out --last-image".into());
    }
    match (parts.image_to_video, &request.image, &request.last_image) {
        (false, Some(_), None) if parts.expand_timesteps => {}
        (true, None, _) => {
            return bad("image", "this is an image-to-video pipeline (WanImageToVideoPipeline): give the first frame (--image)".into())
        }
        (false, Some(_), _) | (false, _, Some(_)) => {
            let field = match request.image {
                Some(_) => "image",
                None => "last_image",
            };
            return bad(field, "this pipeline makes videos from text (WanPipeline): an image needs a WanImageToVideoPipeline folder (Wan 2.2 I2V-A14B)".into())
        }
        (true, _, Some(_)) if request.frames < 5 => {
            return bad("frames", "a last image needs at least 5 frames (the first and the last are different frames)".into())
        }
        _ => {}
    }
    let expected = 3 * request.height * request.width;
    let images = [
        ("image", "image", &request.image),
        ("last_image", "last image", &request.last_image),
    ];
    for (field, name, image) in images {
        if let Some(image) = image.as_ref().filter(|image| image.len() != expected) {
            return bad(
                field,
                format!(
                    "the {name} has {} values; an RGB image of {}×{} has {expected}",
                    image.len(),
                    request.width,
                    request.height
                ),
            );
        }
    }
    Ok(())
}

/// The condition of `request`'s images through the VAE's encoder (a stage of its
/// own): the channels after the noise (Wan 2.2 I2V-A14B), or the first latent frame
/// (TI2V, `expand_timesteps`: `WanImageToVideoPipeline` encodes the image alone);
/// neither for a text-to-video request.
pub(super) fn encode(
    parts: &WanParts,
    request: &VideoRequest,
    run: &PipelineRun<'_>,
    stages: &mut Vec<Stage>,
) -> Result<(Option<Vec<f32>>, Option<FirstFrame>), PipelineError> {
    let Some(first) = &request.image else {
        return Ok((None, None));
    };
    if parts.expand_timesteps {
        let latent = encoded(parts, request, run, (first, 1), stages)?;
        return Ok((
            None,
            Some(FirstFrame {
                latent: latent.concat(),
            }),
        ));
    }
    let (frames, height, width) = (request.frames, request.height, request.width);
    let plane = height * width;
    // [3, frames, H, W]: the image, black (zero) frames, the last image.
    let mut video = vec![0.0f32; 3 * frames * plane];
    let mut place = |image: &[f32], frame: usize| {
        for channel in 0..3 {
            let at = (channel * frames + frame) * plane;
            video[at..at + plane].copy_from_slice(&image[channel * plane..(channel + 1) * plane]);
        }
    };
    place(first, 0);
    if let Some(last) = &request.last_image {
        place(last, frames - 1);
    }
    let chunks = encoded(parts, request, run, (&video, frames), stages)?;
    let [latent_frames, rows, columns] = request.latent_size(parts.vae_scale);
    let pixels = rows * columns;
    let channels = chunks
        .first()
        .map_or(0, |chunk| chunk.len() / pixels.max(1));
    let mask = mask(request, pixels);
    let mut condition = Vec::with_capacity(mask.len() + channels * latent_frames * pixels);
    condition.extend_from_slice(&mask);
    for channel in 0..channels {
        for chunk in &chunks {
            condition.extend_from_slice(&chunk[channel * pixels..(channel + 1) * pixels]);
        }
    }
    Ok((Some(condition), None))
}

/// The latent frames of `video` (`[3, frames, H, W]`) through the VAE's encoder, a
/// stage of its own: each `[z_dim, rows·columns]`, checked whole.
fn encoded(
    parts: &WanParts,
    request: &VideoRequest,
    run: &PipelineRun<'_>,
    (video, frames): (&[f32], usize),
    stages: &mut Vec<Stage>,
) -> Result<Vec<Vec<f32>>, PipelineError> {
    let (height, width) = (request.height, request.width);
    let extras = Extras::default().with(VideoInput {
        videos: vec![video.to_vec()],
        frames,
        height,
        width,
    });
    let [_, rows, columns] = request.latent_size(parts.vae_scale);
    let latent_frames = (frames - 1) / FRAMES_PER_LATENT + 1;
    let kind = ("vae-encoder", WorkloadKind::ImageEncoder);
    let (_, stage) = run.stage(kind, &parts.vae, &extras, 1, |_| latent_frames as u64)?;
    let chunks: Vec<Vec<f32>> = outputs(&stage).into_iter().cloned().collect();
    stages.push(stage);
    let pixels = rows * columns;
    let channels = chunks
        .first()
        .map_or(0, |chunk| chunk.len() / pixels.max(1));
    let whole = chunks.len() == latent_frames
        && channels > 0
        && chunks.iter().all(|chunk| chunk.len() == channels * pixels);
    if !whole {
        return Err(PipelineError::StageOutput {
            stage: "vae-encoder",
            message: format!(
                "the VAE's encoder gave {} latent frames; {latent_frames} of {rows}×{columns} were expected",
                chunks.len()
            ),
        });
    }
    Ok(chunks)
}

/// `[4, latent frames, pixels]`: 1 where the latent frame's video frame was given
/// (the first latent frame stands for the first frame alone, repeated 4 times; the
/// last frame, when given, is the 4th of the last latent frame), else 0.
fn mask(request: &VideoRequest, pixels: usize) -> Vec<f32> {
    let latent_frames = (request.frames - 1) / FRAMES_PER_LATENT + 1;
    let given = |channel: usize, latent: usize| match latent {
        0 => true,
        _ => {
            let frame = 1 + (latent - 1) * FRAMES_PER_LATENT + channel;
            request.last_image.is_some() && frame + 1 == request.frames
        }
    };
    let mut mask = Vec::with_capacity(FRAMES_PER_LATENT * latent_frames * pixels);
    for channel in 0..FRAMES_PER_LATENT {
        for latent in 0..latent_frames {
            let value = if given(channel, latent) { 1.0 } else { 0.0 };
            mask.extend(std::iter::repeat_n(value, pixels));
        }
    }
    mask
}
