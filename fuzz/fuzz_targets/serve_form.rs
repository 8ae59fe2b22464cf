//! `multipart/form-data` bodies as `POST /v1/videos` reads them (`serve::form`,
//! through the hook `serve::fuzzing::form`): any bytes give a form or a 400, never a
//! panic, and every file part is a slice of the body.
//!
//! Input: the `Content-Type` header up to the first newline, then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stagehand::serve::fuzzing;

fuzz_target!(|input: &[u8]| {
    let at = input
        .iter()
        .position(|&byte| byte == b'\n')
        .unwrap_or(input.len());
    let content_type = String::from_utf8_lossy(&input[..at]);
    let body = input.get(at + 1..).unwrap_or_default();
    if let Some(Ok(parts)) = fuzzing::form(&content_type, body) {
        for (offset, length) in parts.files {
            assert!(offset + length <= body.len());
        }
    }
});
