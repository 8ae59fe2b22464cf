//! Decoding in tiles, as diffusers' `AutoencoderKL.tiled_decode` does when a latent is
//! larger than its tile (and as ComfyUI's tiled decode does when VRAM is short): the
//! latent is cut into squares of `tile` positions that overlap by a quarter, each
//! square is decoded alone, and each decoded tile is blended linearly into the one
//! above and the one to its left over a quarter of a tile's pixels, then cropped to
//! the stride. A tile's activations are those of a `tile`² decode, whatever the
//! image's size.
//!
//! And what a decode holds live: the working set of its largest stage, computed from
//! the shapes each stage allocates (see [`super::VaeDecoder`]'s stages), reserved
//! through the activation path before the first block.

use super::VaeConfig;
pub use crate::families::tiling::Tile;
use crate::families::tiling::{blend_and_crop, Grid, Seams};

/// diffusers' `tile_overlap_factor`.
const OVERLAP: f64 = 0.25;

/// How a latent of `height × width` positions is cut.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiling {
    /// The tile's side in latent positions; `None`: one tile, the whole latent.
    pub tile: Option<usize>,
    pub tiles: Vec<Tile>,
    /// Tiles per row of tiles.
    pub columns: usize,
    pub height: usize,
    pub width: usize,
    /// Pixels per latent position.
    pub scale: usize,
}

impl Tiling {
    /// The tiles of a `height × width` latent in squares of `tile` (`None`, or a tile
    /// at least the latent's size: one tile).
    pub fn new(height: usize, width: usize, tile: Option<usize>, scale: usize) -> Self {
        let tile = tile.filter(|&tile| tile > 0 && (height > tile || width > tile));
        let grid = match tile {
            Some(side) => {
                let stride = ((side as f64 * (1.0 - OVERLAP)) as usize).max(1);
                Grid::new(height, width, (side, side), (stride, stride))
            }
            None => Grid::whole(height, width),
        };
        Self {
            tile,
            tiles: grid.tiles,
            columns: grid.columns,
            height,
            width,
            scale,
        }
    }

    /// The largest tile's latent positions.
    pub fn largest(&self) -> (usize, usize) {
        let rows = self.tiles.iter().map(|tile| tile.rows).max().unwrap_or(0);
        let cols = self.tiles.iter().map(|tile| tile.cols).max().unwrap_or(0);
        (rows, cols)
    }

    /// The image of decoded tiles (each `[channels, rows·scale, cols·scale]`, in tile
    /// order): blended and cropped as diffusers does, `[channels, height·scale,
    /// width·scale]`.
    pub fn assemble(&self, decoded: &[&[f32]], channels: usize) -> Vec<f32> {
        let scale = self.scale;
        let Some(side) = self.tile else {
            return decoded
                .first()
                .map(|image| image.to_vec())
                .unwrap_or_default();
        };
        // `AutoencoderKL`'s seams: a quarter of the tile's pixels blended, the rest
        // kept (which is the stride only when the side divides by 4).
        let sample = side * scale;
        let blend = (sample as f64 * OVERLAP) as usize;
        let seams = Seams {
            blend: (blend, blend),
            keep: (sample - blend, sample - blend),
        };
        let grid = Grid {
            tiles: self.tiles.clone(),
            columns: self.columns,
        };
        let tiles = decoded.iter().map(|tile| tile.to_vec()).collect();
        let size = (self.height * scale, self.width * scale);
        blend_and_crop(&grid, tiles, (scale, channels), seams, size)
    }
}

/// Bytes a decode of a `rows × cols` latent holds live at its largest stage: per
/// resolution, a ResNet block's input, two tensors of its width and the widened
/// residual (or the upsampling's input, its doubled copy and the convolution's
/// output), the mid-block attention's input and q, k, v, context. (A convolution's
/// im2col bands and widened weight are the adapter's scratch, as a product's cast
/// buffer is, not the family's tensors.)
pub fn working_set_bytes(config: &VaeConfig, rows: usize, cols: usize) -> u64 {
    let top = *config.channels.last().unwrap_or(&config.latent_channels) as u64;
    let mut pixels = (rows * cols) as u64;
    let mut peak = pixels * (config.latent_channels as u64 + top);
    if config.mid_attention {
        peak = peak.max(6 * pixels * top);
    }
    let mut previous = top;
    let levels = config.channels.len();
    for (number, &out) in config.channels.iter().rev().enumerate() {
        let out = out as u64;
        let widest = previous.max(out);
        peak = peak.max(pixels * (previous + 2 * widest + out));
        if number + 1 < levels {
            peak = peak.max(pixels * out + 2 * (4 * pixels) * out);
            pixels *= 4;
        }
        previous = out;
    }
    let bottom = config.channels[0] as u64;
    let image = config.image_channels as u64;
    peak = peak.max(pixels * (2 * bottom + image));
    4 * peak
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_start_every_three_quarters_of_a_tile_and_stop_at_the_edge() {
        // Proves the cut diffusers makes: a 12 × 10 latent in tiles of 4 starts a tile
        // every 3 positions (0, 3, 6, 9), the last ones cut by the edge.
        let tiling = Tiling::new(12, 10, Some(4), 8);
        assert_eq!(tiling.columns, 4);
        assert_eq!(tiling.tiles.len(), 16);
        assert_eq!(
            tiling.tiles[15],
            Tile {
                row: 9,
                col: 9,
                rows: 3,
                cols: 1
            }
        );
        // A tile as large as the latent is no tiling.
        assert_eq!(Tiling::new(8, 6, Some(8), 8).tiles.len(), 1);
    }
}
