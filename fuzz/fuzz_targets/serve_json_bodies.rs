//! The JSON bodies of `POST /v1/images/generations`, `/v1/embeddings`,
//! `/v1/completions` and `/v1/chat/completions`, as far as a route reads them before
//! it needs a model (`serve::fuzzing::images_body`, `text_body`): any bytes give a
//! request or a 4xx, never a panic.
//!
//! Input: one byte choosing the route (modulo 4), then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stagehand::serve::fuzzing::{self, TextRoute};
use stagehand::serve::Limits;

fuzz_target!(|input: &[u8]| {
    let Some((&route, body)) = input.split_first() else {
        return;
    };
    let route = match route % 4 {
        0 => {
            if let Ok(request) = fuzzing::images_body(body) {
                let limits = Limits::default();
                assert!(request.width * request.height <= limits.max_image_pixels);
                assert!(request.count >= 1 && request.count <= limits.max_images);
            }
            return;
        }
        1 => TextRoute::Embeddings,
        2 => TextRoute::Completions,
        _ => TextRoute::Chat,
    };
    let _ = fuzzing::text_body(route, body);
});
