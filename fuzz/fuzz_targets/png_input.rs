//! A PNG given as `--image`, `--init-image` or serve's `input_reference`
//! (`pipeline::png_rgb`), asked at a fixed 48 × 64 (the fixtures' first frame): any
//! bytes give the picture or an error, never a panic, and a picture has 3 planes of
//! values in [−1, 1].
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use stagehand::pipeline::png_rgb;

const SIZE: [usize; 2] = [48, 64];

fuzz_target!(|input: &[u8]| {
    if let Ok(planar) = png_rgb(Cursor::new(input), SIZE) {
        assert_eq!(planar.len(), 3 * SIZE[0] * SIZE[1]);
        assert!(planar.iter().all(|value| (-1.0..=1.0).contains(value)));
    }
});
