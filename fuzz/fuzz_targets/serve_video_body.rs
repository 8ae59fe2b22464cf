//! `POST /v1/videos` bodies (`serve::video_request::parse_body` and `asked_video`,
//! through the hook `serve::fuzzing::video_body`): JSON or a form, its
//! `input_reference` a file part or a base64 data URL, decoded as a PNG of the
//! request's size. Any bytes give a request within the default limits or a 4xx,
//! never a panic.
//!
//! Input: the `Content-Type` header up to the first newline (an empty line: none),
//! then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stagehand::serve::fuzzing;
use stagehand::serve::Limits;

fuzz_target!(|input: &[u8]| {
    let at = input
        .iter()
        .position(|&byte| byte == b'\n')
        .unwrap_or(input.len());
    let content_type = String::from_utf8_lossy(&input[..at]);
    let content_type = (!content_type.is_empty()).then_some(&*content_type);
    let body = input.get(at + 1..).unwrap_or_default();
    if let Ok(request) = fuzzing::video_body(content_type, body) {
        let limits = Limits::default();
        assert!(request.width * request.height <= limits.max_video_pixels);
        assert!(request.frames <= limits.max_video_frames);
        if let Some(image) = &request.image {
            assert_eq!(image.len(), 3 * request.width * request.height);
        }
    }
});
