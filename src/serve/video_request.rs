//! The body of `POST /v1/videos`: OpenAI's fields (`model`, `prompt`, `seconds`,
//! `size`, `input_reference`: the first frame, see [`super::video_reference`]) and
//! stagehand's documented extensions (`negative_prompt`, `num_frames`,
//! `num_inference_steps`, `guidance_scale`, `guidance_scale_2`, `seed`,
//! `max_sequence_length`, `fps`), as JSON or as the `multipart/form-data` the official
//! clients send; unknown fields are refused by name, each limit answered with a 400
//! naming it.
//!
//! `seconds` → frames: Wan makes 4k + 1 frames at 16 fps (the VAE keeps the first and
//! folds every 4 after it), so a video of `seconds` has `seconds × fps` rounded to a
//! multiple of 4, plus 1 (the default 5 s: 81 frames, WanPipeline's default). The
//! answer's `seconds` says what was made: `(frames − 1) / fps`.

use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};

use axum::body::Bytes;

use crate::pipeline::VideoRequest;

use super::config::Limits;
use super::errors::ApiError;
use super::video_reference::Reference;

/// WanPipeline's defaults for what a request leaves out.
const DEFAULT_SIZE: (usize, usize) = (832, 480);
const DEFAULT_SECONDS: f64 = 5.0;
const DEFAULT_STEPS: usize = 50;
const DEFAULT_GUIDANCE: f32 = 5.0;
const DEFAULT_SEQUENCE_LENGTH: usize = 512;
/// Wan's frame rate: the clips it was trained on.
pub const DEFAULT_FPS: u32 = 16;
/// The most frames per second a request may ask (`fps`).
const MOST_FPS: u32 = 60;

/// The body as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VideosBody {
    pub model: String,
    pub prompt: String,
    /// OpenAI's clip length, a string (`"4"`); a number is taken too.
    #[serde(default, deserialize_with = "lenient")]
    seconds: Option<f64>,
    #[serde(default)]
    size: Option<String>,
    /// Image-to-video's first frame as JSON carries it (a data URL); read into
    /// `reference` by [`parse_body`].
    #[serde(default)]
    input_reference: Option<serde_json::Value>,
    /// The first frame, from the form's file part or JSON's data URL.
    #[serde(skip)]
    pub reference: Option<Reference>,
    #[serde(default)]
    negative_prompt: Option<String>,
    #[serde(default, deserialize_with = "lenient")]
    num_frames: Option<usize>,
    #[serde(default, deserialize_with = "lenient")]
    num_inference_steps: Option<usize>,
    #[serde(default, deserialize_with = "lenient")]
    guidance_scale: Option<f32>,
    #[serde(default, deserialize_with = "lenient")]
    guidance_scale_2: Option<f32>,
    #[serde(default, deserialize_with = "lenient")]
    seed: Option<u64>,
    #[serde(default, deserialize_with = "lenient")]
    max_sequence_length: Option<usize>,
    #[serde(default, deserialize_with = "lenient")]
    fps: Option<u32>,
}

/// A number, or a string holding one: JSON sends numbers, a form sends strings.
fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr + DeserializeOwned,
{
    match serde_json::Value::deserialize(deserializer)? {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(text) => text
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| D::Error::custom(format!("\"{text}\" is not a number of this field"))),
        other => serde_json::from_value(other)
            .map(Some)
            .map_err(D::Error::custom),
    }
}

/// What a job is, as the pipeline takes it and as the video object says it.
#[derive(Debug, Clone)]
pub struct AskedVideo {
    pub request: VideoRequest,
    pub fps: u32,
    /// `"WIDTHxHEIGHT"`.
    pub size: String,
    /// `(frames − 1) / fps`, as OpenAI writes it: a string.
    pub seconds: String,
}

/// Parses a body of `content_type`: JSON, or `multipart/form-data` (text fields and
/// the file part `input_reference`), its image checked against `limits` (not yet
/// decoded: its size is checked against the request's in [`asked_video`]).
pub fn parse_body(
    content_type: Option<&str>,
    bytes: &Bytes,
    limits: &Limits,
) -> Result<VideosBody, ApiError> {
    let invalid = |error: serde_json::Error| {
        ApiError::invalid_body(format!("the body is not a valid video request: {error}"))
    };
    let (mut body, file): (VideosBody, _) = match content_type.and_then(super::form::boundary) {
        Some(boundary) => {
            let form = super::form::parse(bytes, &boundary)?;
            // One file at most: `form::parse` refuses a name given twice, and
            // `from_file` any name but input_reference.
            let mut file = None;
            for part in &form.files {
                file = Some(Reference::from_file(part, bytes, limits)?);
            }
            let fields = serde_json::Value::Object(form.fields);
            (serde_json::from_value(fields).map_err(invalid)?, file)
        }
        None => (serde_json::from_slice(bytes).map_err(invalid)?, None),
    };
    body.reference = match (file, &body.input_reference) {
        (Some(file), None) => Some(file),
        (None, Some(value)) => Some(Reference::from_json(value, limits)?),
        (None, None) => None,
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "input_reference",
                "input_reference is given twice",
            ))
        }
    };
    Ok(body)
}

/// The request within the server's limits.
pub fn asked_video(body: &VideosBody, limits: &Limits) -> Result<AskedVideo, ApiError> {
    let fps = body.fps.unwrap_or(DEFAULT_FPS);
    if fps == 0 || fps > MOST_FPS {
        return Err(ApiError::bad_request(
            "fps",
            format!("fps = {fps}: between 1 and {MOST_FPS} (Wan's is 16)"),
        ));
    }
    let frames = frames_of(body, fps, limits)?;
    let (width, height) = match body.size.as_deref() {
        None => DEFAULT_SIZE,
        Some(size) => super::images::parse_size(size)?,
    };
    if !super::images::pixels_within((width, height), limits.max_video_pixels) {
        return Err(ApiError::bad_request(
            "size",
            format!(
                "size {width}x{height} is {} pixels a frame, above limits.max_video_pixels = {}",
                width as u128 * height as u128,
                limits.max_video_pixels
            ),
        ));
    }
    let steps = within(
        "num_inference_steps",
        body.num_inference_steps.unwrap_or(DEFAULT_STEPS),
        ("limits.max_video_steps", limits.max_video_steps),
    )?;
    let length = within(
        "max_sequence_length",
        body.max_sequence_length.unwrap_or(DEFAULT_SEQUENCE_LENGTH),
        ("limits.max_prompt_tokens", limits.max_prompt_tokens),
    )?;
    let scales = [
        ("guidance_scale", body.guidance_scale),
        ("guidance_scale_2", body.guidance_scale_2),
    ];
    if let Some((field, _)) = scales
        .iter()
        .find(|(_, scale)| scale.is_some_and(|scale| !scale.is_finite()))
    {
        return Err(ApiError::bad_request(
            field,
            format!("{field} is not a number"),
        ));
    }
    let shape = Shape {
        width,
        height,
        frames,
        steps,
        max_sequence_length: length,
    };
    let image = (body.reference.as_ref())
        .map(|reference| reference.pixels([width, height]))
        .transpose()?;
    Ok(AskedVideo {
        request: video_request(body, shape, image),
        fps,
        size: format!("{width}x{height}"),
        seconds: seconds_of(frames, fps),
    })
}

/// The checked sizes of a request.
struct Shape {
    width: usize,
    height: usize,
    frames: usize,
    steps: usize,
    max_sequence_length: usize,
}

/// The one place the server builds a [`VideoRequest`].
fn video_request(body: &VideosBody, shape: Shape, image: Option<Vec<f32>>) -> VideoRequest {
    VideoRequest {
        prompt: body.prompt.clone(),
        negative_prompt: body.negative_prompt.clone().unwrap_or_default(),
        width: shape.width,
        height: shape.height,
        frames: shape.frames,
        steps: shape.steps,
        guidance: body.guidance_scale.unwrap_or(DEFAULT_GUIDANCE),
        guidance_2: body.guidance_scale_2,
        seed: body.seed.unwrap_or(0),
        latents: None,
        max_sequence_length: shape.max_sequence_length,
        image,
        // OpenAI's Videos API has no last frame.
        last_image: None,
        // Tiled only when the server's budget needs it.
        vae_tile: None,
        // Both experts in the server's shared budget, the second's first blocks
        // loaded during the first's last step.
        hand_over_prefetch: true,
    }
}

/// `value` of `field` between 1 and the limit `(key, most)`.
fn within(field: &str, value: usize, (key, most): (&str, usize)) -> Result<usize, ApiError> {
    if value == 0 || value > most {
        return Err(ApiError::bad_request(
            field,
            format!("{field} = {value}: between 1 and {key} = {most}"),
        ));
    }
    Ok(value)
}

/// The frames a request asks: `num_frames` (4k + 1), else `seconds × fps` rounded to a
/// multiple of 4, plus 1; at most `limits.max_video_frames`.
fn frames_of(body: &VideosBody, fps: u32, limits: &Limits) -> Result<usize, ApiError> {
    let frames = match (body.num_frames, body.seconds) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "num_frames",
                "give seconds or num_frames, not both",
            ))
        }
        (Some(frames), None) => {
            if frames % 4 != 1 {
                let lower = frames.saturating_sub(1) / 4 * 4 + 1;
                // Saturating: `lower + 4` overflowed for num_frames ≥ 2^64 − 3.
                let higher = lower.saturating_add(4);
                return Err(ApiError::bad_request(
                    "num_frames",
                    format!("num_frames = {frames}: Wan makes 4k + 1 frames (the VAE keeps the first and folds every 4 after it); give {lower} or {higher}"),
                ));
            }
            frames
        }
        (None, seconds) => {
            let seconds = seconds.unwrap_or(DEFAULT_SECONDS);
            if !seconds.is_finite() || seconds <= 0.0 {
                return Err(ApiError::bad_request(
                    "seconds",
                    format!("seconds = {seconds}: give a length above 0 (for example \"4\")"),
                ));
            }
            let steps_of_four = (seconds * f64::from(fps) / 4.0).round().max(1.0);
            // Far past any limit stays far past it (the cast saturates).
            (steps_of_four as usize).saturating_mul(4).saturating_add(1)
        }
    };
    if frames > limits.max_video_frames {
        let field = if body.num_frames.is_some() {
            "num_frames"
        } else {
            "seconds"
        };
        return Err(ApiError::bad_request(
            field,
            format!(
                "{frames} frames ({} s at {fps} fps) is above limits.max_video_frames = {}",
                seconds_of(frames, fps),
                limits.max_video_frames
            ),
        ));
    }
    Ok(frames)
}

/// The length of `frames` at `fps`, as OpenAI writes it (`"4"`, `"0.25"`).
pub fn seconds_of(frames: usize, fps: u32) -> String {
    let seconds = frames.saturating_sub(1) as f64 / f64::from(fps.max(1));
    let text = format!("{seconds:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: serde_json::Value) -> VideosBody {
        serde_json::from_value(json).expect("a body")
    }

    #[test]
    fn seconds_become_four_k_plus_one_frames_at_the_frame_rate() {
        // Proves the documented rule: 5 s at 16 fps is Wan's 81 frames, 4 s is 65,
        // a quarter second the least video past one frame, and the answer's seconds
        // say what was made.
        let limits = Limits::default();
        let frames = |json| frames_of(&body(json), DEFAULT_FPS, &limits).expect("frames");
        let prompt = |extra: serde_json::Value| {
            let mut json = serde_json::json!({"model": "wan", "prompt": "x"});
            if let (Some(object), Some(extra)) = (json.as_object_mut(), extra.as_object()) {
                object.extend(extra.clone());
            }
            json
        };
        assert_eq!(frames(prompt(serde_json::json!({}))), 81);
        assert_eq!(frames(prompt(serde_json::json!({"seconds": "4"}))), 65);
        assert_eq!(frames(prompt(serde_json::json!({"seconds": 0.25}))), 5);
        assert_eq!(frames(prompt(serde_json::json!({"seconds": "0.01"}))), 5);
        assert_eq!(frames(prompt(serde_json::json!({"num_frames": 1}))), 1);
        assert_eq!(seconds_of(81, 16), "5");
        assert_eq!(seconds_of(5, 16), "0.25");
        assert_eq!(seconds_of(1, 16), "0");
    }

    #[test]
    fn a_limit_or_a_bad_field_is_a_400_naming_it() {
        // Proves each refusal names the field and the limit the operator set.
        let limits = Limits::default();
        let refused = |json: serde_json::Value| {
            let error = asked_video(&body(json), &limits).expect_err("refused");
            (error.param.unwrap_or_default(), error.message)
        };
        let base = |key: &str, value: serde_json::Value| {
            let mut json = serde_json::json!({"model": "wan", "prompt": "x"});
            json[key] = value;
            json
        };
        let (param, message) = refused(base("seconds", "60".into()));
        assert_eq!(param, "seconds");
        assert!(message.contains("limits.max_video_frames"), "{message}");
        let (param, message) = refused(base("num_frames", 4.into()));
        assert_eq!(param, "num_frames");
        assert!(message.contains("give 1 or 5"), "{message}");
        let (param, message) = refused(base("size", "4096x4096".into()));
        assert_eq!(param, "size");
        assert!(message.contains("limits.max_video_pixels"), "{message}");
        let (param, _) = refused(base("num_inference_steps", 1000.into()));
        assert_eq!(param, "num_inference_steps");
        let json = serde_json::to_vec(&base("input_reference", "first.png".into()));
        let error =
            parse_body(None, &Bytes::from(json.expect("JSON")), &limits).expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("input_reference"));
        let unknown = serde_json::json!({"model": "wan", "prompt": "x", "quality": "hd"});
        assert!(serde_json::from_value::<VideosBody>(unknown)
            .expect_err("refused")
            .to_string()
            .contains("quality"));
    }

    #[test]
    fn a_size_or_frame_count_that_overflows_is_refused_not_wrapped() {
        // Proves the regressions found writing the fuzz target serve_video_body: 2^32
        // x 2^32 pixels overflowed usize (a panic with overflow checks, a product of 0
        // that passed the limit without them), now above any limit, a 400 naming size;
        // and num_frames near 2^64, whose suggested 4k + 1 overflowed, a 400 naming it.
        let body = br#"{"model":"wan","prompt":"x","size":"4294967296x4294967296"}"#;
        let parsed = parse_body(None, &Bytes::from_static(body), &Limits::default());
        let error = asked_video(&parsed.expect("a body"), &Limits::default());
        let error = error.expect_err("refused");
        assert_eq!(error.param.as_deref(), Some("size"));
        assert!(
            error.message.contains("18446744073709551616 pixels"),
            "{}",
            error.message
        );
        // And num_frames = 2^64 − 1, whose suggested 4k + 1 overflowed.
        let body = br#"{"model":"wan","prompt":"x","num_frames":18446744073709551615}"#;
        let parsed = parse_body(None, &Bytes::from_static(body), &Limits::default());
        let error = asked_video(&parsed.expect("a body"), &Limits::default());
        assert_eq!(
            error.expect_err("refused").param.as_deref(),
            Some("num_frames")
        );
    }
}
