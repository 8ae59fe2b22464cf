//! `input_reference` of `POST /v1/videos`: the first frame an image-to-video model
//! starts from, as OpenAI's Videos API takes it. The official clients send it as a
//! file part of the multipart/form-data body (`input_reference=open("first.png",
//! "rb")`: httpx names the file and guesses `image/png` from it; bytes without a name
//! go as `upload`, `application/octet-stream`); a JSON body may carry it as OpenAI's
//! `{"image_url": "data:image/png;base64,…"}`. The server fetches no URL and has no
//! Files API, so an `http(s)` URL and a `file_id` are refused by name.
//!
//! Only PNG is taken (the CLI's reader, [`crate::pipeline::png_rgb`]), known by its
//! signature rather than by what the client declared; at most
//! `limits.max_input_reference_bytes` of it (413 above); of exactly the video's `size`
//! (400 naming both sizes otherwise: resizing changes the picture, and that choice is
//! the client's).

use axum::body::Bytes;
use base64::Engine as _;
use serde_json::Value;

use crate::pipeline::{png_rgb, PngInputError, PNG_SIGNATURE};

use super::config::Limits;
use super::errors::ApiError;
use super::form::FilePart;

const FIELD: &str = "input_reference";
/// What the refusals say is taken.
const TAKEN: &str = "send a PNG of the video's size as a file part of a multipart/form-data body (the openai client's input_reference=open(\"first.png\", \"rb\")), or in JSON as {\"image_url\": \"data:image/png;base64,…\"}";

/// The PNG an `input_reference` carried, not yet decoded (its size is checked against
/// the request's once that is known).
#[derive(Debug, Clone)]
pub struct Reference {
    png: Bytes,
}

impl Reference {
    /// The file part `part` of the form body `body` (a slice of it, not a copy).
    pub fn from_file(part: &FilePart<'_>, body: &Bytes, limits: &Limits) -> Result<Self, ApiError> {
        if part.name != FIELD {
            return Err(ApiError::bad_request(
                &part.name,
                format!(
                    "{}: a file is taken only as input_reference (the first frame of an image-to-video model)",
                    part.name
                ),
            ));
        }
        let declared = match &part.content_type {
            Some(content_type) => format!("{}, {content_type}", part.filename),
            None => part.filename.clone(),
        };
        Self::checked(body.slice_ref(part.bytes), &declared, limits)
    }

    /// `input_reference` of a JSON body (or a form's text field).
    pub fn from_json(value: &Value, limits: &Limits) -> Result<Self, ApiError> {
        let refuse = |problem: &str| {
            Err(ApiError::bad_request(
                FIELD,
                format!("input_reference {problem}; {TAKEN}"),
            ))
        };
        let Some(object) = value.as_object() else {
            return refuse("is not a file: the image itself is needed");
        };
        if object.contains_key("file_id") {
            return refuse("names a file_id, but this server has no Files API");
        }
        let Some(url) = object.get("image_url").and_then(Value::as_str) else {
            return refuse("is an object without image_url");
        };
        if let Some(unknown) = object.keys().find(|key| *key != "image_url") {
            return refuse(&format!("has the unknown key `{unknown}`"));
        }
        let Some((media, data)) = url
            .strip_prefix("data:")
            .and_then(|rest| rest.split_once(','))
        else {
            return refuse("is a URL, and this server fetches none");
        };
        let Some(media) = media.strip_suffix(";base64") else {
            return refuse("is a data URL that is not base64");
        };
        // Base64 is 4 characters for 3 bytes: refuse before decoding anything larger.
        let most = limits.max_input_reference_bytes;
        if data.len() / 4 * 3 > most.saturating_add(3) {
            return Err(too_large(data.len() / 4 * 3, most));
        }
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|error| {
                ApiError::bad_request(
                    FIELD,
                    format!("input_reference's data URL is not base64 ({error}); {TAKEN}"),
                )
            })?;
        let declared = if media.is_empty() { "data" } else { media };
        Self::checked(Bytes::from(png), declared, limits)
    }

    /// `png` within the limit and a PNG by its signature (whatever `declared` says).
    fn checked(png: Bytes, declared: &str, limits: &Limits) -> Result<Self, ApiError> {
        let most = limits.max_input_reference_bytes;
        if png.len() > most {
            return Err(too_large(png.len(), most));
        }
        if !png.starts_with(&PNG_SIGNATURE) {
            return Err(ApiError::bad_request(
                FIELD,
                format!("input_reference ({declared}) is not a PNG: this server takes PNG images (image/png; 8-bit RGB, RGBA or grey); convert it, then {TAKEN}"),
            ));
        }
        Ok(Self { png })
    }

    /// The picture as `[3, height, width]` in [−1, 1]; a picture of another size than
    /// the video's is a 400 naming both.
    pub fn pixels(&self, [width, height]: [usize; 2]) -> Result<Vec<f32>, ApiError> {
        let reader = std::io::Cursor::new(&self.png[..]);
        png_rgb(reader, [width, height]).map_err(|error| match error {
            PngInputError::WrongSize { found: [w, h], .. } => ApiError::bad_request(
                FIELD,
                format!("input_reference is {w}x{h}, the video's size is {width}x{height}: give an image of the video's size (resize it first) or ask size=\"{w}x{h}\""),
            ),
            other => ApiError::bad_request(FIELD, format!("input_reference {other}; {TAKEN}")),
        })
    }
}

/// 413: an image above `limits.max_input_reference_bytes`.
fn too_large(bytes: usize, most: usize) -> ApiError {
    ApiError::field_too_large(
        FIELD,
        format!("input_reference is {bytes} bytes, above limits.max_input_reference_bytes = {most}; send a smaller PNG"),
    )
}

/// The body limit of `POST /v1/videos`: the other fields' `limits.max_body_bytes`
/// and room for the largest image, as base64 (a third more than the file part).
pub fn body_limit(limits: &Limits) -> usize {
    let image = limits
        .max_input_reference_bytes
        .div_ceil(3)
        .saturating_mul(4);
    limits.max_body_bytes.saturating_add(image)
}

/// The 413 of a body above [`body_limit`].
pub fn body_too_large(limits: &Limits) -> ApiError {
    let whole = ApiError::field_too_large(
        FIELD,
        format!(
            "the request body is larger than the server's limit for a video request, {} bytes (limits.max_body_bytes = {} for the fields and room for an input_reference of limits.max_input_reference_bytes = {}, as base64)",
            body_limit(limits),
            limits.max_body_bytes,
            limits.max_input_reference_bytes
        ),
    );
    // The whole body is past its limit, not one field.
    ApiError {
        param: None,
        ..whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png() -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, 2, 1);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("a header");
        writer.write_image_data(&[0; 6]).expect("pixels");
        writer.finish().expect("written");
        bytes
    }

    #[test]
    fn a_data_url_png_is_taken_and_every_other_reference_refused_by_name() {
        // Proves JSON's input_reference: a base64 PNG data URL decodes to the picture;
        // a URL, a file_id, a string, another format, a wrong size and an image past
        // the limit are refused naming input_reference and what to send.
        let limits = Limits::default();
        let encoded = base64::engine::general_purpose::STANDARD.encode(png());
        let url = serde_json::json!({"image_url": format!("data:image/png;base64,{encoded}")});
        let reference = Reference::from_json(&url, &limits).expect("taken");
        assert_eq!(reference.pixels([2, 1]).expect("2x1"), vec![-1.0; 6]);
        let wrong = reference.pixels([16, 16]).expect_err("refused");
        assert!(
            wrong.message.contains("2x1, the video's size is 16x16"),
            "{}",
            wrong.message
        );
        let jpeg = base64::engine::general_purpose::STANDARD.encode(b"\xff\xd8\xff");
        let refusals = [
            (
                serde_json::json!({"image_url": "https://example.com/a.png"}),
                "fetches none",
            ),
            (serde_json::json!({"file_id": "file_1"}), "no Files API"),
            (serde_json::json!("first.png"), "is not a file"),
            (
                serde_json::json!({"image_url": format!("data:image/jpeg;base64,{jpeg}")}),
                "(image/jpeg) is not a PNG",
            ),
        ];
        for (value, needle) in refusals {
            let error = Reference::from_json(&value, &limits).expect_err("refused");
            assert_eq!(error.param.as_deref(), Some(FIELD));
            assert!(
                error.message.contains(needle),
                "{needle}: {}",
                error.message
            );
        }
        let small = Limits {
            max_input_reference_bytes: 10,
            ..Limits::default()
        };
        let error = Reference::from_json(&url, &small).expect_err("refused");
        assert_eq!(error.status, axum::http::StatusCode::PAYLOAD_TOO_LARGE);
        assert!(error
            .message
            .contains("limits.max_input_reference_bytes = 10"));
        assert_eq!(body_limit(&small), small.max_body_bytes + 16);
    }
}
