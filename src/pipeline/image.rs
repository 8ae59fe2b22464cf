//! A decoded image: the VAE's output turned into pixels as diffusers' image processor
//! turns it (`x/2 + 0.5` clamped to [0, 1], then `round(255·v)`, ties to even as
//! NumPy rounds), and written as a PNG with its settings in text chunks, as ComfyUI
//! embeds its own.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use super::PipelineError;

/// An RGB image.
#[derive(Debug, Clone, PartialEq)]
pub struct Picture {
    pub width: usize,
    pub height: usize,
    /// `[height, width, 3]` in [0, 1]: diffusers' `output_type="np"`.
    pub values: Vec<f32>,
    /// The same as bytes: diffusers' `output_type="pil"`.
    pub pixels: Vec<u8>,
}

impl Picture {
    /// The picture of a decoder's `[3, height, width]` output.
    pub fn from_decoded(
        planar: &[f32],
        height: usize,
        width: usize,
    ) -> Result<Self, PipelineError> {
        let pixels_count = height * width;
        if planar.len() != 3 * pixels_count {
            return Err(PipelineError::StageOutput {
                stage: "vae",
                message: format!(
                    "the VAE gave {} values for a {width}×{height} RGB image",
                    planar.len()
                ),
            });
        }
        let mut values = vec![0.0f32; planar.len()];
        for (channel, plane) in planar.chunks_exact(pixels_count).enumerate() {
            for (pixel, &value) in plane.iter().enumerate() {
                values[pixel * 3 + channel] = (value / 2.0 + 0.5).clamp(0.0, 1.0);
            }
        }
        let pixels = values
            .iter()
            .map(|value| (value * 255.0).round_ties_even() as u8)
            .collect();
        Ok(Self {
            width,
            height,
            values,
            pixels,
        })
    }

    /// The picture as an 8-bit RGB PNG with `text` as `tEXt` chunks (keyword, value).
    pub fn png_bytes(&self, text: &[(String, String)]) -> Result<Vec<u8>, png::EncodingError> {
        let mut bytes = Vec::new();
        let mut encoder = png::Encoder::new(&mut bytes, self.width as u32, self.height as u32);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        for (keyword, value) in text {
            encoder.add_text_chunk(keyword.clone(), value.clone())?;
        }
        let mut writer = encoder.write_header()?;
        writer.write_image_data(&self.pixels)?;
        writer.finish()?;
        Ok(bytes)
    }

    /// Writes [`Picture::png_bytes`] at `path`, through a file renamed into place once
    /// complete.
    pub fn write_png(&self, path: &Path, text: &[(String, String)]) -> Result<(), PipelineError> {
        let failed = |error: &dyn std::fmt::Display| PipelineError::Output {
            path: path.to_path_buf(),
            reason: error.to_string(),
        };
        let bytes = self.png_bytes(text).map_err(|error| failed(&error))?;
        // A name of this write's own: two runs writing the same path at once (the CLI
        // tables' rows do) each rename a whole file of theirs, the last one stays.
        // With a shared name one's rename took the other's file and the other failed.
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let write = WRITES.fetch_add(1, Ordering::Relaxed);
        let partial = path.with_extension(format!("png.partial-{}-{write}", std::process::id()));
        if let Err(error) = std::fs::write(&partial, bytes) {
            let _ = std::fs::remove_file(&partial);
            return Err(failed(&error));
        }
        std::fs::rename(&partial, path).map_err(|error| failed(&error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_round_as_numpy_does_and_the_png_keeps_its_text() {
        // Proves the decoder's range maps to bytes as diffusers maps it (ties to even:
        // 0.5·255 = 127.5 → 128, clamped ends) and a written PNG decodes to the same
        // bytes with its text chunks.
        let planar = [-1.5, 0.0, 1.0, -1.0, 0.5, 2.0];
        let picture = Picture::from_decoded(&planar, 1, 2).expect("a 2×1 image");
        assert_eq!(picture.pixels, [0, 255, 191, 128, 0, 255]);
        let dir = std::env::temp_dir().join(format!("stagehand-png-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("out.png");
        let text = [("prompt".to_string(), "a fox".to_string())];
        picture.write_png(&path, &text).expect("writes");
        let decoder = png::Decoder::new(std::io::BufReader::new(
            std::fs::File::open(&path).expect("opens"),
        ));
        let mut reader = decoder.read_info().expect("a PNG");
        let chunks = &reader.info().uncompressed_latin1_text;
        assert_eq!(chunks[0].keyword, "prompt");
        assert_eq!(chunks[0].text, "a fox");
        let mut bytes = vec![0; reader.output_buffer_size().expect("a size")];
        reader.next_frame(&mut bytes).expect("decodes");
        assert_eq!(bytes, picture.pixels);
        std::fs::remove_dir_all(&dir).ok();
    }
}
