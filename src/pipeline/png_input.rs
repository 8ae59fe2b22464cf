//! A picture given to a pipeline (`stagehand image --init-image`, `stagehand video
//! --image`, the server's `input_reference`): an 8-bit PNG of exactly the size asked,
//! as `[3, height, width]` in [−1, 1] with diffusers' own arithmetic (`2 · (v / 255) −
//! 1`, VaeImageProcessor's). One reader for every edge, so the CLI and the server turn
//! the same file into the same numbers; each edge words the error for its own input
//! (a flag, a field) from the kind.
//!
//! A picture of another size is refused, not resized: resizing (diffusers resizes with
//! PIL's Lanczos, and its examples first pick a size of the image's aspect) changes the
//! picture, and that choice is the user's, made before. The size is checked from the
//! header, before the pixels are allocated, so a small file declaring a huge picture
//! costs nothing.

use std::io::{BufRead, Seek};

/// Why a PNG could not be read as a picture of the size asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PngInputError {
    /// The bytes are not a PNG (no signature, a broken header).
    #[error("is not a PNG ({0})")]
    NotPng(#[source] png::DecodingError),
    /// A PNG whose pixels cannot be decoded.
    #[error("cannot be decoded ({0})")]
    Undecodable(#[source] png::DecodingError),
    /// A PNG of another size than the one asked; `[width, height]` each.
    #[error("is {}×{}, not the {}×{} asked", found[0], found[1], expected[0], expected[1])]
    WrongSize {
        found: [usize; 2],
        expected: [usize; 2],
    },
    /// A PNG too large for this platform's memory arithmetic.
    #[error("is too large")]
    TooLarge,
}

/// The 8 bytes every PNG starts with.
pub const PNG_SIGNATURE: [u8; 8] = *b"\x89PNG\r\n\x1a\n";

/// The PNG read from `source` (8-bit RGB, RGBA or grey, with or without alpha; 16-bit
/// stripped to 8, palettes expanded) of exactly `[width, height]`, as `[3, height,
/// width]` in [−1, 1].
pub fn png_rgb(
    source: impl BufRead + Seek,
    [width, height]: [usize; 2],
) -> Result<Vec<f32>, PngInputError> {
    let mut decoder = png::Decoder::new(source);
    decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
    let mut reader = decoder.read_info().map_err(PngInputError::NotPng)?;
    let expected = [width, height];
    let declared = [reader.info().width as usize, reader.info().height as usize];
    if declared != expected {
        return Err(PngInputError::WrongSize {
            found: declared,
            expected,
        });
    }
    let size = reader.output_buffer_size().ok_or(PngInputError::TooLarge)?;
    let mut bytes = vec![0; size];
    let frame = reader
        .next_frame(&mut bytes)
        .map_err(PngInputError::Undecodable)?;
    // An animated PNG's first frame may be smaller than its canvas.
    let found = [frame.width as usize, frame.height as usize];
    if found != expected {
        return Err(PngInputError::WrongSize { found, expected });
    }
    let channels = frame.color_type.samples();
    let pixels = width * height;
    let mut planar = vec![0.0f32; 3 * pixels];
    for (pixel, sample) in bytes[..pixels * channels]
        .chunks_exact(channels)
        .enumerate()
    {
        for channel in 0..3 {
            // Grey (and grey with alpha) is the same value in every channel.
            let value = sample[if channels < 3 { 0 } else { channel }];
            planar[channel * pixels + pixel] = 2.0 * (f32::from(value) / 255.0) - 1.0;
        }
    }
    Ok(planar)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn png(width: u32, height: u32, color: png::ColorType, data: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, width, height);
        encoder.set_color(color);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().expect("a header");
        writer.write_image_data(data).expect("the pixels");
        writer.finish().expect("written");
        bytes
    }

    #[test]
    fn rgb_and_grey_pngs_become_planar_values_in_minus_one_to_one() {
        // Proves the layout ([3, H, W], channel planes) and diffusers' arithmetic,
        // grey spread to the three channels, alpha dropped.
        let rgb = png(2, 1, png::ColorType::Rgb, &[0, 255, 51, 102, 153, 204]);
        let planar = png_rgb(Cursor::new(rgb), [2, 1]).expect("read");
        let expected = [0.0, 102.0, 255.0, 153.0, 51.0, 204.0].map(|v| 2.0 * (v / 255.0) - 1.0);
        assert_eq!(planar, expected);
        let grey = png(1, 1, png::ColorType::GrayscaleAlpha, &[255, 0]);
        assert_eq!(png_rgb(Cursor::new(grey), [1, 1]).expect("read"), [1.0; 3]);
    }

    #[test]
    fn another_size_or_bytes_that_are_no_png_are_refused_by_kind() {
        // Proves the refusals an edge words for its user: the sizes found and asked,
        // and a file that is not a PNG.
        let rgb = png(2, 1, png::ColorType::Rgb, &[0; 6]);
        match png_rgb(Cursor::new(rgb), [1, 2]) {
            Err(PngInputError::WrongSize { found, expected }) => {
                assert_eq!((found, expected), ([2, 1], [1, 2]));
            }
            other => panic!("not refused by size: {other:?}"),
        }
        let jpeg = b"\xff\xd8\xff\xe0 a JPEG".to_vec();
        assert!(matches!(
            png_rgb(Cursor::new(jpeg), [1, 1]),
            Err(PngInputError::NotPng(_))
        ));
        assert_eq!(PNG_SIGNATURE, png(1, 1, png::ColorType::Rgb, &[0; 3])[..8]);
    }
}
