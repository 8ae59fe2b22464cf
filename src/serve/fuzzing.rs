//! The request parsers of the routes, without a server, for the fuzz targets in
//! `fuzz/` (RELIABILITY.md, "Fuzzing"): each function runs what a route runs on a
//! body before it queues a job, with the default limits. Not an API: hidden from the
//! docs, and free to change with the routes.

use axum::body::Bytes;

use crate::pipeline::{ImageRequest, VideoRequest};

use super::config::Limits;
use super::errors::ApiError;
use super::openai::{ChatRequest, CompletionRequest, EmbeddingsRequest};

/// What a form body held: its text fields, and each file as the `(offset, length)`
/// of its bytes within the body (a file is a slice of the body, never a copy).
#[derive(Debug)]
pub struct FormParts {
    pub fields: usize,
    pub files: Vec<(usize, usize)>,
}

/// `multipart/form-data` as `POST /v1/videos` reads it: `None` when `content_type`
/// is not a form with a boundary (the route then reads JSON).
pub fn form(content_type: &str, body: &[u8]) -> Option<Result<FormParts, ApiError>> {
    let boundary = super::form::boundary(content_type)?;
    let parsed = super::form::parse(body, &boundary).map(|form| FormParts {
        fields: form.fields.len(),
        files: (form.files.iter())
            .map(|file| {
                let offset = file.bytes.as_ptr() as usize - body.as_ptr() as usize;
                (offset, file.bytes.len())
            })
            .collect(),
    });
    Some(parsed)
}

/// A `POST /v1/videos` body (JSON or a form, its `input_reference` decoded) as the
/// job the route would queue.
pub fn video_body(content_type: Option<&str>, body: &[u8]) -> Result<VideoRequest, ApiError> {
    let limits = Limits::default();
    let bytes = Bytes::copy_from_slice(body);
    let parsed = super::video_request::parse_body(content_type, &bytes, &limits)?;
    super::video_request::asked_video(&parsed, &limits).map(|asked| asked.request)
}

/// A `POST /v1/images/generations` body as the job the route would queue.
pub fn images_body(body: &[u8]) -> Result<ImageRequest, ApiError> {
    let request: super::images::ImagesRequest = serde_json::from_slice(body)
        .map_err(|error| ApiError::invalid_body(format!("not a request: {error}")))?;
    super::images::image_request(&request, &Limits::default())
}

/// The text routes whose bodies [`text_body`] reads.
#[derive(Debug, Clone, Copy)]
pub enum TextRoute {
    Embeddings,
    Completions,
    Chat,
}

/// A body of a text route, read and its unsupported fields refused, as the route
/// does before it tokenizes (which needs a model); a chat's messages' text as the
/// template would get it.
pub fn text_body(route: TextRoute, body: &[u8]) -> Result<(), ApiError> {
    let invalid =
        |error: serde_json::Error| ApiError::invalid_body(format!("not a request: {error}"));
    match route {
        TextRoute::Embeddings => {
            serde_json::from_slice::<EmbeddingsRequest>(body).map_err(invalid)?;
        }
        TextRoute::Completions => {
            let request: CompletionRequest = serde_json::from_slice(body).map_err(invalid)?;
            request.sampling.refuse_unsupported()?;
        }
        TextRoute::Chat => {
            let request: ChatRequest = serde_json::from_slice(body).map_err(invalid)?;
            request.sampling.refuse_unsupported()?;
            for message in &request.messages {
                super::generation::content_text(message.content.as_ref());
            }
        }
    }
    Ok(())
}
